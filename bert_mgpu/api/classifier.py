"""The notebook API: fine-tune, evaluate and predict with one BERT tower per device.

Example:
    import bert_mgpu
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    clf = bert_mgpu.BertClassifier.from_pretrained("model_dir", labels=["fresh", "rotten"], towers=towers)
    clf.fit(train_examples, output_dir="out", epochs=1, learning_rate=5e-5)
    print(clf.evaluate(dev_examples))            # {'eval_accuracy': ..., 'eval_loss': ..., ...}
    probabilities = clf.predict(test_examples)   # [N, num_labels], in input order

`run_classifier_mgpu.py` is a thin absl-flags wrapper over this class.
"""

import dataclasses
import hashlib
import logging
import math
import os
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from bert_mgpu.api.embeddings import Encoder
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import make_dataset
from bert_mgpu.data.tasks import Example, as_examples
from bert_mgpu.io import checkpoints, export, run_dir
from bert_mgpu.io.loading import open_checkpoint
from bert_mgpu.model.modeling import build_classifier
from bert_mgpu.model.objectives import objective
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory, optimization
from bert_mgpu.train.evaluation import BEST_DIR, BestModel, DevEvaluation, evaluation_every
from bert_mgpu.train.session import Session
from bert_mgpu.train.train_config import TrainConfig
from bert_mgpu.train.training import Trainer

log = logging.getLogger("bert_mgpu")


def examples_digest(examples):
    """sha256 of the examples' text and labels: a resumed run must train on the same data."""
    h = hashlib.sha256()
    for e in examples:
        h.update("\x00".join((e.text_a, e.text_b or "", e.label or "")).encode("utf-8") + b"\x01")
    return h.hexdigest()


def _head_fits(weights, head):
    kernel, bias = weights.get("output_weights"), weights.get("output_bias")
    return kernel is not None and bias is not None and tuple(kernel.T.shape) == tuple(head.kernel.shape) \
        and tuple(bias.shape) == tuple(head.bias.shape)


# GLUE's pair tasks: what a run directory written before bert_mgpu recorded `pairs` was trained on.
PAIR_TASKS = ("mrpc", "mnli", "xnli", "qqp", "qnli", "rte", "wnli", "sts-b")


