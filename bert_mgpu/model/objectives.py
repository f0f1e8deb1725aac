"""What a sentence head kind means: one `Objective` (objective.py, the seam) each for classification,
regression and multi-label here; token classification's (NER, with or without a CRF) in tagging_objectives.py,
pretraining's (masked LM, with or without next-sentence prediction) in mlm_objective.py, and each other head's
beside its model.

Every objective owns the training loss, the metric a run is judged by and the architecture a Hugging Face
export names. A sentence head's (`SentenceObjective`) also owns its head's width, how a label cell is checked
and encoded, the evaluation's numbers, how logits become predictions, the prediction files, the Hugging Face
label facts and the SavedModel's outputs. Everything else (the encoder, the towers, the session, checkpoints)
is shared, so a new head kind (spans, multiple choice) is a new objective and its reader.
`objective(name)` is the one place a --task_type string is read.

Every objective reads a head's outputs through the same two calls, `evaluate(outputs, targets)` (a dict of
`eval_*` numbers, with `report` and `confusion` beside them) and `prediction_files(predictions, rows)` ({file
name: text}); what a kind needs besides (label names, a threshold, a file format) it is given once by
`read_as`, which returns a copy that reads that way.

Example:
    obj = objective("multi_label")
    loss, _ = obj.loss(model, features, labels)
    reader = obj.read_as(label_names=["a", "b"], threshold=0.5)
    reader.evaluate(logits, obj.encode(dev, ["a", "b"]))["eval_f1_micro"]
    files = reader.prediction_files(obj.predict(logits), test)     # test: the rows, with their guids
"""


import math

import keras
import numpy as np
import tensorflow as tf

from bert_mgpu.core import metrics, prediction_files
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.distillation import soft_cross_entropy
from bert_mgpu.model.objective import Evaluation, Objective, focal, label_maps
from bert_mgpu.model.rdrop import symmetric_kl


