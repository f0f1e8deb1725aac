"""GlobalPointer's objective (global_pointer.py): every span of every type is a yes-or-no question, trained
with Su's multi-label categorical cross-entropy (bert4keras' `multilabel_categorical_crossentropy`) and
scored by exact entities (type and both ends), as conlleval scores a tagger's, nested ones included.

A batch's labels are its windows' entities [batch, entities, 3]: (type, start, end) positions in the window,
both ends inclusive, rows of -1 where a window has fewer entities than the widest.

Example:
    kind = GlobalPointerObjective()
    loss, stats = kind.loss(model, features, labels)            # stats: the batch's span F1 at score 0
    results = kind.evaluate(predicted, true)                    # each sentence's {(type, start, end)}
"""

import tensorflow as tf

from bert_mgpu.core import prediction_files
from bert_mgpu.core.entities import span_scores
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.objective import Evaluation, Objective, label_maps

BIG = 1e12


def multilabel_crossentropy(targets, scores):
    """Su's loss over each row of `scores` [rows, n] with 0/1 `targets`: log(1 + sum over negatives of
    e^s) + log(1 + sum over positives of e^-s), which asks every positive above 0 and every negative below
    it without a softmax over the row's (mostly negative) classes -> [rows]."""
    signed = (1.0 - 2.0 * targets) * scores  # a positive's score negated
    zero = tf.zeros_like(scores[:, :1])
    negatives = tf.concat([signed - targets * BIG, zero], -1)
    positives = tf.concat([signed - (1.0 - targets) * BIG, zero], -1)
    return tf.reduce_logsumexp(negatives, -1) + tf.reduce_logsumexp(positives, -1)


def span_targets(labels, shape):
    """The 0/1 targets [batch, types, length, length] of `labels` [batch, entities, 3] (-1 rows skipped)."""
    labels = tf.cast(labels, tf.int32)
    rows = tf.broadcast_to(tf.range(tf.shape(labels)[0])[:, None], tf.shape(labels)[:2])
    at = tf.concat([rows[..., None], labels], -1)
    at = tf.boolean_mask(at, labels[..., 0] >= 0)
    return tf.tensor_scatter_nd_max(tf.zeros(shape, tf.float32), at, tf.ones(tf.shape(at)[:1], tf.float32))


class GlobalPointerObjective(Objective):
    """Entities as scored spans (global_pointer.py): the loss over every span of every type, entities out."""

    name = "global_pointer"
    reading = ("types",)
    types = ()

    def loss(self, model, features, labels, training=True):
        """(the mean over windows and types of the multi-label loss over spans, {"span_f1": the batch's F1 of
        spans scored above 0})."""
        scores = model(features, training=training)
        targets = span_targets(labels, tf.shape(scores))
        width = tf.shape(scores)[-1]
        loss = multilabel_crossentropy(tf.reshape(targets, [-1, width * width]),
                                       tf.reshape(scores, [-1, width * width]))
        chosen = tf.cast(scores > 0, tf.float32)
        right = tf.reduce_sum(chosen * targets)
        f1 = 2 * right / tf.maximum(tf.reduce_sum(chosen) + tf.reduce_sum(targets), 1.0)
        return tf.reduce_mean(loss), {"span_f1": f1}

    def evaluate(self, outputs, targets):
        """Each sentence's predicted entities {(type, first word, end word exclusive)} against the true ones ->
        eval_precision, eval_recall, eval_f1 (exact type and boundaries); `report`: each type's (precision,
        recall, F1, support)."""
        numbers, per_type = span_scores(targets, outputs, self.types)
        return Evaluation({f"eval_{k}": v for k, v in numbers.items()},
                          {kind: (v["precision"], v["recall"], v["f1"], v["support"]) for kind, v in per_type.items()})

    def main_metric(self, task=None):
        return "eval_f1"

    def hf_architecture(self, weights):
        raise UserError("transformers has no GlobalPointer head; export the model as google")

    def hf_facts(self, labels):
        """bert_config.json's id2label and label2id (the entity types), as a tagger's."""
        return label_maps(labels)

    def prediction_files(self, predictions, rows):
        """{file name: text}: predictions.jsonl and, when every sentence has its true entities,
        test_results.txt (core/prediction_files.spans)."""
        return prediction_files.spans(rows, predictions)
