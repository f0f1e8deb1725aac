"""The training loop: one for fine-tuning and pretraining; what differs between them is hooks.

A step: every hook may stop the run (`should_stop`), hooks prepare (`before_step`, e.g. the time-based
schedule's progress), and `Trainer.run_step` queues the step without waiting for it. Only every
`log_every` steps does the host wait for the device (`Trainer.read`), so a GPU always has the next step
queued: then the skip guard looks at the runs of non-finite steps the device counted, a record (the mean
loss and statistics of the steps since the last record, learning rate, loss scale, examples/s over the
steps' own time (evaluations and saves left out), skipped steps) goes to the writer,
`history` and the console, and Keras callbacks hear of the batch. Hooks act after every step
(`after_step`: validation, fine-tune markers, early stop), and a checkpoint is saved every `save_every`
steps and when the loop ends. SIGTERM or Ctrl-C end the loop after the step under way, with a checkpoint.
Steps run after the last logging step get a record of their own when the loop stops.
"""

import logging
import numbers
import sys
import time
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from bert_mgpu.parallel import agree, guards

log = logging.getLogger("bert_mgpu")


def _power_of_two(n):
    return n > 0 and n & (n - 1) == 0


class Hook:
    """Something the loop does at a point of every step; override what you need.

    Example:
        class StopAtLoss(Hook):
            def after_step(self, loop, record):
                if record and record["loss"] < 0.1:
                    loop.stop = "loss below 0.1"
    """

    def should_stop(self, loop):
        """Why the run should stop before the next step (a string), or None."""
        return None

    def before_step(self, loop):
        """Called before each step."""

    def on_log(self, loop, record):
        """Add to a training record before it is written (the loop's step is the record's)."""

    def after_step(self, loop, record):
        """Called after each step; `record` is the step's training record on a logging step, else None.
        May set `loop.stop` to end the run."""

    def end(self, loop):
        """Called once the loop has stopped and saved."""


class Evaluation(Hook):
    """Evaluate every `every` steps (an int: at its multiples of the global step, or `every(loop)` for a
    varying interval, counted from the last evaluation); the results are
    logged with an `eval_` prefix, and Keras callbacks see them as `val_...` at an epoch's end.

    Args:
        evaluate: `evaluate() -> dict` of statistics, e.g. `lambda: trainer.evaluate(dev_dataset)`.
        every: steps between evaluations.
        writer: a TensorBoard writer of their own (e.g. for `output_dir/eval`), where they go under the
            training records' tags (`loss`, not `eval_loss`), so TensorBoard draws both in one chart;
            None: the loop's writer, with the prefix.
    """

    def __init__(self, evaluate, every, writer=None):
        self.evaluate, self.every, self.writer, self.last = evaluate, every, writer, None
        self.results = None  # the last evaluation's record

    def after_step(self, loop, record):
        if self.last is None:
            self.last = loop.first_step
        every = self.every(loop) if callable(self.every) else self.every
        if not every:
            return
        # A fixed interval evaluates at its multiples of the global step, so a resumed run evaluates (and picks
        # its best model) at the steps the uninterrupted run does; a varying one counts from the last.
        if (loop.step % every if not callable(self.every) else loop.step - self.last < every):
            return
        self.last = loop.step
        results = self.evaluate()
        self.results = {"step": loop.step, **{k if k.startswith("eval_") else f"eval_{k}": v
                                              for k, v in results.items()}}
        loop.log(self.results, writer=self.writer)
        self.evaluated(loop, self.results)
        loop.end_epoch({k.replace("eval_", "val_", 1): v for k, v in self.results.items() if k != "step"})

    def evaluated(self, loop, results):
        """Called with each evaluation's record, after it is logged (a subclass acts on it)."""


