"""The notebook API for pretraining: from scratch or continued, under a step or a wall-clock budget.

The loop follows "How to Train BERT with an Academic Budget": the learning rate can follow the share of
a time budget spent (`lr_schedule="time"`), validation is denser near the start and the end of the run,
a run whose validation loss is still above a threshold after some minutes is stopped early, and
fine-tune checkpoints (a bert_mgpu directory the classifier loads) are written at chosen shares of the
budget. Training checkpoints hold weights, optimizer, step and elapsed time; rerunning with the same
output_dir resumes where the last one was written, on the same data (see pretraining_input.py).

Example:
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)   # micro-batch per tower
    pre = bert_mgpu.BertPretrainer.from_pretrained("minilm_dir", towers=towers, nsp=False)
    data = bert_mgpu.PretrainingData("text", ["docs/*.txt"], pre.tokenizer, max_seq_length=128)
    pre.fit(data, "out", Budget(total_training_time=0.1, lr_schedule="time", finetune_time_markers=(0.5, 1.0)),
            train_batch_size=64)
"""

import dataclasses
import logging
import os
import shutil
import time

import tensorflow as tf

from bert_mgpu import checkpoints, devices, guards, memory, optimization, pretraining_model, run_dir
from bert_mgpu.config import BertConfig
from bert_mgpu.devices import Towers
from bert_mgpu.errors import UserError
from bert_mgpu.outputs import write_eval_results
from bert_mgpu.precision import resolve_precision
from bert_mgpu.tokenization import FullTokenizer
from bert_mgpu.training import Trainer

log = logging.getLogger("bert_mgpu")


@dataclasses.dataclass
class Budget:
    """When to stop and how the learning rate moves. Give num_train_steps, total_training_time, or both."""

    num_train_steps: int = None
    total_training_time: float = None  # hours
    lr_schedule: str = "step"  # "step": warmup + (polynomial) decay over steps; "time": over the time budget
    curve: str = "linear"  # time schedule: linear or exp
    decay_power: float = 1.0  # step schedule: 1 = linear
    warmup_proportion: float = 0.01  # share of the steps, or of the time budget
    early_exit_time_marker: float = None  # hours: stop here even if the schedule runs longer
    finetune_time_markers: tuple = ()  # shares of the budget at which to write fine-tune checkpoints
    early_stop_time: float = None  # minutes after which ...
    early_stop_eval_loss: float = None  # ... a validation loss above this stops the run

    def check(self):
        if not self.num_train_steps and not self.total_training_time:
            raise UserError("give --num_train_steps or --total_training_time (hours), or both")
        if self.lr_schedule not in ("step", "time"):
            raise UserError(f"--lr_schedule={self.lr_schedule!r}: expected step or time")
        if self.lr_schedule == "time" and not self.total_training_time:
            raise UserError("--lr_schedule=time needs --total_training_time (hours)")
        if self.lr_schedule == "step" and not self.num_train_steps:
            raise UserError("--lr_schedule=step needs --num_train_steps")
        if any(not 0 < m <= 1 for m in self.finetune_time_markers):
            raise UserError(f"--finetune_time_markers={list(self.finetune_time_markers)}: shares in (0, 1]")

    def progress(self, step, elapsed):
        """Share of the budget spent: of the time budget when there is one, else of the steps."""
        if self.total_training_time:
            return elapsed / (self.total_training_time * 3600.0)
        return step / self.num_train_steps

    def stop_reason(self, step, elapsed):
        if self.num_train_steps and step >= self.num_train_steps:
            return f"reached {self.num_train_steps} steps"
        if self.total_training_time and elapsed >= self.total_training_time * 3600.0:
            return f"time budget of {self.total_training_time} h spent"
        if self.early_exit_time_marker and elapsed >= self.early_exit_time_marker * 3600.0:
            return f"early exit time marker of {self.early_exit_time_marker} h"
        return None


@dataclasses.dataclass
class Validation:
    """Held-out data and how often to score it: every `epochs` (or `steps`), denser at both ends."""

    data: object  # a PretrainingData
    epochs: float = 1.0
    steps: int = None  # overrides `epochs` between the dense regions
    begin_proportion: float = 0.0  # share of the budget at the start ...
    epochs_begin: float = None  # ... validated every this many epochs
    end_proportion: float = 0.0
    epochs_end: float = None
    batch_size: int = 32  # global
    max_steps: int = 100  # batches per validation

    def interval(self, progress, steps_per_epoch):
        """Steps between validations at this point of the budget."""
        if self.epochs_begin and progress < self.begin_proportion:
            epochs = self.epochs_begin
        elif self.epochs_end and progress >= 1.0 - self.end_proportion:
            epochs = self.epochs_end
        elif self.steps:
            return self.steps
        else:
            epochs = self.epochs
        return max(1, round(epochs * steps_per_epoch()))


