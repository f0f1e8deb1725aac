"""Multiple choice's objective (SWAG, C3, CHID): a score a choice, softmax over a question's choices, accuracy.
See objective.py for the seam; the model is modeling.build_choice_model, the data data/choice_input.py.

Example:
    kind = MultipleChoice()
    loss, stats = kind.loss(model, features, labels)        # labels [batch]: the right choice's index
    kind.evaluate(scores, labels)                           # {"eval_accuracy", "eval_loss"}
    kind.read_as(submission="c3").prediction_files(probabilities, questions)
"""


import numpy as np
import tensorflow as tf

from bert_mgpu.core import prediction_files
from bert_mgpu.model.kernels import sparse_xent
from bert_mgpu.model.objective import Evaluation, Objective


def _log_softmax(scores):
    scores = np.asarray(scores, np.float64)
    top = scores.max(-1, keepdims=True)
    return scores - top - np.log(np.exp(scores - top).sum(-1, keepdims=True))


class MultipleChoice(Objective):
    """Cross-entropy of the right choice under a softmax over the question's choices (transformers'
    BertForMultipleChoice); padded choices score -1e4 in the model, so they take no share."""

    name = "multiple_choice"
    reading = ("submission",)  # a CLUE task's name ("c3", "chid"): its leaderboard file too
    submission = None

    def loss(self, model, features, labels, training=True):
        """(mean cross-entropy, {"accuracy"}) of a batch; labels [batch]."""
        scores = model(features, training=training)
        right = tf.equal(tf.argmax(scores, -1, output_type=labels.dtype), labels)
        return tf.reduce_mean(sparse_xent(labels, scores)), {"accuracy": tf.reduce_mean(tf.cast(right, tf.float32))}

    def evaluate(self, outputs, targets):
        """Scores [questions, choices] against the right choices -> eval_accuracy, eval_loss."""
        labels = np.asarray(targets)
        log_p = _log_softmax(outputs)
        return Evaluation({"eval_accuracy": float(np.mean(log_p.argmax(-1) == labels)),
                           "eval_loss": float(-np.mean(log_p[np.arange(len(labels)), labels]))})

    def main_metric(self, task=None):
        return "eval_accuracy"

    def predict(self, scores, sizes):
        """Scores -> each question's probabilities over its own choices (`sizes`: how many it has)."""
        return [np.exp(_log_softmax(row[:n])) for row, n in zip(np.asarray(scores), sizes)]

    def prediction_files(self, predictions, rows):
        """{file name: text}: predictions.jsonl (id, the chosen index and text, every choice's probability),
        predict.txt (the chosen index a line) and, for CLUE's data, its leaderboard file: c311_predict.json
        (C3: {"id", "label"} lines) or chid11_predict.json (CHID: {blank: index})."""
        return prediction_files.choices(rows, predictions, self.submission)

    def hf_architecture(self, weights):
        return "BertForMultipleChoice"

    def hf_facts(self, labels):
        return {}
