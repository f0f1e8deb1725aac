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

import json

import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.model.objectives import Evaluation, Objective, label_maps

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


def span_scores(true, predicted, types):
    """Micro precision, recall and F1 over sets of (type, start, end), a set a sentence, and each type's
    (precision, recall, F1, support)."""
    def prf(right, found, wanted):
        precision = right / found if found else 0.0
        recall = right / wanted if wanted else 0.0
        return precision, recall, (2 * precision * recall / (precision + recall) if precision + recall else 0.0)

    counts = {t: [0, 0, 0] for t in types}  # right, predicted, true
    for t_set, p_set in zip(true, predicted, strict=True):
        for kind, *_ in p_set:
            counts.setdefault(kind, [0, 0, 0])[1] += 1
        for kind, *_ in t_set:
            counts.setdefault(kind, [0, 0, 0])[2] += 1
        for kind, *_ in set(t_set) & set(p_set):
            counts[kind][0] += 1
    totals = [sum(c[i] for c in counts.values()) for i in range(3)]
    precision, recall, f1 = prf(*totals)
    report = {kind: (*prf(*c), c[2]) for kind, c in sorted(counts.items())}
    return {"eval_precision": precision, "eval_recall": recall, "eval_f1": f1}, report


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
        eval_precision, eval_recall, eval_f1 (exact type and boundaries); `report`: each type's."""
        numbers, report = span_scores(targets, outputs, self.types)
        return Evaluation(numbers, report)

    def main_metric(self, task=None):
        return "eval_f1"

    def hf_architecture(self, weights):
        raise UserError("transformers has no GlobalPointer head; export the model as google")

    def hf_facts(self, labels):
        """bert_config.json's id2label and label2id (the entity types), as a tagger's."""
        return label_maps(labels)

    def prediction_files(self, predictions, rows):
        """{file name: text}: predictions.jsonl (each sentence's tokens and its entities: type, token start
        and end, end exclusive, and text: the tokens joined by a space, or run together when every token is
        one character), and test_results.txt when every sentence has its true entities."""
        lines = []
        for row, found in zip(rows, predictions, strict=True):
            joiner = "" if all(len(t) == 1 for t in row.tokens) else " "
            lines.append(json.dumps({"id": row.guid, "tokens": list(row.tokens), "entities": [
                {"type": kind, "start": start, "end": end, "text": joiner.join(row.tokens[start:end])}
                for kind, start, end in sorted(found, key=lambda e: (e[1], e[2], e[0]))]}, ensure_ascii=False))
        files = {"predictions.jsonl": "".join(line + "\n" for line in lines)}
        if rows and all(row.entities is not None for row in rows):
            numbers = self.evaluate(predictions, [row.entities for row in rows])
            files["test_results.txt"] = "".join(f"test_{k[len('eval_'):]} = {v}\n" for k, v in sorted(numbers.items()))
        return files
