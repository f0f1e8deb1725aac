"""The seam every head kind fills in: `Objective` (its loss, the metric a run is judged by, the architecture a
Hugging Face export names, how its outputs are read), `Evaluation` (what `evaluate` returns), and the loss
weighting the softmax heads share (`focal`, `label_weights`). The kinds: objectives.py (classification,
regression, multi-label), tagging_objectives.py, span_objectives.py, choice_objectives.py, mlm_objective.py,
global_pointer_objective.py.

Example (a new kind fills in what its script and the session call):
    class Spans(Objective):
        name = "spans"

        def loss(self, model, features, labels, training=True):
            ...  # -> (mean loss, {name: statistic})

        def evaluate(self, outputs, targets):
            return Evaluation({"eval_f1": ...})
"""

import copy

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError


def label_maps(labels):
    """config.json's id2label and label2id for a label list, as Hugging Face writes them."""
    return {"id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)}}


class Evaluation(dict):
    """`Objective.evaluate`'s answer: the evaluation's numbers ({"eval_f1": ...}), and beside them what a head
    reports per class or entity type (`report`: {name: (precision, recall, F1, support)}) and a classifier's
    confusion matrix (`confusion`), None where a head has none."""

    def __init__(self, numbers, report=None, confusion=None):
        super().__init__(numbers)
        self.report, self.confusion = report, confusion


class Objective:
    """What every head kind has: the loss the session trains with, the metric a run is judged by, the
    architecture a Hugging Face export names, and how its outputs are read: `evaluate(outputs, targets)` and
    `prediction_files(predictions, rows)`, the same two calls for every kind, with the settings in `reading`
    given by `read_as`."""

    name = None
    reading = ()  # the settings `evaluate` and `prediction_files` read (attributes with their defaults)

    def read_as(self, **settings):
        """A copy of this objective that reads outputs with `settings` (names in `reading`): the head's label
        names, a decision threshold, a file format."""
        unknown = sorted(set(settings) - set(self.reading))
        if unknown:
            raise TypeError(f"a {self.name} objective reads no {', '.join(unknown)} (it reads "
                            f"{', '.join(self.reading) or 'nothing besides its arguments'})")
        out = copy.copy(self)
        for name, value in settings.items():
            setattr(out, name, value)
        return out

    def evaluate(self, outputs, targets) -> Evaluation:
        """The evaluation of the head's `outputs` (what its model gives, gathered over the set) against the
        `targets` (the right answers, in the form the outputs are compared with)."""
        raise NotImplementedError

    def prediction_files(self, predictions, rows) -> dict:
        """{file name: text}: the files a script's --do_predict writes, from `predictions` (what the head's
        `predict` returns) of `rows` (the examples, sentences or questions predicted, in order)."""
        raise NotImplementedError

    def loss(self, model, features, labels, training=True):
        """`model`'s loss on a batch -> (mean loss, {name: statistic}), traced on each tower."""
        raise NotImplementedError

    def main_metric(self, task=None):
        """The evaluation result the best model is chosen by."""
        raise NotImplementedError

    def settings(self):
        """What a resumed run compares for the head kind (run_dir.Run's settings)."""
        return {"task_type": self.name}

    weighable = False  # a softmax over classes: its training loss takes class weights and a focal gamma
    class_weights, focal_gamma = None, 0.0

    def reweighted(self, class_weights=None, focal_gamma=0.0):
        """A copy of this objective whose training loss is weighted by label and focused (`focal`)."""
        if not self.weighable:
            raise UserError(f"--class_weights and --focal_gamma weigh a softmax over classes (classification, a "
                            f"tagger without --crf); not a {self.name} head's loss")
        out = copy.copy(self)
        out.class_weights, out.focal_gamma = class_weights, focal_gamma
        return out

    softmax_outputs = False  # a softmax over classes: R-Drop compares two passes' (rdrop.py)

    def check_rdrop(self):
        """UserError unless R-Drop's `divergence` is defined for this head's outputs."""
        if not self.softmax_outputs:
            raise UserError(f"--rdrop_alpha compares two passes' softmax over classes (classification, a tagger "
                            f"without --crf); not a {self.name} head's outputs")

    def divergence(self, first, second, labels):
        """R-Drop's term (rdrop.py): the mean over examples of the symmetric KL divergence between two passes'
        outputs."""
        raise NotImplementedError

    distillable = False  # has a soft loss (`soft_loss`, `labelled`): a Distiller's teacher and student

    def hf_architecture(self, weights):
        """transformers' class for a model with these weights ({google-bert name: array})."""
        raise NotImplementedError


def focal(per, labels, class_weights=None, focal_gamma=0.0):
    """Cross-entropies `per` (of the labels `labels`) weighted by their label's weight and focused (Lin et al.
    2017): per x (1 - p)^gamma x weight, p = exp(-per) the label's probability. Each row keeps its place in
    the caller's mean, so the towers' losses average as before."""
    if focal_gamma:  # 1 - p as -expm1(-per): exact where p is near 1; kept off 0, where (.)^gamma has no slope
        per = per * tf.pow(tf.maximum(-tf.math.expm1(-per), 1e-12), tf.cast(focal_gamma, per.dtype))
    if class_weights is not None:
        per = per * tf.gather(tf.constant(class_weights, per.dtype), labels)
    return per


def label_weights(counts):
    """--class_weights=auto from each label's training count: examples / (labels x count), scikit-learn's
    "balanced" (a label never seen: 1)."""
    counts = np.asarray(counts, np.float64)
    return tuple(float(counts.sum() / (len(counts) * c)) if c else 1.0 for c in counts)
