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

import hashlib
import logging
import math
from collections.abc import Sequence

import numpy as np

from bert_mgpu.api.embeddings import Encoder
from bert_mgpu.api.fine_tuning import FineTuned, prediction_bar
from bert_mgpu.api.opening import open_head
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.doc_windows import check_windows, cut_documents, window_dataset
from bert_mgpu.data.examples import Example, as_examples
from bert_mgpu.data.input_pipeline import check_truncation, make_dataset
from bert_mgpu.data.windows import pool
from bert_mgpu.io import export, run_checkpoint
from bert_mgpu.io.trained import Trained, model_weights
from bert_mgpu.model.modeling import build_classifier
from bert_mgpu.model.objectives import objective
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory

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


class BertClassifier(FineTuned):
    """A BERT sentence (or sentence-pair) classifier trained on every tower: google-bert's run_classifier.

    Build it with `from_pretrained`; `fit` fine-tunes (and resumes: `FineTuned.fit`), `evaluate` gives
    google-bert's eval results plus the task's GLUE metric, `predict` gives class probabilities in input order.

    Args:
        model: the Keras model (`build_classifier`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        labels: the label set, in the order of the logits.
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: longer inputs are truncated.
        truncation: which pieces of a longer text stay: "head" (google-bert's), "tail" or "head+tail"
            (the first quarter of the room and the rest from its end: Sun et al. 2019).
        doc_stride: None, or long texts are read in windows of max_seq_length pieces this many apart, and
            each text's windows pooled into one output (data/doc_windows.py).
        window_pooling: "mean" or "max" of a text's windows' logits.
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
                 fused_encoder=True, task_type="classification", truncation="head", doc_stride=None,
                 window_pooling="mean"):
        super().__init__(model, tokenizer, labels, config, towers, policy, max_seq_length, objective(task_type),
                         fused_encoder)  # the head kind: objectives.py
        self.task, self.truncation = task, check_truncation(truncation)
        self.pairs = task in PAIR_TASKS  # whether it reads sentence pairs: what its training data had
        self.doc_stride, self.window_pooling = doc_stride, window_pooling
        if doc_stride:
            check_windows(max_seq_length, doc_stride, window_pooling, truncation, self.pairs)
            self.unit = "windows"
        self.threshold = 0.5  # multi_label: the decision threshold
        self.confusion = None  # the last evaluation's confusion matrix (true x predicted counts)
        self.metrics = []  # metrics every evaluation adds (--metrics): see metrics.CLASSIFICATION

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
        """Batches of the examples (`make_dataset`), or of their windows with --doc_stride -> (dataset, the
        `Windows` or None)."""
        if self.doc_stride:
            return window_dataset(examples, self.tokenizer, self.labels, self.max_seq_length, self.doc_stride,
                                  batch_size, encode_labels=self.objective.encode, **kwargs)
        return make_dataset(examples, self.tokenizer, self.labels, self.max_seq_length, batch_size,
                            encode_labels=self.objective.encode, truncation=self.truncation, **kwargs), None

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, labels: Sequence[str] | None = None, towers: Towers | None = None,
                        precision: str = "auto", max_seq_length: int = 128, do_lower_case: bool | None = None,
                        bert_config_file: str | None = None, vocab_file: str | None = None, task: str | None = None,
                        fused_encoder: bool = True, task_type: str | None = None,
                        truncation: str | None = None, doc_stride: int | None = None,
                        window_pooling: str | None = None) -> "BertClassifier":
        """A classifier from any checkpoint bert_mgpu reads; only the new classifier head is fresh.

        task_type: "classification" or "regression" (None: what a bert_mgpu run directory was trained for,
        else classification).
        truncation: "head", "tail" or "head+tail" (None: the run directory's, else head).
        doc_stride, window_pooling: windows over long texts (None: the run directory's, else none; mean).

        fused_encoder=False runs keras-hub's BertBackbone as it is: the reference the fused encoder is
        tested against, and slower; the variables and checkpoints are the same.
        """
        opening = open_head("classifier", init_checkpoint, None, max_seq_length, towers=towers, precision=precision,
                            do_lower_case=do_lower_case, bert_config_file=bert_config_file, vocab_file=vocab_file)
        opened, own = opening.opened, opening.own  # another head's run (a tagger's, ...): its encoder alone
        pre = opened.pretrained
        run = opening.run
        task_type = task_type or run.get("task_type") or pre.task_type or "classification"
        kind = objective(task_type)
        labels = list(labels or run.get("labels") or pre.labels or []) if kind.has_classes else []
        if not labels and kind.has_classes:
            raise UserError("no labels: give the task's labels (from its training data or --labels)")
        model = opening.build(lambda config, policy: build_classifier(config, kind.width(labels), policy,
                                                                      fused=fused_encoder))
        unused = opening.unused
        if unused:
            log.info("not used by a classifier: %s", ", ".join(unused))
        if pre.layout == "bert_mgpu" and run.get("labels") == labels and \
                run.get("task_type", "classification") == task_type:
            run_checkpoint.restore_head(model, pre.ckpt_prefix)
            log.info("classifier head restored from %s", pre.ckpt_prefix)
        elif pre.layout != "bert_mgpu" and _head_fits(pre.weights, model.head):
            # As google-bert's run_classifier and transformers do: a head of the right shape is loaded.
            model.head.kernel.assign(pre.weights["output_weights"].T)
            model.head.bias.assign(pre.weights["output_bias"])
            log.info("classifier head loaded from %s", init_checkpoint)
        else:
            log.info("%s head (%s) is freshly initialized", task_type,
                     f"{len(labels)} labels" if labels else "one score")
        doc_stride = doc_stride or run.get("doc_stride")
        if not doc_stride and window_pooling:
            raise UserError(f"--window_pooling={window_pooling} needs --doc_stride: it pools a text's windows")
        clf = cls(model, opened.tokenizer, labels, opened.config, opened.towers, opened.policy, max_seq_length, task,
                  fused_encoder, task_type, truncation or run.get("truncation", "head"), doc_stride,
                  window_pooling or run.get("window_pooling", "mean"))
        step = pre.checkpoint_step
        clf.global_step = (step if step is not None else int(run.get("global_step", 0))) if own else 0
        clf.pairs = bool(run.get("pairs", clf.pairs))
        clf.label_separator, clf.threshold = run.get("label_separator", ","), run.get("threshold", 0.5)
        return clf

    # ------------------------------------------------------------------ what fit asks of a head
    def _training_data(self, examples):
        examples = as_examples(examples)
        unlabelled = next((e for e in examples if e.label is None), None)
        if unlabelled is not None:
            raise UserError(f"training example {unlabelled.guid} has no label: fit takes Examples, (text, label) "
                            "rows of a DataFrame, or labelled files")
        examples = self._with_unlabelled(examples)
        self.pairs = any(e.text_b is not None for e in examples)
        if not self.doc_stride:
            return (examples, None), len(examples), examples_digest(examples)
        check_windows(self.max_seq_length, self.doc_stride, self.window_pooling, self.truncation, self.pairs)
        windows = cut_documents(self.tokenizer, [e.text_a for e in examples], self.max_seq_length, self.doc_stride)
        log.info("%d texts in %d windows of up to %d pieces, %d apart", len(examples), len(windows.lengths),
                 self.max_seq_length, self.doc_stride)
        return (examples, windows), len(windows.lengths), examples_digest(examples)

    def unlabelled_rows(self, rows):
        examples = []
        for i, e in enumerate(as_examples(rows)):
            if e.label is not None:
                raise UserError(f"unlabeled example {e.guid} has a label ({e.label!r}): labelled rows are fit's "
                                "examples")
            if (e.text_b is not None) != bool(self.pairs):
                raise UserError(f"unlabeled example {e.guid} is {'a pair' if e.text_b is not None else 'one text'}"
                                f"; the teacher reads {'pairs' if self.pairs else 'one text'}")
            examples.append(Example(f"unlabeled-{i}", e.text_a, e.text_b))
        return examples

    def with_encoder(self, config):
        with self.towers.strategy.scope():
            model = build_classifier(config, self.objective.width(self.labels), self.policy, fused=self.fused_encoder)
        out = BertClassifier(model, self.tokenizer, self.labels, config, self.towers, self.policy,
                             self.max_seq_length, task=self.task, fused_encoder=self.fused_encoder,
                             task_type=self.task_type, truncation=self.truncation, doc_stride=self.doc_stride,
                             window_pooling=self.window_pooling)
        out.pairs, out.label_separator, out.threshold = self.pairs, self.label_separator, self.threshold
        return out

    def _label_counts(self, data):
        ids = {label: i for i, label in enumerate(self.labels)}
        return np.bincount([ids[e.label] for e in data[0] if e.label in ids], minlength=len(self.labels))

    def _train_dataset(self, data, global_batch, seed, buckets=False):
        examples, windows = data
        kwargs = {"windows": windows} if windows is not None else {}
        return self._data(examples, global_batch, training=True, seed=seed, source="train", buckets=buckets,
                          **kwargs)[0]

    def _rows_dataset(self, data, global_batch, rows_multiple):
        examples, windows = data
        kwargs = {"windows": windows} if windows is not None else {}
        return self._data(examples, global_batch, training=False, source="train", rows_multiple=rows_multiple,
                          **kwargs)[0]

    def _as_dev(self, dev):
        return as_examples(dev)

    def _head_settings(self):
        return {**self.objective.settings(), **({"truncation": self.truncation} if self.truncation != "head" else {}),
                **self._window_facts()}

    def _window_facts(self):
        return {"doc_stride": self.doc_stride, "window_pooling": self.window_pooling} if self.doc_stride else {}

    def _probe_batch(self, global_batch):
        return memory.classifier_batch(global_batch, self.max_seq_length)

    @property
    def main_metric(self):
        """The task's metric for the best model: F1 for MRPC, MCC for CoLA, Pearson for a regression,
        micro F1 for multi-label, accuracy otherwise (the objective's)."""
        return self.objective.main_metric(self.task)

    def _write_run(self, output_dir, step):
        """bert_mgpu.json, bert_config.json and vocab.txt: what makes output_dir a loadable checkpoint."""
        run = {"kind": "classifier", "task_type": self.task_type, "labels": self.labels, "pairs": self.pairs,
               **self.objective.run_facts(self.threshold),
               "do_lower_case": self.tokenizer.do_lower_case,
               "max_seq_length": self.max_seq_length, "truncation": self.truncation, **self._window_facts(),
               "task": self.task,
               "global_step": step,
               "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        run_checkpoint.write_run_files(output_dir, run, self.config, self.tokenizer.vocab_file)

    def export(self, output_dir: str, format: str = "saved_model", precision: str = "float32",
               allow_approximate: bool = False, texts: Sequence[str] | None = None) -> str:
        """Write the model as it is now to the new directory output_dir: "saved_model" (TensorFlow Serving,
        raw text in), "hf" (transformers' BertForSequenceClassification), "google" (google-bert's
        bert_model.ckpt) or "keras_hub" (a BertTextClassifier preset; see `export.write_keras_hub` for
        `allow_approximate` and `texts`). Each reads back through `from_pretrained`."""
        return export.export_model(self.trained(), output_dir, format, precision, allow_approximate, texts)

    def trained(self) -> Trained:
        """The classifier as it is now, in the one shape every export writes."""
        return Trained("classifier", self.config, self.tokenizer.vocab_file, self.tokenizer.do_lower_case,
                       model_weights(self.model), list(self.labels), self.task_type, self.max_seq_length,
                       bool(self.pairs), truncation=self.truncation, facts=self._window_facts())

    # ------------------------------------------------------------------ inference
    def _logits(self, examples, batch_size, source, verbose="auto"):
        if int(batch_size) < 1:
            raise UserError(f"--{source}_batch_size={batch_size}: must be at least 1")
        # Rows padded to a multiple of 8 (or of the batch) per tower: few shapes for the XLA kernels.
        dataset, windows = self._data(examples, self.towers.batch(batch_size), training=False, source=source,
                                      rows_multiple=self.towers.batch(math.gcd(batch_size, 8)))
        rows = len(examples) if windows is None else len(windows.lengths)
        bar = prediction_bar(rows, "example" if windows is None else "window", verbose)
        logits, labels = self._predictor.predict_logits(dataset, progress=bar.add if bar else None)
        if windows is None:
            return logits, labels
        first = np.r_[0, np.cumsum(windows.count)[:-1]]  # each text's first window: its label
        return pool(logits, windows.doc_of, len(examples), self.window_pooling), labels[first]

    def predict(self, examples, batch_size: int = 8, verbose="auto") -> np.ndarray:
        """Class probabilities [N, num_labels] for every example, in input order (batch_size per tower);
        for a regression, the scores [N].

        `examples`: `Example`s, plain strings, (text_a, text_b) pairs or a pandas DataFrame (`as_examples`).
        verbose: a progress bar; "auto" shows one for 1,000 examples or more, in a terminal or notebook.
        """
        examples = as_examples(examples)
        logits, _ = self._logits(examples, batch_size, "predict", verbose)
        return self.objective.predict(logits)

    def embed(self, texts, pooling: str = "mean", batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings [N, hidden] from this model's encoder (see `embeddings.Encoder.embed`)."""
        return Encoder(self.model.backbone, self.tokenizer, self.towers, self.max_seq_length).embed(
            texts, pooling, batch_size)

    def _reading(self):
        return {"label_names": self.labels, "task": self.task, "metric_names": tuple(self.metrics),
                "threshold": self.threshold}

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
        results = self.reader(metric_names=names).evaluate(logits, labels)
        self.confusion, self.report = results.confusion, results.report
        return {**results, "global_step": self.global_step, "eval_examples": len(examples)}