class BertPretrainer:
    def __init__(self, model, tokenizer, config, towers, policy, fused_encoder=True):
        self.model, self.tokenizer, self.config, self.towers, self.policy = model, tokenizer, config, towers, policy
        self.fused_encoder = fused_encoder
        self.history = []  # one dict per logged step and per validation, for notebooks and tests
        self.stop = None  # why the last fit stopped
        self.settings = None  # what the last fit was run with (compared when an output_dir is reused)

    @classmethod
    def _build(cls, config, tokenizer, towers, precision, nsp, fused_encoder):
        towers = towers or Towers()
        config.check_vocab(tokenizer.vocab_file, tokenizer.vocab_size)
        policy, why = resolve_precision(precision, towers.plan)
        log.info("precision: %s (%s)", policy, why)
        with towers.strategy.scope():
            model = pretraining_model.build_pretrainer(config, policy, nsp, fused=fused_encoder)
        return cls(model, tokenizer, config, towers, policy, fused_encoder)

    @classmethod
    def from_config(cls, bert_config, vocab_file, do_lower_case=True, towers=None, precision="auto", nsp=True,
                    fused_encoder=True):
        """A randomly initialized BERT (google-bert's truncated-normal init) for pretraining from scratch.

        fused_encoder=False runs keras-hub's BertBackbone as it is (the reference; slower), here and in
        `from_pretrained`.
        """
        config = bert_config if isinstance(bert_config, BertConfig) else BertConfig.from_json_file(bert_config)
        return cls._build(config, FullTokenizer(vocab_file, do_lower_case), towers, precision, nsp, fused_encoder)

    @classmethod
    def from_pretrained(cls, init_checkpoint, towers=None, precision="auto", nsp=True, do_lower_case=None,
                        bert_config_file=None, vocab_file=None, fused_encoder=True):
        """Continue pretraining any checkpoint the classifier reads; heads it lacks start fresh (logged)."""
        pre = checkpoints.load_pretrained(init_checkpoint, bert_config_file, vocab_file)
        lower = do_lower_case if do_lower_case is not None else (
            True if pre.do_lower_case is None else bool(pre.do_lower_case))
        self = cls._build(pre.config, FullTokenizer(pre.vocab_file, lower), towers, precision, nsp, fused_encoder)
        checkpoints.assign_encoder(self.model.backbone, pre.weights, init_checkpoint)
        fresh = pretraining_model.assign_heads(self.model, pre.weights, init_checkpoint)
        log.info("loaded %s checkpoint %s; heads loaded: %s", pre.kind, init_checkpoint,
                 ", ".join(sorted(set(pretraining_model.head_variables(self.model)) - set(fresh))) or "none")
        if fresh:
            log.warning("not in %s, initialized fresh: %s", init_checkpoint, ", ".join(fresh))
        return self

    # ------------------------------------------------------------------ training
    def fit(self, data, output_dir, budget, train_batch_size=None, learning_rate=1e-4, optimizer="adamw",
            beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=0.01, clipnorm=1.0, validation=None,
            save_checkpoints_steps=1000, log_every=10, use_xla=False, clock=time.monotonic, verbose=True,
            steps=None, max_consecutive_skips=10, overwrite=False, settings=None):
        """Pretrain until the budget says stop; rerunning with the same output_dir resumes.

        `train_batch_size` is the global batch, reached with the towers' micro-batch and gradient
        accumulation (default: one micro-batch per tower). `steps` stops this call after that many steps
        (a notebook can train in chunks; the next call resumes). Returns the last logged statistics.
        SIGTERM/Ctrl-C stop after the step under way with a checkpoint (`self.stop` says so); an
        output_dir holding a run with other `settings` is refused unless `overwrite`.
        """
        budget.check()
        run_dir.check_output_dir(output_dir)
        micro = self.towers.plan.per_tower_batch
        global_batch = train_batch_size or self.towers.batch(micro)
        if global_batch % self.towers.batch(micro):
            raise UserError(f"--train_batch_size={global_batch} is not a multiple of micro-batch x towers = "
                            f"{micro} x {self.towers.count}")
        accum = global_batch // self.towers.batch(micro)
        if self.model.nsp_head is not None and not data.has_nsp:
            raise UserError("next-sentence prediction needs TFRecords from create_pretraining_data; "
                            "raw text input trains masked LM only (--nsp=false)")
        strategy = self.towers.strategy
        with strategy.scope():
            progress = tf.Variable(0.0, trainable=False, name="progress")
            schedule = (optimization.TimeBasedDecay(learning_rate, budget.warmup_proportion, budget.curve, progress)
                        if budget.lr_schedule == "time" else optimization.WarmupLinearDecay(
                            learning_rate, budget.num_train_steps,
                            int(budget.num_train_steps * budget.warmup_proportion), budget.decay_power))
            opt = optimization.create_optimizer(
                learning_rate, schedule=schedule, weight_decay=weight_decay, float16=self.policy == "mixed_float16",
                optimizer=optimizer, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, clipnorm=clipnorm)
            elapsed_var = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="elapsed_seconds")
        self.settings = {"budget": dataclasses.asdict(budget), "global_batch": global_batch,
                         "towers": self.towers.count, "learning_rate": learning_rate, "optimizer": optimizer,
                         "beta_1": beta_1, "beta_2": beta_2, "epsilon": epsilon, "weight_decay": weight_decay,
                         "clipnorm": clipnorm, "precision": self.policy,
                         **run_dir.encoder_setting(self.fused_encoder), **(settings or {})}
        self.settings["budget"]["finetune_time_markers"] = list(budget.finetune_time_markers)
        run_dir.check_same_run(output_dir, self.settings, overwrite)
        trainer = Trainer(strategy, self.model, opt, use_xla, pretraining_model.pretraining_loss, accum)
        ckpt = checkpoints.training_checkpoint(self.model, opt, trainer.step,
                                               heads=pretraining_model.head_checkpoint_objects(self.model),
                                               elapsed_seconds=elapsed_var, rng=run_dir.rng_states(self.model))
        saved = run_dir.Checkpoints(ckpt, output_dir, self.model.weights)
        restored = saved.restore()
        if restored:
            log.info("resuming from %s at step %d (%.1f s trained)", restored,
                     int(trainer.step.numpy()), float(elapsed_var.numpy()))
        step, elapsed0 = int(trainer.step.numpy()), float(elapsed_var.numpy())
        log.info("pretraining: global batch %d = %d towers x %d x %d accumulation steps, from step %d",
                 global_batch, self.towers.count, micro, accum, step)
        dist = devices.distribute_dataset(strategy, data.dataset(global_batch, True, step * global_batch))
        trainer.input_spec, it = dist.element_spec, iter(dist)  # one trace for every step (see Trainer)
        writer = tf.summary.create_file_writer(os.path.join(output_dir, "train"))
        steps_per_epoch = lambda: max(1, data.count() // global_batch)  # noqa: E731
        marker_dir = lambda m: os.path.join(output_dir, "finetune_checkpoints", f"at_{m:g}")  # noqa: E731
        markers = sorted(m for m in budget.finetune_time_markers if not os.path.exists(marker_dir(m)))
        start_clock = clock()
        elapsed = lambda: elapsed0 + clock() - start_clock  # noqa: E731

        def save():
            elapsed_var.assign(elapsed())
            saved.save(int(trainer.step.numpy()))
            self._write_run(output_dir, int(trainer.step.numpy()), data)

        last_validation, result, tic, since, first = step, {}, clock(), 0, step
        self.stop, skips = None, guards.SkipGuard(max_consecutive_skips)
        with guards.StopSignal() as signals:
            while self.stop is None:
                now = elapsed()
                self.stop = budget.stop_reason(step, now)
                if steps is not None and step - first >= steps and not self.stop:
                    self.stop = f"ran the {steps} steps asked for"
                if self.stop:
                    break
                step_progress = budget.progress(step, now)  # what this step's learning rate follows
                progress.assign(step_progress)
                applied = trainer.applied_steps
                loss, _ = trainer.train_step(next(it))
                step, since = step + 1, since + 1
                skips.update(trainer.applied_steps > applied, step, saved.latest)
                now_progress = budget.progress(step, elapsed())
                if step % log_every == 0:
                    rate = since * global_batch / max(1e-9, clock() - tic)
                    tic, since = clock(), 0
                    result = {"step": step, "loss": loss, **trainer.stats, "learning_rate": trainer.learning_rate,
                              "loss_scale": trainer.loss_scale, "sequences_per_second": rate,
                              "tokens_per_second": rate * trainer.stats.get("tokens_per_sequence", 0.0),
                              "progress": step_progress}
                    self._log(writer, result, verbose)
                while markers and now_progress >= markers[0]:
                    self.save_finetune_checkpoint(marker_dir(markers.pop(0)), step, data)
                if validation is not None and step - last_validation >= validation.interval(now_progress,
                                                                                             steps_per_epoch):
                    last_validation = step
                    result = self._validate(trainer, validation, step, writer, verbose)
                    if (budget.early_stop_time is not None and budget.early_stop_eval_loss is not None
                            and elapsed() >= budget.early_stop_time * 60
                            and result["eval_loss"] > budget.early_stop_eval_loss):
                        self.stop = (f"early stop: validation loss {result['eval_loss']:.4f} > "
                                     f"{budget.early_stop_eval_loss} after {budget.early_stop_time} min")
                if signals.requested:
                    self.stop = f"interrupted by {signals.requested}; rerun to resume"
                elif step % save_checkpoints_steps == 0:
                    save()
        save()
        log.info("stopped at step %d: %s", step, self.stop)
        if trainer.skipped_steps:
            log.warning("%d step(s) skipped for non-finite gradients", trainer.skipped_steps)
        final = budget.progress(step, elapsed())
        for m in markers:  # the end marker (1.0) is reached only as the run stops
            if final >= m - 1e-9 or self.stop.startswith("reached"):
                self.save_finetune_checkpoint(marker_dir(m), step, data)
        writer.close()
        self.trainer = trainer
        return result

    def auto_batch_size(self, global_batch, max_seq_length, max_predictions_per_seq, memory_limit_mb=None,
                        memory_per_tower_mb=None, use_xla=False):
        """Set the towers' micro-batch to the largest that fits (memory.py) and divides the global batch
        into whole accumulation steps; returns it."""
        fits = memory.find_for_model(
            self.towers, self.model, self.policy,
            lambda n: memory.pretraining_batch(n, max_seq_length, max_predictions_per_seq),
            pretraining_model.pretraining_loss, memory_limit_mb, memory_per_tower_mb,
            cap=max(1, global_batch // self.towers.count), use_xla=use_xla)
        micro = max(m for m in range(1, fits + 1) if global_batch % (m * self.towers.count) == 0)
        log.info("micro-batch %d per tower (%d fits), %d accumulation steps", micro, fits,
                 global_batch // (micro * self.towers.count))
        self.towers.set_batch(micro)
        return micro

    def _validate(self, trainer, validation, step, writer, verbose):
        stats = trainer.evaluate(validation.data.dataset(validation.batch_size, training=False),
                                 validation.max_steps)
        result = {"step": step, **{f"eval_{k}": v for k, v in stats.items()}}
        self._log(writer, result, verbose)
        return result

    def _log(self, writer, result, verbose):
        self.history.append(result)
        with writer.as_default(step=result["step"]):
            for key, value in result.items():
                if key != "step":
                    tf.summary.scalar(key, value)
        if verbose:
            log.info("step %d: %s", result["step"], ", ".join(
                f"{k} {v:.4g}" for k, v in result.items() if k != "step"))

    def evaluate(self, data, batch_size=32, max_steps=None):
        """google-bert's run_pretraining eval results: masked-LM (and NSP) loss and accuracy."""
        trainer = Trainer(self.towers.strategy, self.model, loss_fn=pretraining_model.pretraining_loss)
        stats = trainer.evaluate(data.dataset(batch_size, training=False), max_steps)
        names = {"mlm_loss": "masked_lm_loss", "mlm_accuracy": "masked_lm_accuracy",
                 "nsp_loss": "next_sentence_loss", "nsp_accuracy": "next_sentence_accuracy", "loss": "loss"}
        return {names[k]: v for k, v in stats.items() if k in names}

    def write_eval_results(self, output_dir, results, global_step):
        return write_eval_results(output_dir, {**results, "global_step": global_step})

    # ------------------------------------------------------------------ outputs
    def save_finetune_checkpoint(self, directory, step, data=None):
        """A bert_mgpu directory (encoder + heads, config, vocab) that run_classifier_mgpu.py loads."""
        tmp = directory + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        ckpt = checkpoints.training_checkpoint(self.model, heads=pretraining_model.head_checkpoint_objects(self.model))
        tf.train.CheckpointManager(ckpt, tmp, max_to_keep=1).save(checkpoint_number=step)
        self._write_run(tmp, step, data)
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)  # a marker directory appears complete or not at all
        log.info("fine-tune checkpoint at step %d: %s", step, directory)
        return directory

    def _write_run(self, directory, step, data=None):
        run = {"kind": "pretraining", "do_lower_case": self.tokenizer.do_lower_case, "global_step": step,
               "max_seq_length": data.max_seq_length if data else None, "nsp": self.model.nsp_head is not None,
               "settings": self.settings}
        checkpoints.write_run_files(directory, run, self.config, self.tokenizer.vocab_file)