def is_number(text):
    """A finite number: "nan" and "inf" are no score, and a class named so stays a class."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


class SentenceObjective(Objective):
    """A head on the whole sequence, one label cell an example: what classification, regression and
    multi-label fill in. `name` is its --task_type; `separator` (multi-label only) splits a label cell."""

    problem_type = None  # Hugging Face's config.problem_type
    has_classes = True  # labels name classes (a regression's are scores)
    reading = ("label_names", "task", "metric_names", "threshold", "predict_format")
    label_names, task, metric_names, threshold, predict_format = (), None, (), 0.5, "label"

    def __init__(self, separator=","):
        self.separator = separator

    # ---------------------------------------------------------------- labels
    def width(self, labels):
        """The head's number of outputs."""
        return max(len(labels), 1)

    def label_set(self, examples):
        """The sorted labels the training examples hold."""
        return sorted({e.label for e in examples if e.label is not None})

    def check_label(self, label, known):
        """What is wrong with one label cell (`known`: the label list, or None while it is not), or None."""
        if known is not None:
            return None if label in known else f"label {label!r} is not one of {', '.join(known)}"
        if is_number(label) and float(label) != int(float(label)):
            return (f"label {label!r} is a score, not a class; pass --task_type=regression (or --labels to take "
                    "such labels as classes)")
        return None

    def empty_label_allowed(self):
        return False

    def run_facts(self, threshold):
        """What a run directory records beside its labels for this head kind to be read back the same."""
        return {}

    def encode(self, examples, label_list, source="data"):
        """The examples' labels as the loss takes them: class ids (-1 for none)."""
        ids = {label: i for i, label in enumerate(label_list or [])}
        out = []
        for e in examples:
            if e.label is not None and e.label not in ids:
                raise UserError(f"{source}: example {e.guid} has label {e.label!r}, not one of "
                                f"{', '.join(label_list)}")
            out.append(-1 if e.label is None else ids[e.label])
        return np.array(out, np.int32).reshape(len(examples))

    # ---------------------------------------------------------------- training and evaluation
    def loss(self, model, features, labels, training=True):
        """Mean of `example_losses` on the model's float32 outputs; no extra statistics. A batch of a long
        document's windows (data/doc_windows.py) carries `window_weight`, each window's share of its
        document: the mean is then weighted so that each document counts once, however many windows it has."""
        weight = features.get("window_weight")
        if weight is not None:
            features = {k: v for k, v in features.items() if k != "window_weight"}
        losses = self.example_losses(model(features, training=training), labels)
        return tf.reduce_mean(losses if weight is None else losses * tf.cast(weight, losses.dtype)), {}

    def example_losses(self, logits, labels):
        """Each row's loss [batch]: cross-entropy of the classifier's float32 logits."""
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    def evaluate(self, outputs, targets):
        """Logits [N, labels] against the label ids (`encode`'s): the loss, accuracy, the task's GLUE metric
        and `metric_names` (--metrics); the per-class report and the confusion matrix beside them."""
        results, confusion, report = metrics.classification_results(outputs, targets, self.label_names, self.task,
                                                                    self.metric_names)
        return Evaluation(results, report, confusion)

    def main_metric(self, task=None):
        """The metric the best model is chosen by: F1 for MRPC and QQP, MCC for CoLA, else accuracy."""
        return metrics.TASK_METRICS.get(task, ("eval_accuracy",))[0]

    def check_metrics(self, names):
        """UserError for a --metrics name that is unknown or does not fit this head kind."""
        for name in names or ():
            if name not in metrics.CLASSIFICATION:
                raise UserError(f"--metrics={name}: expected some of {', '.join(metrics.CLASSIFICATION)}")

    # ---------------------------------------------------------------- distillation (distillation.py)
    distillable = True

    def labelled(self, labels):
        """(whether each row has a label [batch], the labels with the others' filled in for the head's loss):
        `encode` marks a row without one (-1 for a class)."""
        has = labels >= 0
        return has, tf.where(has, labels, tf.zeros_like(labels))

    def soft_loss(self, student, teacher, temperature):
        """Distillation's soft term of each row, the student's logits against the teacher's: Hinton's
        tempered cross-entropy x T^2 for a softmax."""
        return soft_cross_entropy(student, teacher, temperature)

    def hard_part(self, features, labels):
        """(features, labels) for the head's loss in a distillation: a row without a label weighs 0 in the
        mean (`window_weight`, x 1.0 for the others: the head's loss exactly as without it)."""
        has, filled = self.labelled(labels)
        weight = features.get("window_weight")
        mask = tf.cast(has, tf.float32) * (1.0 if weight is None else tf.cast(weight, tf.float32))
        return {**features, "window_weight": mask}, filled

    def soft_term(self, student, teacher, labels, temperature, features):
        """Distillation's soft loss of a batch: the mean of `soft_loss` over the rows, labelled or not, a long
        document's windows weighted as its hard loss weighs them."""
        rows = self.soft_loss(student, teacher, temperature)
        weight = features.get("window_weight")
        return tf.reduce_mean(rows if weight is None else rows * tf.cast(weight, rows.dtype))

    # ---------------------------------------------------------------- predictions and exports
    def predict(self, logits):
        """Logits -> what `predict` returns: class probabilities [N, labels]."""
        return tf.nn.softmax(logits).numpy()

    def prediction_files(self, predictions, rows):
        """test_results.tsv (probabilities), predict.txt (a label a line, or its index with
        predict_format="index", bert-ad's two forms) and predictions.tsv (id, label, probabilities)."""
        return prediction_files.classes(predictions, self.label_names, _guids(rows), self.predict_format)

    def hf_architecture(self, weights):
        return "BertForSequenceClassification"

    def hf_facts(self, labels):
        """config.json's problem_type, id2label and label2id, as Hugging Face writes them."""
        return {"problem_type": self.problem_type, **label_maps(labels)}

    def serving(self, logits, labels):
        """The SavedModel's outputs from the head's logits (`labels`: a string tensor of the label names)."""
        ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"probabilities": tf.nn.softmax(logits), "label_ids": ids, "labels": tf.gather(labels, ids)}

    def outputs(self, logits):
        """The head's logits as the numbers a user compares (probabilities; scores for a regression)."""
        return tf.nn.softmax(logits)


def _guids(rows):
    """The rows' ids, as the prediction files name them (rows may be the ids themselves)."""
    return [getattr(r, "guid", r) for r in rows]


class Classification(SentenceObjective):
    """One class an example (softmax over the labels): google-bert's run_classifier."""

    name, problem_type = "classification", "single_label_classification"
    weighable = softmax_outputs = True

    def example_losses(self, logits, labels):
        return focal(super().example_losses(logits, labels), labels, self.class_weights, self.focal_gamma)

    def divergence(self, first, second, labels):
        return tf.reduce_mean(symmetric_kl(first, second))

    def settings(self):
        return {}  # what run directories recorded before the other kinds existed: resumed as they were