class Loop:
    """Runs `trainer.run_step` on a dataset until a hook, a callback, a signal or `until_step` stops it.

    Args:
        trainer: a `training.Trainer` with an optimizer.
        global_batch: examples per step, for the examples/s it logs.
        hooks: `Hook`s, run in order.
        callbacks: Keras callbacks (`EarlyStopping`, `CSVLogger`, your own). They see one "epoch" per
            evaluation (per logging step when no hook evaluates), with `val_` statistics, and a batch end
            on each logging step; one that sets `model.stop_training` stops the run.
        writer: a `tf.summary` writer for TensorBoard, or None.
        reporters: `reporting.Reporters` every record also goes to (W&B, MLflow), or None.
        save: `save()` writes a checkpoint; called every `save_every` steps and when the loop ends.
        last_checkpoint: `() -> path` named when non-finite steps stop the run.
        max_consecutive_skips: non-finite steps in a row that stop the run (0: never), at the logging step
            that sees them.
        clock: seconds (default time.monotonic), read twice a step (before and after it); `elapsed()`
            adds what it counted to `elapsed_before` (a resumed run's time). With several workers, every
            worker uses the chief's time (`agree.ChiefDecides`), and so everything decided from it
            (the time-based learning rate, validation, stops) is decided alike: the workers agree on it
            at the start and on logging steps, where the host waits anyway; in between each counts on from
            the last agreed time at the agreed pace, so no step waits for a collective between hosts. A
            signal on any worker stops them all after the same step (guards.Preemption).

    Example:
        loop = Loop(trainer, global_batch=32, hooks=[Evaluation(lambda: trainer.evaluate(dev), every=100)],
                    callbacks=[keras.callbacks.EarlyStopping(patience=3)])
        loop.run(train_dataset, until_step=1000)
    """

    def __init__(self, trainer, global_batch: int, hooks: Sequence[Hook] = (), callbacks: Sequence | None = None,
                 writer=None, log_every: int = 50, save: Callable[[], object] | None = None, save_every: int = 1000,
                 last_checkpoint: Callable[[], str | None] = lambda: None, max_consecutive_skips: int = 0,
                 clock: Callable[[], float] | None = None, elapsed_before: float = 0.0, verbose: bool = True,
                 reporters=None):
        self.trainer, self.global_batch, self.hooks = trainer, global_batch, list(hooks)
        self.writer, self.log_every, self.verbose = writer, max(1, int(log_every)), verbose
        self.reporters = reporters
        self._save, self.save_every, self.last_checkpoint = save, save_every, last_checkpoint
        self.max_consecutive_skips, self.elapsed_before = max_consecutive_skips, elapsed_before
        self.clock = clock or (lambda: time.monotonic())  # looked up when read: a test may stand in for it
        self.callbacks = keras.callbacks.CallbackList(list(callbacks or []), model=trainer.model)
        self.epochs_at_evaluation = any(isinstance(h, Evaluation) for h in self.hooks)
        self.history = []  # every record written: training ones and evaluation ones
        self.stop = None  # why the loop stopped
        self.interrupted = None  # the signal's name when one stopped it
        self.step = self.first_step = int(trainer.step.numpy())
        self._epoch, self._train_record, self._start, self._seconds = 0, {}, None, elapsed_before
        self._decide = agree.ChiefDecides(trainer.strategy)
        self._agreed = None  # (step, clock readings, chief's seconds, seconds a reading) at the last agreement
        self._readings = 0

    def elapsed(self) -> float:
        """Seconds trained, this run's and those before a resume, as of the last clock reading."""
        return self._seconds

    def _read_clock(self, agree=False):
        """Read the clock -> this worker's reading; `elapsed()` is then the chief's time, agreed with the
        other workers when `agree` (and on steps 1, 2, 4, ... to learn the pace), else counted on from the
        last agreement at the agreed seconds per reading (every worker reads the clock at the same points)."""
        now = self.clock()
        mine = self.elapsed_before + now - self._start
        self._readings += 1
        if self._decide.workers == 1:
            self._seconds = mine
            return now
        last = self._agreed
        if last is None or last[0] != self.step and (agree or _power_of_two(self.step - self.first_step)):
            self._seconds, = self._decide([mine])
            pace = (self._seconds - last[2]) / (self._readings - last[1]) if last else 0.0
            self._agreed = (self.step, self._readings, self._seconds, pace)
        else:
            _, readings, seconds, pace = last
            self._seconds = seconds + (self._readings - readings) * pace
        return now

    def log(self, record: dict, writer=None) -> None:
        """Write a record ({"step": ..., name: number}) to TensorBoard, `history` and the console (there
        without the `system/` metrics);
        `writer`: another TensorBoard writer, which gets the names without their `eval_` prefix."""
        self.history.append(record)
        if self.reporters is not None:
            self.reporters.log(record)
        target = writer if writer is not None else self.writer
        if target is not None:
            with target.as_default(step=record["step"]):
                for key, value in record.items():
                    if key != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool):
                        tf.summary.scalar(key.removeprefix("eval_") if writer is not None else key, value)
        if self.verbose:
            log.info("step %d: %s", record["step"], ", ".join(f"{k} {v:.4g}" for k, v in record.items()
                                                              if k != "step" and not k.startswith("system/")))

    def end_epoch(self, logs):
        """Close a callbacks' "epoch" with these logs (plus the last training record's)."""
        train = {k: v for k, v in self._train_record.items() if k != "step"}
        self.callbacks.on_epoch_end(self._epoch, {**train, **logs})
        self._epoch += 1
        self.callbacks.on_epoch_begin(self._epoch)
        if getattr(self.trainer.model, "stop_training", False) and not self.stop:
            self.stop = f"stopped by a Keras callback at step {self.step}"

    def save(self):
        if self._save is not None and self._saved != self.step:
            self._save()
            self._saved = self.step

    def _record(self, loss, steps, seconds):
        trainer = self.trainer
        rate = steps * self.global_batch / max(1e-6, seconds)
        record = {"step": self.step, "loss": loss, **trainer.stats, "learning_rate": trainer.learning_rate,
                  "loss_scale": trainer.loss_scale, "examples_per_second": rate,
                  "skipped_steps": trainer.skipped_steps}
        if "tokens_per_sequence" in trainer.stats:
            record["tokens_per_second"] = rate * trainer.stats["tokens_per_sequence"]
        for hook in self.hooks:
            hook.on_log(self, record)
        return record

    def run(self, dataset: tf.data.Dataset, until_step: int | None = None, worker_part: bool = False) -> dict:
        """Train on `dataset` (a global-batch tf.data.Dataset, or with `worker_part` this worker's rows of
        each: distribute.worker_rows) -> the last training record."""
        trainer = self.trainer
        batches = trainer.training_batches(dataset, worker_part)
        skips = guards.SkipGuard(self.max_consecutive_skips)
        self._agreed = None
        self.stop, self.interrupted, self._saved = None, None, self.step
        self._start = self.clock()
        trainer.model.stop_training = False
        self.callbacks.on_train_begin()
        self.callbacks.on_epoch_begin(self._epoch)
        self._bar = _progress_bar(until_step, self.step) if self.verbose else None
        self._bar_from = self.step
        try:
            self._steps(batches, until_step, skips)
        except guards.worker_errors() as e:
            if self._decide.workers == 1:
                raise
            raise guards.worker_lost(e, self.last_checkpoint()) from None
        finally:
            getattr(batches, "close", lambda: None)()  # the batches read ahead are not trained on
        self.save()
        self.callbacks.on_train_end(self._train_record)
        for hook in self.hooks:
            hook.end(self)
        if trainer.skipped_steps:
            log.warning("%d step(s) skipped for non-finite gradients", trainer.skipped_steps)
        return self._train_record

    def _steps(self, batches, until_step, skips):
        trainer, tic, since, outputs = self.trainer, self._start, 0, None
        self._aside, after = 0.0, None  # seconds of evaluations and saves since the last record: not training
        preemption = guards.Preemption(trainer.strategy, self.save, self._decide.workers)
        with guards.StopSignal(on_signal=preemption.signalled), preemption:
            while True:
                now = self._read_clock()
                if after is not None:  # from the reading after the last step: its hooks and save
                    self._aside += now - after
                if until_step is not None and self.step >= until_step:
                    self.stop = f"reached {until_step} steps"
                self.stop = self.stop or next((r for r in (h.should_stop(self) for h in self.hooks) if r), None)
                if self.stop:
                    break
                for hook in self.hooks:
                    hook.before_step(self)
                self.callbacks.on_train_batch_begin(self.step)
                outputs = trainer.run_step(next(batches))  # queued: the host reads only on logging steps
                self.step, since, record = self.step + 1, since + 1, None
                if self.step % self.log_every == 0 or self.step == until_step:
                    record, tic = self._log_read(outputs, since, tic, skips)
                    since, after = 0, tic
                else:
                    after = self._read_clock()
                for hook in self.hooks:
                    hook.after_step(self, record)
                if self._bar is not None:  # the loss as of the last logging step: no extra read
                    loss_now = [("loss", self._train_record["loss"])] if record else None
                    self._bar.update(self.step - self._bar_from, loss_now)
                if record is not None and not self.epochs_at_evaluation:
                    self.end_epoch({})
                signalled = preemption.after_step()  # with several workers, it may save here
                if signalled:
                    self.interrupted = signalled
                    self.stop = f"interrupted by {self.interrupted}; rerun to resume"
                elif self.step % self.save_every == 0:
                    self.save()
        if outputs is not None and record is None:  # the last steps were not read: log and check them
            self._log_read(outputs, since, tic, skips)

    def _log_read(self, outputs, since, tic, skips):
        """Wait for the steps queued since the last read; log their mean as the step's record."""
        trainer = self.trainer
        loss, _, longest_skips = trainer.read(outputs)
        now = self._read_clock(agree=True)  # after the wait: steps done, not queued
        skips.check(longest_skips, self.step, self.last_checkpoint())
        record = self._train_record = self._record(loss, since, now - tic - self._aside)
        self._aside = 0.0
        self.log(record)
        self.callbacks.on_train_batch_end(self.step, {"loss": loss, **trainer.stats})
        return record, now


def interactive():
    """Whether stdout redraws in place (a terminal, a notebook): Keras' progress bar writes carriage returns
    and colour codes, which a log file or a pipe should not get."""
    return (hasattr(sys.stdout, "isatty") and sys.stdout.isatty()) or "ipykernel" in sys.modules


def _progress_bar(until_step, step):
    """Keras' progress bar over this run's steps (a resumed run counts from where it resumed, so the time
    left is right), where it redraws in place; a log file gets the logging lines."""
    if until_step is None or until_step <= step or not interactive():
        return None
    return keras.utils.Progbar(until_step - step, unit_name="step", stateful_metrics=["loss"])
