"""What every fine-tuned head shares: `fit` (one `Session`, evaluation while training, the best model, early
stopping, resume), the best model's directory and the automatic batch size.

A head (`BertClassifier`, `BertTagger`) is a subclass that says how its rows become training batches, what a
run records for it and how it evaluates; its `objective` gives the loss and the metric the best model is
chosen by. Nothing here knows a head kind.
"""

import contextlib
import dataclasses
import logging
import os

import keras
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import peft_adapter, run_checkpoint, run_dir
from bert_mgpu.model import lora
from bert_mgpu.model.adversarial import with_adversarial
from bert_mgpu.model.objective import label_weights
from bert_mgpu.model.rdrop import with_rdrop
from bert_mgpu.parallel import agree
from bert_mgpu.train import memory, optimization
from bert_mgpu.train.evaluation import BEST_DIR, BestModel, DevEvaluation, evaluation_every
from bert_mgpu.train.loop import interactive
from bert_mgpu.train.session import Session
from bert_mgpu.train.train_config import TrainConfig, check_class_weights
from bert_mgpu.train.training import Trainer

log = logging.getLogger("bert_mgpu")


class FineTuned:
    """A BERT encoder with one head, trained on every tower (see `fit`).

    Args:
        model: the Keras model (`.backbone`, `.head`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        labels: the label set, in the order of the logits.
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: the longest input a row holds.
        objective: the head kind's `Objective` (objective.py).
        fused_encoder: whether `model` runs the fused encoder (recorded in a run's settings).
    """

    unit = "examples"  # what a training row is, in messages

    def __init__(self, model, tokenizer, labels, config, towers, policy, max_seq_length, objective,
                 fused_encoder=True):
        self.model, self.tokenizer, self.labels, self.config = model, tokenizer, list(labels), config
        self.towers, self.policy, self.max_seq_length = towers, policy, max_seq_length
        self.fused_encoder, self.objective = fused_encoder, objective
        self.global_step, self.interrupted, self.settings, self.history = 0, None, None, []
        self.trained_steps = 0
        self.stop, self.best_step = None, None  # why the last fit stopped; its best model's step
        self.trained_parameters = None  # (trained, in all) when LoRA adapters train
        self.report = None  # the last evaluation's per-label (or per-type) report
        self.train_batch_size = towers.train_batch_size  # per tower, unless fit is given one
        self.train_config = None  # the last fit's TrainConfig, kept in bert_mgpu.json
        self.loss_wrapper = None  # training loss -> training loss, around the head's (a Distiller's teacher); its
        # `settings`, if it has them, join what a resumed run compares; its `batches(head, data, digest,
        # dataset)`, if it has one, adds to each training batch (a Distiller's --teacher_logits)
        self.unlabelled = ()  # rows without labels fit adds to the training rows: a Distiller's teacher labels them
        self._predictor = Trainer(towers.strategy, model)

    def _with_unlabelled(self, rows):
        """The training rows and, while a Distiller teaches, its unlabelled ones (refused without a teacher)."""
        if not self.unlabelled:
            return rows
        if self.loss_wrapper is None:
            raise UserError(f"{len(self.unlabelled)} unlabelled training rows and no teacher to label them: "
                            "they are a Distiller's")
        return list(rows) + list(self.unlabelled)

    # ------------------------------------------------------------------ what a head says
    def unlabelled_rows(self, rows):
        """What the head reads (Examples, Sentences) of text without labels, for a Distiller; UserError for a
        row with a label."""
        raise UserError(f"distillation: a {type(self).__name__} takes no unlabelled text")

    def with_encoder(self, config):
        """A fresh model of this head (its labels, settings and towers) on an encoder of `config` (a Distiller's
        student of fewer layers)."""
        raise UserError(f"distillation: a {type(self).__name__} is not distilled")

    def _training_data(self, examples):
        """The training rows as the head reads them -> (data for `_train_dataset`, rows an epoch, sha256)."""
        raise NotImplementedError

    def _train_dataset(self, data, global_batch, seed, buckets=False):
        """Training batches (features, labels, index) of `data`, shuffled with `seed`, repeated; `buckets`:
        batches of similar lengths (`input_pipeline.length_batches`)."""
        raise NotImplementedError

    def _rows_dataset(self, data, global_batch, rows_multiple):
        """`data` once in prediction batches (features, labels, index), `index` the same row numbers as
        `_train_dataset`'s (a Distiller's teacher predicts them once for --teacher_logits)."""
        raise NotImplementedError

    def _as_dev(self, dev):
        """Evaluation rows as `evaluate` takes them."""
        return dev

    def _head_settings(self):
        """What a resumed run must share for this head beyond the training config."""
        raise NotImplementedError

    def _probe_batch(self, global_batch):
        """A worst-case training batch of that many rows, for `auto_batch_size`."""
        raise NotImplementedError

    def _write_run(self, output_dir, step):
        """bert_mgpu.json, bert_config.json and vocab.txt: what makes output_dir a loadable checkpoint."""
        raise NotImplementedError

    def _label_counts(self, data):
        """How often each of `self.labels` is a training target in `data` (`_training_data`'s)."""
        raise NotImplementedError

    def _training_loss(self, config, data):
        """The objective's training loss, weighted by label (`config.class_weights`), focused
        (`config.focal_gamma`), with R-Drop's second pass (`config.rdrop_alpha`) and FGM's or PGD's adversarial
        one (`config.adversarial`) where the config asks, inside `loss_wrapper` if set; evaluation keeps the plain
        loss."""
        loss = self._weighted_loss(config, data)
        if config.rdrop_alpha:
            self.objective.check_rdrop()  # one line for a head without a softmax over classes, before any step
            loss = with_rdrop(loss, self.objective.divergence, config.rdrop_alpha)
        if config.adversarial_steps:
            if not self.fused_encoder:
                raise UserError("--adversarial needs the fused encoder: drop --fused_encoder=false")
            loss = with_adversarial(loss, *config.adversarial_steps)
        return self.loss_wrapper(loss) if self.loss_wrapper else loss

    def _weighted_loss(self, config, data):
        if config.class_weights is None and not config.focal_gamma:
            return self.objective.loss
        self.objective.reweighted()  # one line for a head whose loss is no softmax, before the counting
        weights = config.class_weights
        if weights == "auto":
            weights = label_weights(self._label_counts(data))
        elif weights is not None:
            weights = check_class_weights(weights)
            if len(weights) != len(self.labels):
                raise UserError(f"--class_weights: {len(weights)} weights for {len(self.labels)} labels "
                                f"({', '.join(self.labels)})")
        if weights is not None:
            log.info("class weights: %s", ", ".join(f"{label} {w:.4g}" for label, w in zip(self.labels, weights)))
        return self.objective.reweighted(weights, config.focal_gamma).loss

    def reader(self, **settings):
        """This head's objective set to read its outputs as this model does (`_reading`: its labels, threshold,
        metric), with `settings` (a prediction file's format) on top: `reader().evaluate(outputs, targets)`,
        `reader(...).prediction_files(predictions, rows)`."""
        return self.objective.read_as(**{**self._reading(), **settings})

    def _reading(self):
        """The objective's reading settings this model holds (objective.Objective.read_as)."""
        return {}

    def evaluate(self, examples, batch_size=8, verbose="auto"):
        raise NotImplementedError

    def _window_logits(self, rows, make_dataset, batch_size, verbose, source):
        """(logits, labels) of `rows` (windows) in their order: `make_dataset(rows, global batch,
        rows_multiple)` batches them for prediction; a progress bar from 1,000 rows (or `verbose=True`)."""
        if int(batch_size) < 1:
            raise UserError(f"--{source}_batch_size={batch_size}: must be at least 1")
        data = make_dataset(rows, self.towers.batch(batch_size), self.towers.batch(min(batch_size, 8)))
        bar = prediction_bar(len(rows), "window", verbose)
        return self._predictor.predict_logits(data, progress=bar.add if bar else None)

    @property
    def main_metric(self):
        """The evaluation result the best model is chosen by: the objective's."""
        return self.objective.main_metric()

    # ------------------------------------------------------------------ training
    def fit(self, examples, output_dir: str, config: TrainConfig | None = None, dev=None, callbacks=None,
            settings: dict | None = None, **keywords) -> dict:
        """Fine-tune; rerunning with the same output_dir and settings resumes where the last checkpoint was.

        `config`: a `TrainConfig`; `keywords` are its fields (epochs, learning_rate, train_batch_size,
        eval_every_steps, ...), given instead of or on top of it. The resumed run sees the batches the
        uninterrupted one would have seen (same seed, seen ones skipped). SIGTERM/Ctrl-C stop after the
        step under way with a checkpoint and set `self.interrupted`. Other settings in an output_dir holding
        checkpoints are refused unless `overwrite`. `settings` adds the caller's own (the script's flags) to
        what is compared. `callbacks`: Keras callbacks (see loop.Loop). With gradient accumulation each
        tower runs that many batches one after another and the step applies their mean gradient, so the
        global batch is towers x per-tower batch x accumulation steps.

        Evaluation while training (evaluation.py) on `dev`: every `eval_every_steps` or every epoch;
        `metric_for_best_model` (default `main_metric`) picks the model kept in `output_dir/best`;
        `load_best_model_at_end` leaves that model in `self.model`; `early_stopping_patience` evaluations
        without an improvement above `early_stopping_threshold` stop the run.

        Returns the history, as Keras' `History.history`: a list per name, the training records' (`step`,
        `loss`, `learning_rate`, ...) and the evaluations' (`eval_step`, `eval_loss`, ...).
        """
        config = TrainConfig.make(config, **keywords)
        config.check()
        if not config.overwrite:  # a run written by an older version resumes with the recipe it began with
            config = config.resuming((run_dir.read_run(output_dir) or {}).get("settings"))
        adapters = config.lora
        self.trained_parameters = None  # a fit without adapters after one with them trains every weight
        if adapters:  # before the session: its checkpoint holds them
            with self.towers.strategy.scope():
                lora.enable(self.model, adapters)
            self.trained_parameters = lora.trainable_counts(self.model)
        data, rows, digest = self._training_data(examples)
        loss = self._training_loss(config, data)
        dev = None if dev is None else self._as_dev(dev)
        per_tower, accum = int(config.train_batch_size or self.train_batch_size), config.gradient_accumulation_steps
        global_batch = self.towers.batch(per_tower) * accum
        per_epoch, num_steps = config.steps(rows, global_batch)
        if num_steps < 1:
            raise UserError(f"{rows} training {self.unit} make no step at global batch {global_batch} "
                            f"x {config.epochs} epochs")
        if num_steps >= 2**31:
            raise UserError(f"--num_train_epochs={config.epochs} makes {num_steps} steps: more than a run can count")
        self.train_config = dataclasses.replace(config, train_batch_size=per_tower)  # saved as it ran
        self.settings = {
            "train_examples": rows, "train_data_sha256": digest,
            **config.settings(per_tower), "towers": self.towers.count,
            "max_seq_length": self.max_seq_length, "labels": self.labels,
            "precision": self.policy, **run_dir.encoder_setting(self.fused_encoder),
            **run_dir.vocab_setting(self.tokenizer.vocab_file),
            **self._head_settings(), **getattr(self.loss_wrapper, "settings", {}), **(settings or {})}
        every = evaluation_every(config.evaluation_strategy, config.eval_every_steps, per_epoch)
        if (every or config.load_best_model_at_end or config.early_stopping_patience) and not dev:
            raise UserError("evaluation during training (--evaluation_strategy, --eval_every_steps, "
                            "--load_best_model_at_end, --early_stopping_patience) needs dev examples")
        choice = BestModel(config.metric_for_best_model or self.main_metric, config.greater_is_better,
                           config.early_stopping_patience, config.early_stopping_threshold)
        if every and config.metric_for_best_model:  # before any step: an evaluation of a few rows names its keys
            names = self.evaluate(dev[:config.eval_batch_size * self.towers.count], config.eval_batch_size,
                                  verbose=False)
            if choice.metric not in names:
                known = ", ".join(k[len("eval_"):] for k in sorted(names) if k.startswith("eval_")
                                  and not k.startswith("eval_report_") and k != "eval_examples")
                raise UserError(f"--metric_for_best_model={config.metric_for_best_model}: the evaluation gives "
                                f"{known}")
        run = run_dir.Run(output_dir, self.settings, self._write_run, config.overwrite, chief=self.towers.is_chief,
                          keep=config.save_total_limit)
        warmup = config.warmup_steps(num_steps)
        session = Session(self.towers, self.model, run, lambda: optimization.create_optimizer(
            config.learning_rate, num_steps, warmup, float16=self.policy == "mixed_float16",
            epsilon=config.adam_epsilon, layerwise_lr_decay=config.layerwise_lr_decay,
            decay_from_warmup=config.lr_schedule == "linear", ema_decay=config.ema_decay), loss,
            accum, config.use_xla, recompute=config.recompute, seed=config.seed)
        # --ema_decay: evaluations and best/ see the moving averages, and a run that ends (not one stopped
        # to resume) saves them as its weights, as Keras' fit ends with use_ema.
        averaged = session.optimizer.averaged_weights if config.ema_decay and config.ema_for_eval else None

        def finish_with_averages(loop):
            if loop.step >= num_steps or (loop.stop and not loop.interrupted):
                if averaged:
                    session.optimizer.finalize_averages()
                self._end_adapters(output_dir)
        start = session.start
        if session.restored:
            log.info("resuming from %s at step %d", session.restored, start)
        if self.towers.is_chief:
            self._write_run(output_dir, start)
        log.info("training: %d %s, %d steps of %d (%d towers x %d x %d accumulation steps), warmup %d, "
                 "from step %d", rows, self.unit, num_steps, global_batch, self.towers.count, per_tower, accum, warmup,
                 start)
        self.interrupted, hooks = None, []
        if every:
            chief = self.towers.is_chief
            def dev_results():
                with (averaged or contextlib.nullcontext)():
                    return {k: v for k, v in self.evaluate(dev, config.eval_batch_size, verbose=False).items()
                            if k.startswith("eval_") and k != "eval_examples"}

            def save_best(directory, step):
                with (averaged or contextlib.nullcontext)():
                    self._save_model_dir(directory, step)

            watch = DevEvaluation(
                dev_results, every, output_dir, choice, save_best,
                tf.summary.create_file_writer(run_dir.check_event_dir(os.path.join(output_dir, "eval"))) if chief
                else tf.summary.create_noop_writer(), chief)
            watch.resume(start)
            hooks.append(watch)
        if start >= num_steps:
            self.global_step = self.trained_steps = start
            run.close()
            return self._finish(hooks, config.load_best_model_at_end, [])
        dataset = self._train_dataset(data, global_batch, config.seed, config.length_buckets).skip(start)
        teaching = getattr(self.loss_wrapper, "batches", None)  # a Distiller's cached teacher outputs join them
        if teaching is not None:
            dataset = teaching(self, data, digest, dataset)
        loop = session.loop(global_batch, config, hooks, callbacks, before_save=finish_with_averages)
        try:
            session.train(loop, dataset, until_step=num_steps)
        finally:
            for hook in hooks:
                hook.writer.close()
        self.global_step, self.interrupted, self.stop = loop.step, loop.interrupted, loop.stop
        self.trained_steps = loop.step  # global_step moves to the best step when that model is loaded
        if self.interrupted:
            log.warning("%s: stopped at step %d of %d; checkpoint %s. Rerun the same command to resume",
                        self.interrupted, self.global_step, num_steps, run.latest)
        else:
            log.info("trained to step %d (%s); checkpoint %s", self.global_step, loop.stop, run.latest)
        return self._finish(hooks, config.load_best_model_at_end and not self.interrupted, loop.history)

    def _finish(self, hooks, load_best, records):
        """The history as Keras gives it; the best model loaded when asked."""
        self.history = records
        history = {}
        for record in records:
            evaluation = any(k.startswith("eval_") for k in record)
            for key, value in record.items():
                history.setdefault("eval_step" if evaluation and key == "step" else key, []).append(value)
        watch = hooks[0] if hooks else None
        self.best_step = watch.best["step"] if watch and watch.best else None
        if load_best and self.best_step is not None:
            def read(directory):  # -> the step read; -1 for none (TensorFlow's read(None) reads nothing)
                path = tf.train.latest_checkpoint(directory)
                if path is None:
                    return -1
                run_checkpoint.training_checkpoint(self.model).read(path).expect_partial()
                return int(path.rsplit("-", 1)[1])

            best = os.path.join(watch.output_dir, BEST_DIR)
            agree.same_model_loaded(self.towers.strategy, read, self.best_step, best)
            self._end_adapters(watch.output_dir)  # best/ keeps its adapters apart: the run ends with best's
            self.global_step = self.best_step
            log.info("loaded the best model (%s %.4g at step %d) from %s", watch.choice.metric,
                     watch.best[watch.choice.metric], self.best_step, best)
        return history

    def _end_adapters(self, output_dir):
        """LoRA: the adapters written apart in PEFT's layout (peft_adapter.py), then added into the encoder, so
        the run ends as one ordinary BERT. Nothing without adapters, or once they are added in."""
        if not lora.pending(self.model):
            return
        if self.towers.is_chief:
            peft_adapter.write(self, os.path.join(output_dir, peft_adapter.DIRECTORY))
        lora.merge(self.model)

    def _save_model_dir(self, directory, step):
        """A loadable model directory of the weights as they are (`best/`): encoder, head, run files."""
        run_dir.save_model_dir(directory, run_checkpoint.training_checkpoint(self.model), step,
                               lambda d, s: self._write_run(d, s), self.towers.is_chief)

    def auto_batch_size(self, memory_limit_mb: float | None = None, output_dir: str | None = None,
                        memory_per_tower_mb: float | None = None, use_xla: bool = False,
                        recompute: bool = False) -> int:
        """Set `train_batch_size` (per tower) to the largest that fits (see memory.py) and return it.

        A run in output_dir that already found one keeps it, so resuming trains as it started.
        """
        before = ((output_dir and run_dir.read_run(output_dir)) or {}).get("settings") or {}
        if before.get("auto_batch_size") and before.get("per_tower_batch"):
            self.train_batch_size = int(before["per_tower_batch"])
            log.info("auto batch size: %d per tower, as found for %s", before["per_tower_batch"], output_dir)
            return before["per_tower_batch"]
        best = memory.find_for_model(self.towers, self.model, self.policy, self._probe_batch, self.objective.loss,
                                     memory_limit_mb=memory_limit_mb, memory_per_tower_mb=memory_per_tower_mb,
                                     use_xla=use_xla, recompute=recompute)
        self.train_batch_size = best
        return best


def prediction_bar(rows, unit, verbose):
    """Keras' progress bar over a prediction: with verbose=True, or "auto" from 1,000 rows where it redraws
    in place (a terminal, a notebook; a pipe or log file would get its carriage returns and colour codes)."""
    if verbose is True or (verbose == "auto" and rows >= 1000 and interactive()):
        return keras.utils.Progbar(rows, unit_name=unit)
    return None