class Regression(SentenceObjective):
    """A score an example (STS-B's similarity): one output, mean squared error, Pearson and Spearman."""

    name, problem_type, has_classes = "regression", "regression", False

    def width(self, labels):
        return 1

    def label_set(self, examples):
        return []

    def check_label(self, label, known):
        return None if is_number(label) else f"label {label!r} is not a finite number (--task_type=regression)"

    def encode(self, examples, label_list, source="data"):
        out = []
        for e in examples:
            try:
                out.append(np.nan if e.label is None else float(e.label))
            except ValueError:
                raise UserError(f"{source}: example {e.guid} has label {e.label!r}, not a number") from None
        return np.array(out, np.float32).reshape(len(examples))

    def example_losses(self, logits, labels):
        """Squared error of the model's one float32 output."""
        scores = logits[:, 0]
        return tf.square(scores - tf.cast(labels, scores.dtype))

    def labelled(self, labels):
        has = tf.logical_not(tf.math.is_nan(labels))  # `encode`'s NaN: no score
        return has, tf.where(has, labels, tf.zeros_like(labels))

    def soft_loss(self, student, teacher, temperature):
        """The squared difference of the two scores (a score has no temperature: TextBrewer's MSE)."""
        return tf.square(tf.cast(student[:, 0], tf.float32) - tf.cast(teacher[:, 0], tf.float32))

    def evaluate(self, outputs, targets):
        return Evaluation(metrics.regression_results(outputs, targets, self.metric_names)[0])

    def main_metric(self, task=None):
        return "eval_pearson"

    def check_metrics(self, names):
        super().check_metrics(names)
        for name in names or ():
            if name not in metrics.REGRESSION:
                raise UserError(f"--metrics={name}: a regression has scores, not classes "
                                f"({', '.join(metrics.REGRESSION)})")

    def predict(self, logits):
        return np.asarray(logits)[:, 0]

    def prediction_files(self, predictions, rows):
        """A score a line (test_results.tsv, predict.txt) and predictions.tsv with its id."""
        return prediction_files.scores(predictions, _guids(rows))

    def hf_facts(self, labels):
        return {"problem_type": "regression", "id2label": {"0": "score"}, "label2id": {"score": 0}}

    def serving(self, logits, labels):
        return {"scores": logits[:, 0]}

    def outputs(self, logits):
        return logits


class MultiLabel(SentenceObjective):
    """Any set of labels an example (a sigmoid each, binary cross-entropy); a label cell holds them
    separated by `separator`, and an empty cell is the empty set."""

    name, problem_type = "multi_label", "multi_label_classification"

    def _parts(self, label):
        return [p.strip() for p in (label or "").split(self.separator) if p.strip()]

    def label_set(self, examples):
        return sorted({p for e in examples for p in self._parts(e.label)})

    def check_label(self, label, known):
        unknown = [p for p in self._parts(label) if known is not None and p not in known]
        return f"label {unknown[0]!r} is not one of {', '.join(known)}" if unknown else None

    def empty_label_allowed(self):
        return True

    def run_facts(self, threshold):
        return {"label_separator": self.separator, "threshold": threshold}

    def encode(self, examples, label_list, source="data"):
        ids = {label: i for i, label in enumerate(label_list or [])}
        rows = np.zeros((len(examples), len(ids)), np.float32)
        for n, e in enumerate(examples):
            if e.label is None:  # no label (an empty cell is the empty set): never a target
                rows[n] = -1.0
            for part in self._parts(e.label):
                if part not in ids:
                    raise UserError(f"{source}: example {e.guid} has label {part!r}, not one of "
                                    f"{', '.join(label_list)}")
                rows[n, ids[part]] = 1.0
        return rows

    def example_losses(self, logits, labels):
        """Binary cross-entropy of each label's float32 logit, averaged over the labels."""
        return keras.losses.binary_crossentropy(tf.cast(labels, logits.dtype), logits, from_logits=True)

    def labelled(self, labels):
        has = tf.reduce_all(labels >= 0, -1)  # `encode`'s row of -1: no label
        return has, tf.where(labels >= 0, labels, tf.zeros_like(labels))

    def soft_loss(self, student, teacher, temperature):
        """Each label's binary cross-entropy of the student's tempered sigmoid against the teacher's, averaged
        over the labels as the hard loss is, x T^2."""
        t = tf.cast(temperature, tf.float32)
        targets = tf.sigmoid(tf.cast(teacher, tf.float32) / t)
        return keras.losses.binary_crossentropy(targets, tf.cast(student, tf.float32) / t, from_logits=True) * t * t

    def evaluate(self, outputs, targets):
        results, _, report = metrics.multi_label_results(outputs, targets, self.label_names, self.threshold)
        return Evaluation(results, report)

    def main_metric(self, task=None):
        return "eval_f1_micro"

    def check_metrics(self, names):
        super().check_metrics(names)
        for name in names or ():
            raise UserError(f"--metrics={name}: a multi-label task reports exact-match accuracy and micro and "
                            "macro F1 (--threshold)")

    def predict(self, logits):
        return tf.sigmoid(logits).numpy()

    def prediction_files(self, predictions, rows):
        """Each label's probability (test_results.tsv), the labels above `threshold` joined by the separator
        (predict.txt; an empty line for none), and predictions.tsv."""
        return prediction_files.label_sets(predictions, self.label_names, _guids(rows), self.threshold,
                                           self.separator)

    def serving(self, logits, labels):
        return {"probabilities": tf.sigmoid(logits)}  # each label's own probability

    def outputs(self, logits):
        return tf.sigmoid(logits)


KINDS = {kind.name: kind for kind in (Classification, Regression, MultiLabel)}  # the --task_type choices


def objective(name, separator=","):
    """The objective of a --task_type: classification, regression or multi_label."""
    if name not in KINDS:
        raise UserError(f"--task_type={name}: expected {', '.join(KINDS)}")
    return KINDS[name](separator)
