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

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence

import tensorflow as tf

from bert_mgpu.api import mlm_scoring
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.pretraining_input import PretrainingData, worker_files
from bert_mgpu.io import checkpoints, export, run_checkpoint, run_dir
from bert_mgpu.io.loading import open_checkpoint, open_config
from bert_mgpu.io.outputs import write_eval_results
from bert_mgpu.io.trained import Trained
from bert_mgpu.model import pretraining_model
from bert_mgpu.model.config import BertConfig
from bert_mgpu.model.mlm_objective import MaskedLanguageModel
from bert_mgpu.parallel import distribute
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory, optimization, schedules
from bert_mgpu.train.budget import Budget, EarlyStop, FinetuneMarkers, StepLimit, TimeBudget, Validation
from bert_mgpu.train.loop import Evaluation
from bert_mgpu.train.session import Session
from bert_mgpu.train.train_config import PretrainConfig
from bert_mgpu.train.training import Trainer

log = logging.getLogger("bert_mgpu")


class BertPretrainer:
    """BERT with google-bert's masked-LM (and next-sentence) heads, pretrained on every tower.

    Build it with `from_config` (from scratch) or `from_pretrained` (continued pretraining); `fit` trains
    under a `Budget` and resumes, `evaluate` gives google-bert's run_pretraining eval results, and
    `save_finetune_checkpoint` writes a directory the classifier loads.

    Args:
        model: the Keras model (`pretraining_model.build_pretrainer`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        config: the `BertConfig`.
        towers: the `Towers` it runs on; their `train_batch_size` is the first micro-batch.
        policy: the Keras dtype policy it computes in.
        fused_encoder: whether `model` runs the fused encoder.

    Example:
        towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
        pre = bert_mgpu.BertPretrainer.from_pretrained("model_dir", towers=towers, nsp=False)
        data = bert_mgpu.PretrainingData("text", ["docs/*.txt"], pre.tokenizer, max_seq_length=128)
        pre.fit(data, "out", bert_mgpu.Budget(num_train_steps=1000), train_batch_size=64)
    """

    def __init__(self, model, tokenizer, config, towers, policy, fused_encoder=True):
        self.model, self.tokenizer, self.config, self.towers, self.policy = model, tokenizer, config, towers, policy
        self.fused_encoder, self.objective = fused_encoder, MaskedLanguageModel()
        self.history = []  # one dict per logged step and per validation, for notebooks and tests
        self.stop = None  # why the last fit stopped
        self.interrupted = None  # the signal that stopped the last fit, if one did
        self.settings = None  # what the last fit was run with (compared when an output_dir is reused)
        self.global_step = 0  # the step of the model: of the bert_mgpu checkpoint read, then of the last fit
        self.micro_batch = towers.train_batch_size  # per tower; fit accumulates micro-batches to its global batch
        self.train_config = None  # the last fit's PretrainConfig, kept in bert_mgpu.json
        self.fresh_heads = []  # head weights the checkpoint lacked (from_pretrained), initialized at random

    @classmethod
    def _build(cls, opened, nsp, fused_encoder):
        model, _ = opened.build(lambda config, policy: pretraining_model.build_pretrainer(config, policy, nsp,
                                                                                          fused=fused_encoder))
        return cls(model, opened.tokenizer, opened.config, opened.towers, opened.policy, fused_encoder)

    @classmethod
    def from_config(cls, bert_config: BertConfig | str, vocab_file: str, do_lower_case: bool = True,
                    towers: Towers | None = None, precision: str = "auto", nsp: bool = True,
                    fused_encoder: bool = True) -> "BertPretrainer":
        """A randomly initialized BERT (google-bert's truncated-normal init) for pretraining from scratch.

        fused_encoder=False runs keras-hub's BertBackbone as it is (the reference; slower), here and in
        `from_pretrained`.
        """
        config = bert_config if isinstance(bert_config, BertConfig) else BertConfig.from_json_file(bert_config)
        return cls._build(open_config(config, vocab_file, do_lower_case, towers, precision), nsp, fused_encoder)

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, towers: Towers | None = None, precision: str = "auto",
                        nsp: bool = True, do_lower_case: bool | None = None, bert_config_file: str | None = None,
                        vocab_file: str | None = None, fused_encoder: bool = True) -> "BertPretrainer":
        """Continue pretraining any checkpoint the classifier reads; heads it lacks start fresh (logged)."""
        opened = open_checkpoint(init_checkpoint, towers, precision, do_lower_case, bert_config_file, vocab_file)
        self, pre = cls._build(opened, nsp, fused_encoder), opened.pretrained
        fresh = pretraining_model.assign_heads(self.model, pre.weights, init_checkpoint)
        log.info("heads loaded from %s: %s", init_checkpoint,
                 ", ".join(sorted(set(pretraining_model.head_variables(self.model)) - set(fresh))) or "none")
        if fresh:
            log.warning("not in %s, initialized fresh: %s", init_checkpoint, ", ".join(fresh))
        self.fresh_heads = fresh
        if pre.run_of("pretrainer") is not None and pre.checkpoint_step is not None:
            self.global_step = pre.checkpoint_step
        return self

    # ------------------------------------------------------------------ training
    def fit(self, data: PretrainingData, output_dir: str, budget: Budget, config: PretrainConfig | None = None,
            validation: Validation | None = None, clock: Callable[[], float] | None = None, steps: int | None = None,
            settings: dict | None = None, callbacks: Sequence | None = None, **keywords) -> dict:
        """Pretrain until the budget says stop; rerunning with the same output_dir resumes.

        `config`: a `PretrainConfig`; `keywords` are its fields (train_batch_size, learning_rate, optimizer,
        ...), given instead of or on top of it. Its `train_batch_size` is the global batch, reached with
        the micro-batch (`self.micro_batch` per tower) and gradient accumulation (default: one micro-batch
        per tower). `steps` stops this call after that many steps (a notebook can train in chunks; the
        next call resumes). Returns the last logged statistics. SIGTERM/Ctrl-C stop after the step under
        way with a checkpoint (`self.stop` says so); an output_dir holding a run with other `settings` is
        refused unless `overwrite`. `callbacks`: Keras callbacks (see loop.Loop).
        """
        config = PretrainConfig.make(config, **keywords)
        config.check()
        budget.check()
        micro = self.micro_batch
        global_batch = config.train_batch_size or self.towers.batch(micro)
        if global_batch % self.towers.batch(micro):
            raise UserError(f"--train_batch_size={global_batch} is not a multiple of micro-batch x towers = "
                            f"{micro} x {self.towers.count}")
        accum = global_batch // self.towers.batch(micro)
        if self.model.nsp_head is not None and not data.has_nsp:
            raise UserError("next-sentence prediction needs TFRecords from create_pretraining_data; "
                            "raw text input trains masked LM only (--nsp=false)")
        self.train_config = dataclasses.replace(config, train_batch_size=global_batch)  # saved as it ran
        self.settings = {"budget": {k: v for k, v in dataclasses.asdict(budget).items() if k != "num_warmup_steps"},
                         **({"num_warmup_steps": budget.num_warmup_steps} if budget.num_warmup_steps is not None
                            else {}), **config.settings(global_batch), "towers": self.towers.count,
                         "precision": self.policy, **run_dir.encoder_setting(self.fused_encoder),
                         **run_dir.vocab_setting(self.tokenizer.vocab_file), **(settings or {})}
        self.settings["budget"]["finetune_time_markers"] = list(budget.finetune_time_markers)
        run = run_dir.Run(output_dir, self.settings, lambda d, step: self._write_run(d, step, data),
                          config.overwrite, chief=self.towers.is_chief, keep=config.save_total_limit)
        strategy = self.towers.strategy
        with strategy.scope():
            progress = tf.Variable(0.0, trainable=False, name="progress")
            schedule = (schedules.TimeBasedDecay(config.learning_rate, budget.warmup_proportion, budget.curve,
                                                 progress)
                        if budget.lr_schedule == "time" else schedules.WarmupLinearDecay(
                            config.learning_rate, budget.num_train_steps, budget.warmup_steps(), budget.decay_power))
            elapsed_var = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="elapsed_seconds")
        session = Session(self.towers, self.model, run, lambda: optimization.create_optimizer(
            schedule=schedule, weight_decay=config.weight_decay, float16=self.policy == "mixed_float16",
            optimizer=config.optimizer, beta_1=config.beta_1, beta_2=config.beta_2, epsilon=config.epsilon,
            clipnorm=config.clipnorm), self.objective.loss, accum, config.use_xla, recompute=config.recompute,
            state={"heads": pretraining_model.head_checkpoint_objects(self.model), "elapsed_seconds": elapsed_var},
            seed=data.seed)  # the data's seed is the run's (--seed): its order, masks and dropout
        trainer, step = session.trainer, session.start
        if session.restored:
            log.info("resuming from %s at step %d (%.1f s trained)", session.restored, step,
                     float(elapsed_var.numpy()))
        log.info("pretraining: global batch %d = %d towers x %d x %d accumulation steps, from step %d",
                 global_batch, self.towers.count, micro, accum, step)
        hooks = [TimeBudget(budget, progress), *([StepLimit(steps)] if steps is not None else [])]
        if validation is not None:
            steps_per_epoch = lambda: max(1, data.count() // global_batch)  # noqa: E731
            hooks.append(Evaluation(
                lambda: trainer.evaluate(validation.data.dataset(validation.batch_size, training=False),
                                         validation.max_steps),
                lambda loop: validation.interval(budget.progress(loop.step, loop.elapsed()), steps_per_epoch)))
            hooks.append(EarlyStop(budget))
        marker_dir = lambda m: os.path.join(output_dir, "finetune_checkpoints", f"at_{m:g}")  # noqa: E731
        hooks.append(FinetuneMarkers(budget, marker_dir, lambda d, s: self.save_finetune_checkpoint(d, s, data)))

        loop = session.loop(global_batch, config, hooks, callbacks, clock, float(elapsed_var.numpy()),
                            before_save=lambda loop: elapsed_var.assign(loop.elapsed()))
        index, workers = distribute.worker_of(strategy)
        if data.by_files(workers):  # each reads its own files
            rows_each = global_batch // workers
            dataset = data.dataset(rows_each, True, step * rows_each, part=(index, workers))
            mine = worker_files(data.input_files, (index, workers))
            log.info("input sharded by file: this worker reads %d of %d files: %s", len(mine),
                     len(data.input_files), ", ".join(mine))
        else:  # each reads the one stream, and parses and masks only its towers' rows
            mine = (lambda ds: distribute.worker_rows(ds, global_batch, strategy)) if workers > 1 else None
            dataset = data.dataset(global_batch // workers, True, step * global_batch, rows=mine)
            if workers > 1:
                log.info("input sharded by example: every worker reads the %d file(s), each keeps its rows",
                         len(data.input_files))
        reading = contextlib.ExitStack()
        reading.enter_context(data.reading())
        if validation:
            reading.enter_context(validation.data.reading())
        session.train(loop, dataset, worker_part=workers > 1, reading=reading)
        self.stop, self.interrupted, self.trainer, self.global_step = loop.stop, loop.interrupted, trainer, loop.step
        self.history.extend(loop.history)
        log.info("stopped at step %d: %s", loop.step, self.stop)
        return loop.history[-1] if loop.history else {}

    def auto_batch_size(self, global_batch: int, max_seq_length: int, max_predictions_per_seq: int,
                        memory_limit_mb: float | None = None, memory_per_tower_mb: float | None = None,
                        use_xla: bool = False, recompute: bool = False) -> int:
        """Set `micro_batch` (per tower) to the largest that fits (memory.py) and divides the global batch
        into whole accumulation steps; returns it."""
        fits = memory.find_for_model(
            self.towers, self.model, self.policy,
            lambda n: memory.pretraining_batch(n, max_seq_length, max_predictions_per_seq),
            self.objective.loss, memory_limit_mb, memory_per_tower_mb,
            cap=max(1, global_batch // self.towers.count), use_xla=use_xla, recompute=recompute)
        micro = max(m for m in range(1, fits + 1) if global_batch % (m * self.towers.count) == 0)
        log.info("micro-batch %d per tower (%d fits), %d accumulation steps", micro, fits,
                 global_batch // (micro * self.towers.count))
        self.micro_batch = micro
        return micro

    def evaluate(self, data: PretrainingData, batch_size: int = 32, max_steps: int | None = None) -> dict:
        """google-bert's run_pretraining eval results: masked-LM (and NSP) loss and accuracy."""
        trainer = Trainer(self.towers.strategy, self.model, loss_fn=self.objective.loss)
        with data.reading():
            stats = trainer.evaluate(data.dataset(batch_size, training=False), max_steps)
        return dict(self.objective.evaluate(stats))

    def fill_mask(self, texts: str | Sequence[str], top_k: int = 5, batch_size: int = 32,
                  max_seq_length: int = 512) -> list:
        """The `top_k` tokens for each "[MASK]" of a text (a list of them for several texts; a list per
        [MASK] where a text has several): [{"token", "token_str", "score", "sequence"}]. See mlm_scoring."""
        one = isinstance(texts, str)
        out = mlm_scoring.fill_mask(self, [texts] if one else list(texts), top_k, batch_size, max_seq_length)
        out = [o[0] if len(o) == 1 else o for o in out]
        return out[0] if one else out

    def score(self, texts: Sequence[str], batch_size: int = 32, max_seq_length: int = 512) -> list[dict]:
        """Per text: tokens, each one's log-probability and probability masked in turn, the pseudo-log-
        likelihood and pseudo-perplexity; the copies spread over every tower. See mlm_scoring."""
        return mlm_scoring.score(self, list(texts), batch_size, max_seq_length)

    def write_eval_results(self, output_dir, results, global_step):
        return write_eval_results(output_dir, {**results, "global_step": global_step})

    # ------------------------------------------------------------------ outputs
    def export(self, output_dir: str, format: str = "saved_model", max_seq_length: int = 128,
               precision: str = "float32", allow_approximate: bool = False) -> str:
        """Write the encoder and heads as they are now to the new directory output_dir: "saved_model" (raw
        text in, the encoder's outputs out), "hf" (BertForPreTraining, or BertForMaskedLM without NSP),
        "google" (`cls/...` heads) or "keras_hub" (BertBackbone and tokenizer). See `bert_mgpu.io.export`."""
        return export.export_model(self.trained(max_seq_length), output_dir, format, precision, allow_approximate)

    def trained(self, max_seq_length: int = 128) -> Trained:
        """The encoder and heads as they are now, in the shape every export writes."""
        weights = {**checkpoints.encoder_weights(self.model.backbone), **pretraining_model.head_weights(self.model)}
        return Trained("pretrainer", self.config, self.tokenizer.vocab_file, self.tokenizer.do_lower_case,
                       weights, max_seq_length=max_seq_length)

    def save_finetune_checkpoint(self, directory: str, step: int, data: PretrainingData | None = None) -> str:
        """A bert_mgpu directory (encoder + heads, config, vocab) that run_classifier_mgpu.py loads
        (run_dir.save_model_dir). Every worker of several must call it; only the chief's copy is kept."""
        heads = pretraining_model.head_checkpoint_objects(self.model)
        ckpt = run_checkpoint.training_checkpoint(self.model, heads=heads)
        run_dir.save_model_dir(directory, ckpt, step, lambda d, s: self._write_run(d, s, data), self.towers.is_chief)
        log.info("fine-tune checkpoint at step %d: %s", step, directory)
        return directory

    def _write_run(self, directory, step, data=None):
        run = {"kind": "pretrainer", "do_lower_case": self.tokenizer.do_lower_case, "global_step": step,
               "max_seq_length": data.max_seq_length if data else None, "nsp": self.model.nsp_head is not None,
               "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        run_checkpoint.write_run_files(directory, run, self.config, self.tokenizer.vocab_file)
