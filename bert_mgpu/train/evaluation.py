"""Watching the dev set while fine-tuning: evaluate on a schedule, keep the best model, stop early.

What Hugging Face's Trainer (`eval_strategy`, `metric_for_best_model`, `load_best_model_at_end`,
`EarlyStoppingCallback`) and Keras (`ModelCheckpoint(save_best_only=True)`, `EarlyStopping`) give, as one
hook of the one training loop. Each evaluation adds a row to `eval_history.tsv`, goes to TensorBoard
under `eval/` (beside `train/`, the same tags), and may replace `best/`, a directory `--init_checkpoint`
loads.

A kill at any moment leaves what a rerun continues exactly. An evaluation's row and its new best model
(in `best.pending/`) are written first, then the step's training checkpoint, then the pending best
becomes `best/`. A rerun keeps the rows up to the step it resumes from, promotes a pending best of
that step or drops a later one, and recomputes the best value and the patience count from the rows.

Example:
    watch = DevEvaluation(lambda: clf.evaluate(dev), every=100, output_dir="out",
                          choice=BestModel("eval_accuracy", patience=3), save_best=clf.save_model)
    Loop(trainer, 32, hooks=[watch]).run(train_dataset, until_step=1000)
"""

import dataclasses
import logging
import math
import os

import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.io import run_dir
from bert_mgpu.train.loop import Evaluation

log = logging.getLogger("bert_mgpu")

HISTORY_FILE = "eval_history.tsv"
BEST_DIR = "best"
PENDING_DIR = "best.pending"
SKIP = ("eval_examples", "global_step", "loss")  # in evaluate()'s results, but not metrics of the model


def evaluation_every(strategy="no", every_steps=None, steps_per_epoch=None):
    """Steps between evaluations (None: none), from Hugging Face's `eval_strategy` and `eval_steps`."""
    if strategy not in ("no", "steps", "epoch"):
        raise UserError(f"--evaluation_strategy={strategy!r}: expected no, steps or epoch")
    if every_steps is not None and every_steps < 1:
        raise UserError(f"--eval_every_steps={every_steps}: expected 1 or more")
    if strategy == "epoch":
        return max(1, int(steps_per_epoch))
    if strategy == "steps" and not every_steps:
        raise UserError("--evaluation_strategy=steps needs --eval_every_steps")
    return every_steps or None


def metric_key(name):
    """A metric as evaluate() names it: "accuracy" and "eval_accuracy" are both "eval_accuracy"."""
    return name if name.startswith("eval_") else f"eval_{name}"


@dataclasses.dataclass
class BestModel:
    """Which evaluation is the best, and when to stop for want of a better one.

    Args:
        metric: evaluate()'s key ("eval_accuracy", "eval_f1", "eval_loss"; "accuracy" is taken too).
        greater_is_better: None: True unless the metric is a loss.
        patience: stop after this many evaluations without improvement (None: never).
        threshold: an improvement smaller than this does not count (Keras' `min_delta`).
    """

    metric: str = "eval_accuracy"
    greater_is_better: bool | None = None
    patience: int | None = None
    threshold: float = 0.0

    def __post_init__(self):
        self.metric = metric_key(self.metric)
        if self.greater_is_better is None:
            self.greater_is_better = not self.metric.endswith("loss")
        if self.patience is not None and self.patience < 1:
            raise UserError(f"--early_stopping_patience={self.patience}: expected 1 or more evaluations")
        if not math.isfinite(self.threshold) or self.threshold < 0:
            raise UserError(f"--early_stopping_threshold={self.threshold}: expected a number >= 0")

    def better(self, value, best):
        if best is None:
            return math.isfinite(value)
        gain = value - best if self.greater_is_better else best - value
        return gain > self.threshold

    def replay(self, rows):
        """(best row, evaluations since it) after these history rows."""
        best, since = None, 0
        for row in rows:
            if self.better(row[self.metric], None if best is None else best[self.metric]):
                best, since = row, 0
            else:
                since += 1
        return best, since


def read_history(output_dir):
    """eval_history.tsv's rows as dicts of floats ({"step": 100, "eval_loss": ..., ...}), or []."""
    path = os.path.join(output_dir, HISTORY_FILE)
    if not storage.exists(path):
        return []
    lines = storage.read_text(path).splitlines()
    header = lines[0].split("\t") if lines else []
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        try:
            values = [float(c) for c in cells]
        except ValueError:
            raise UserError(f"{path}:{number}: not a row of numbers") from None
        if len(cells) != len(header):
            raise UserError(f"{path}:{number}: {len(cells)} cells under a header of {len(header)}")
        rows.append({"step": int(values[0]), **{metric_key(k): v for k, v in zip(header[1:], values[1:])}})
    return rows