class BertClassifier:
    """A BERT sentence (or sentence-pair) classifier trained on every tower: google-bert's run_classifier.

    Build it with `from_pretrained`; `fit` fine-tunes (and resumes), `evaluate` gives google-bert's eval
    results plus the task's GLUE metric, `predict` gives class probabilities in input order.

    Args:
        model: the Keras model (`build_classifier`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        labels: the label set, in the order of the logits.
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: longer inputs are truncated.
        task: the task's name (picks the GLUE metric), or None.
        fused_encoder: whether `model` runs the fused encoder (recorded in a run's settings).
        task_type: "classification" (softmax over `labels`) or "regression" (one output, a score,
            mean squared error, Pearson and Spearman; `labels` empty), as STS-B.

    Example:
        towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
        clf = bert_mgpu.BertClassifier.from_pretrained("model_dir", labels=["0", "1"], towers=towers)
        clf.fit(train_examples, output_dir="out", epochs=1)
        clf.evaluate(dev_examples)["eval_accuracy"]
    """

    def __init__(self, model, tokenizer, labels, config, towers, policy, max_seq_length, task=None,
                 fused_encoder=True, task_type="classification"):
        self.model, self.tokenizer, self.labels, self.config = model, tokenizer, list(labels), config
        self.towers, self.policy, self.max_seq_length, self.task = towers, policy, max_seq_length, task
        self.fused_encoder, self.objective = fused_encoder, objective(task_type)  # the head kind: objectives.py
        self.pairs = task in PAIR_TASKS  # whether it reads sentence pairs: what its training data had
        self.threshold = 0.5  # multi_label: the decision threshold
        self.global_step, self.interrupted, self.settings, self.history = 0, None, None, []
        self.trained_steps = 0
        self.stop, self.best_step = None, None  # why the last fit stopped; its best model's step
        self.confusion = None  # the last evaluation's confusion matrix (true x predicted counts)
        self.report = None  # the last evaluation's {label: (precision, recall, F1, support)}
        self.metrics = []  # metrics every evaluation adds (--metrics): see metrics.CLASSIFICATION
        self.train_batch_size = towers.train_batch_size  # per tower, unless fit is given one
        self.train_config = None  # the last fit's TrainConfig, kept in bert_mgpu.json
        self._predictor = Trainer(towers.strategy, model)

    @property
    def task_type(self):
        """classification, regression or multi_label: the name of `self.objective`."""
        return self.objective.name

    @property
    def label_separator(self):
        """multi_label: what separates an example's labels."""
        return self.objective.separator

    @label_separator.setter
    def label_separator(self, separator):
        self.objective.separator = separator

    def _data(self, examples, batch_size, **kwargs):
        return make_dataset(examples, self.tokenizer, self.labels, self.max_seq_length, batch_size,
                            encode_labels=self.objective.encode, **kwargs)

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, labels: Sequence[str] | None = None, towers: Towers | None = None,
                        precision: str = "auto", max_seq_length: int = 128, do_lower_case: bool | None = None,
                        bert_config_file: str | None = None, vocab_file: str | None = None, task: str | None = None,
                        fused_encoder: bool = True, task_type: str | None = None) -> "BertClassifier":
        """A classifier from any checkpoint bert_mgpu reads; only the new classifier head is fresh.

        task_type: "classification" or "regression" (None: what a bert_mgpu run directory was trained for,
        else classification).

        fused_encoder=False runs keras-hub's BertBackbone as it is: the reference the fused encoder is
        tested against, and slower; the variables and checkpoints are the same.
        """
        opened = open_checkpoint(init_checkpoint, towers, precision, do_lower_case, bert_config_file, vocab_file,
                                 max_seq_length, config_alone=True)
        pre, run = opened.pretrained, opened.pretrained.run or {}
        task_type = task_type or run.get("task_type") or pre.task_type or "classification"
        kind = objective(task_type)
        labels = list(labels or run.get("labels") or pre.labels or []) if kind.has_classes else []
        if not labels and kind.has_classes:
            raise UserError("no labels: give the task's labels (from its training data or --labels)")
        model, unused = opened.build(lambda config, policy: build_classifier(config, kind.width(labels), policy,
                                                                             fused=fused_encoder))
        if not opened.has_weights:
            log.warning("no --init_checkpoint: the encoder starts from random weights (%s). Fine-tuning needs a "
                        "pretrained BERT to learn much; run_pretraining_mgpu.py makes one", pre.path)
        if unused:
            log.info("not used by a classifier: %s", ", ".join(unused))
        if pre.kind == "bert_mgpu" and run.get("labels") == labels and \
                run.get("task_type", "classification") == task_type:
            checkpoints.restore_head(model, pre.ckpt_prefix)
            log.info("classifier head restored from %s", pre.ckpt_prefix)
        elif pre.kind != "bert_mgpu" and _head_fits(pre.weights, model.head):
            # As google-bert's run_classifier and transformers do: a head of the right shape is loaded.
            model.head.kernel.assign(pre.weights["output_weights"].T)
            model.head.bias.assign(pre.weights["output_bias"])
            log.info("classifier head loaded from %s", init_checkpoint)
        else:
            log.info("%s head (%s) is freshly initialized", task_type,
                     f"{len(labels)} labels" if labels else "one score")
        clf = cls(model, opened.tokenizer, labels, opened.config, opened.towers, opened.policy, max_seq_length, task,
                  fused_encoder, task_type)
        own = pre.kind == "bert_mgpu" and run.get("kind", "classifier") == "classifier"
        step = pre.checkpoint_step
        clf.global_step = (step if step is not None else int(run.get("global_step", 0))) if own else 0
        clf.pairs = bool(run.get("pairs", clf.pairs))
        clf.label_separator, clf.threshold = run.get("label_separator", ","), run.get("threshold", 0.5)
        return clf

    # ------------------------------------------------------------------ training
    def fit(self, examples: Sequence[Example], output_dir: str, config: TrainConfig | None = None,
            dev: Sequence[Example] | None = None, callbacks: Sequence | None = None, settings: dict | None = None,
            **keywords) -> dict:
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
        `metric_for_best_model` (default the task's: F1 for MRPC, MCC for CoLA, else accuracy) picks the model
        kept in `output_dir/best`; `load_best_model_at_end` leaves that model in `self.model`;
        `early_stopping_patience` evaluations without an improvement above `early_stopping_threshold` stop
        the run.

        Returns the history, as Keras' `History.history`: a list per name, the training records' (`step`,
        `loss`, `learning_rate`, ...) and the evaluations' (`eval_step`, `eval_loss`, `eval_accuracy`, ...).
        """
        config = TrainConfig.make(config, **keywords)
        config.check()
        examples, dev = as_examples(examples), (None if dev is None else as_examples(dev))
        unlabelled = next((e for e in examples if e.label is None), None)
        if unlabelled is not None:
            raise UserError(f"training example {unlabelled.guid} has no label: fit takes Examples, (text, label) "
                            "rows of a DataFrame, or labelled files")
        self.pairs = any(e.text_b is not None for e in examples)
        per_tower, accum = int(config.train_batch_size or self.train_batch_size), config.gradient_accumulation_steps
        global_batch = self.towers.batch(per_tower) * accum
        num_steps = int(len(examples) / global_batch * config.epochs)
        if num_steps < 1:
            raise UserError(f"{len(examples)} training examples make no step at global batch {global_batch} "
                            f"x {config.epochs} epochs")
        if num_steps >= 2**31:
            raise UserError(f"--num_train_epochs={config.epochs} makes {num_steps} steps: more than a run can count")
        self.train_config = dataclasses.replace(config, train_batch_size=per_tower)  # saved as it ran
        self.settings = {
            "train_examples": len(examples), "train_data_sha256": examples_digest(examples),
            **config.settings(per_tower), "towers": self.towers.count,
            "max_seq_length": self.max_seq_length, "labels": self.labels,
            "precision": self.policy, **run_dir.encoder_setting(self.fused_encoder),
            **run_dir.vocab_setting(self.tokenizer.vocab_file),
            **self.objective.settings(), **(settings or {})}
        every = evaluation_every(config.evaluation_strategy, config.eval_every_steps, num_steps / config.epochs)
        if (every or config.load_best_model_at_end or config.early_stopping_patience) and not dev:
            raise UserError("evaluation during training (--evaluation_strategy, --eval_every_steps, "
                            "--load_best_model_at_end, --early_stopping_patience) needs dev examples")
        choice = BestModel(config.metric_for_best_model or self.main_metric, config.greater_is_better,
                           config.early_stopping_patience, config.early_stopping_threshold)
        if every and config.metric_for_best_model:  # before any step: an evaluation of a few examples names its keys
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
            config.learning_rate, num_steps, warmup, float16=self.policy == "mixed_float16"), self.objective.loss,
            accum, config.use_xla)
        start = session.start
        if session.restored:
            log.info("resuming from %s at step %d", session.restored, start)
        if self.towers.is_chief:
            self._write_run(output_dir, start)
        log.info("training: %d examples, %d steps of %d (%d towers x %d x %d accumulation steps), warmup %d, "
                 "from step %d", len(examples), num_steps, global_batch, self.towers.count, per_tower, accum,
                 warmup, start)
        self.interrupted, hooks = None, []
        if every:
            chief = self.towers.is_chief
            watch = DevEvaluation(
                lambda: {k: v for k, v in self.evaluate(dev, config.eval_batch_size, verbose=False).items()
                         if k.startswith("eval_") and k != "eval_examples"},
                every, output_dir, choice, self._save_model_dir,
                tf.summary.create_file_writer(run_dir.check_event_dir(os.path.join(output_dir, "eval"))) if chief
                else tf.summary.create_noop_writer(), chief)
            watch.resume(start)
            hooks.append(watch)
        if start >= num_steps:
            self.global_step = self.trained_steps = start
            run.close()
            return self._finish(hooks, config.load_best_model_at_end, [])
        dataset = self._data(examples, global_batch, training=True, seed=config.seed, source="train").skip(start)
        loop = session.loop(global_batch, config, hooks, callbacks)
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
            best = os.path.join(watch.output_dir, BEST_DIR)
            checkpoints.training_checkpoint(self.model).read(tf.train.latest_checkpoint(best)).expect_partial()
            self.global_step = self.best_step
            log.info("loaded the best model (%s %.4g at step %d) from %s", watch.choice.metric,
                     watch.best[watch.choice.metric], self.best_step, best)
        return history

    @property
    def main_metric(self):
        """The task's metric for the best model: F1 for MRPC, MCC for CoLA, Pearson for a regression,
        micro F1 for multi-label, accuracy otherwise (the objective's)."""
        return self.objective.main_metric(self.task)

    def _save_model_dir(self, directory, step):
        """A loadable model directory of the weights as they are (`best/`): encoder, head, run files."""
        run_dir.save_model_dir(directory, checkpoints.training_checkpoint(self.model), step,
                               lambda d, s: self._write_run(d, s), self.towers.is_chief)

    def auto_batch_size(self, memory_limit_mb: float | None = None, output_dir: str | None = None,
                        memory_per_tower_mb: float | None = None, use_xla: bool = False) -> int:
        """Set `train_batch_size` (per tower) to the largest that fits (see memory.py) and return it.

        A run in output_dir that already found one keeps it, so resuming trains as it started.
        """
        before = ((output_dir and run_dir.read_run(output_dir)) or {}).get("settings") or {}
        if before.get("auto_batch_size") and before.get("per_tower_batch"):
            self.train_batch_size = int(before["per_tower_batch"])
            log.info("auto batch size: %d per tower, as found for %s", before["per_tower_batch"], output_dir)
            return before["per_tower_batch"]
        best = memory.find_for_model(self.towers, self.model, self.policy,
                                     lambda n: memory.classifier_batch(n, self.max_seq_length),
                                     memory_limit_mb=memory_limit_mb, memory_per_tower_mb=memory_per_tower_mb,
                                     use_xla=use_xla)
        self.train_batch_size = best
        return best

    def _write_run(self, output_dir, step):
        """bert_mgpu.json, bert_config.json and vocab.txt: what makes output_dir a loadable checkpoint."""
        run = {"kind": "classifier", "task_type": self.task_type, "labels": self.labels, "pairs": self.pairs,
               **self.objective.run_facts(self.threshold),
               "do_lower_case": self.tokenizer.do_lower_case,
               "max_seq_length": self.max_seq_length, "task": self.task, "global_step": step,
               "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        checkpoints.write_run_files(output_dir, run, self.config, self.tokenizer.vocab_file)

    def export(self, output_dir: str, format: str = "saved_model", precision: str = "float32",
               allow_approximate: bool = False, texts: Sequence[str] | None = None) -> str:
        """Write the model as it is now to the new directory output_dir: "saved_model" (TensorFlow Serving,
        raw text in), "hf" (transformers' BertForSequenceClassification), "google" (google-bert's
        bert_model.ckpt) or "keras_hub" (a BertTextClassifier preset; see `export.write_keras_hub` for
        `allow_approximate` and `texts`). Each reads back through `from_pretrained`."""
        trained = export.from_classifier(self)
        return export.export_model(trained, output_dir, format, precision, allow_approximate, texts)

    # ------------------------------------------------------------------ inference
    def _logits(self, examples, batch_size, source, verbose="auto"):
        if int(batch_size) < 1:
            raise UserError(f"--{source}_batch_size={batch_size}: must be at least 1")
        # Rows padded to a multiple of 8 (or of the batch) per tower: few shapes for the XLA kernels.
        dataset = self._data(examples, self.towers.batch(batch_size), training=False, source=source,
                             rows_multiple=self.towers.batch(math.gcd(batch_size, 8)))
        bar = None
        if verbose is True or (verbose == "auto" and len(examples) >= 1000):
            bar = keras.utils.Progbar(len(examples), unit_name="example")
        return self._predictor.predict_logits(dataset, progress=bar.add if bar else None)

    def predict(self, examples, batch_size: int = 8, verbose="auto") -> np.ndarray:
        """Class probabilities [N, num_labels] for every example, in input order (batch_size per tower);
        for a regression, the scores [N].

        `examples`: `Example`s, plain strings, (text_a, text_b) pairs or a pandas DataFrame (`as_examples`).
        verbose: a progress bar; "auto" shows one for 1,000 examples or more.
        """
        examples = as_examples(examples)
        logits, _ = self._logits(examples, batch_size, "predict", verbose)
        return self.objective.predict(logits)

    def embed(self, texts, pooling: str = "mean", batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings [N, hidden] from this model's encoder (see `embeddings.Encoder.embed`)."""
        return Encoder(self.model.backbone, self.tokenizer, self.towers, self.max_seq_length).embed(
            texts, pooling, batch_size)

    def evaluate(self, examples, batch_size: int = 8, verbose="auto", metrics: Sequence[str] | None = None) -> dict:
        """google-bert's eval results plus the task's GLUE metric (F1 for MRPC, MCC for CoLA) and `metrics`
        (default `self.metrics`: accuracy, f1, f1_macro, f1_micro, mcc, auc, pearson, spearman) as
        `eval_<name>`; examples as `predict` takes them, with labels. Sets `self.confusion` and the
        per-class `self.report`."""
        names = list(self.metrics if metrics is None else metrics)
        self.objective.check_metrics(names)
        examples = as_examples(examples)
        if any(e.label is None for e in examples):
            raise UserError("evaluation examples need labels")
        logits, labels = self._logits(examples, batch_size, "eval", verbose)
        results, self.confusion, self.report = self.objective.evaluate(
            logits, labels, self.labels, task=self.task, names=names, threshold=self.threshold)
        return {**results, "global_step": self.global_step, "eval_examples": len(examples)}