def write_history(output_dir, rows):
    """All rows, step first, then loss and every metric, without the `eval_` prefix."""
    names = sorted({k for row in rows for k in row if k != "step"}, key=lambda k: (k != "eval_loss", k))
    lines = ["\t".join(["step"] + [n[len("eval_"):] for n in names])]
    lines += ["\t".join([str(row["step"])] + [f"{row.get(n, float('nan')):.6g}" for n in names]) for row in rows]
    storage.write_atomic(os.path.join(output_dir, HISTORY_FILE), "\n".join(lines) + "\n")


class DevEvaluation(Evaluation):
    """Evaluate every `every` steps; keep the best model in `output_dir/best`; stop when patience runs out.

    Args:
        evaluate: `() -> dict` of evaluate()'s results ("eval_loss", "eval_accuracy", ...), on every tower.
        every: steps between evaluations.
        output_dir: the run's directory (eval_history.tsv, best/).
        choice: a `BestModel`.
        save_best: `save_best(directory, step)` writes a loadable model directory (every worker calls it).
        writer: TensorBoard writer for `output_dir/eval`, or None.
        chief: whether this process writes files (the history; every worker saves the model).
    """

    def __init__(self, evaluate, every, output_dir, choice, save_best, writer=None, chief=True):
        super().__init__(evaluate, every, writer=writer)
        self.output_dir, self.choice, self.save_best, self.chief = output_dir, choice, save_best, chief
        self.rows, self.best, self.since = [], None, 0

    def resume(self, step):
        """Continue the watch of a run resumed from `step` (0: a new run)."""
        rows = [r for r in read_history(self.output_dir) if r["step"] <= step] if step else []
        pending, best = (os.path.join(self.output_dir, d) for d in (PENDING_DIR, BEST_DIR))
        if self.chief:
            if run_dir.is_whole_model_dir(pending) and _step_of(pending) <= step and step:
                storage.replace_dir(pending, best)  # its evaluation was checkpointed: it is the best
            storage.remove(pending)
            if not step:
                storage.remove(best)  # a new run (or one started over): no best yet
        self.rows = rows
        self.best, self.since = self.choice.replay(rows)
        if self.best is not None:
            log.info("best so far: %s %.4g at step %d; %d evaluation(s) since", self.choice.metric,
                     self.best[self.choice.metric], self.best["step"], self.since)

    def evaluated(self, loop, results):
        metric = self.choice.metric
        if metric not in results:
            names = ", ".join(k[len("eval_"):] for k in sorted(results) if k.startswith("eval_") and k not in SKIP)
            raise UserError(f"--metric_for_best_model={metric[len('eval_'):]}: the evaluation gives {names}")
        row = {"step": loop.step, **{k: float(v) for k, v in results.items()
                                     if k.startswith("eval_") and k not in SKIP}}
        improved = self.choice.better(row[metric], None if self.best is None else self.best[metric])
        if improved:
            self.save_best(os.path.join(self.output_dir, PENDING_DIR), loop.step)
        self.rows.append(row)
        if self.chief:
            write_history(self.output_dir, self.rows)
        loop.save()  # the training checkpoint of this step: now the evaluation is kept by a rerun
        if improved:
            if self.chief:
                storage.replace_dir(os.path.join(self.output_dir, PENDING_DIR),
                                    os.path.join(self.output_dir, BEST_DIR))
            self.best, self.since = row, 0
            log.info("new best %s %.4g at step %d -> %s", metric, row[metric], loop.step,
                     os.path.join(self.output_dir, BEST_DIR))
            return
        self.since += 1
        patience = self.choice.patience
        if patience is not None and self.since >= patience:
            loop.stop = (f"early stopping: {metric[len('eval_'):]} has not improved by more than "
                         f"{self.choice.threshold:g} in {self.since} evaluation(s); best "
                         f"{self.best[metric]:.4g} at step {self.best['step']}")


def _step_of(directory):
    latest = tf.train.latest_checkpoint(directory)
    return int(latest.rsplit("-", 1)[1]) if latest else math.inf
