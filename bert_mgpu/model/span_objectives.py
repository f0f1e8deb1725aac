"""Extractive question answering's objective: a start and an end score on every position (google-bert's
run_squad and transformers' BertForQuestionAnswering), scored by the official SQuAD or CMRC 2018 rules.
See objective.py for the seam; data/squad_input.py turns the scores into answers.

Example:
    kind = SpanExtraction()
    loss, stats = kind.loss(model, features, labels)      # labels [batch, 2]: start and end positions
    reader = kind.read_as(metric="squad", version_2_with_negative=True)
    reader.evaluate(found, {qid: [gold texts]})          # eval_exact_match, eval_f1, ...
    reader.prediction_files(found, questions)             # predictions.json, nbest_predictions.json, ...
"""


import tensorflow as tf

from bert_mgpu.core import prediction_files, qa_metrics
from bert_mgpu.model.kernels import sparse_xent
from bert_mgpu.model.objective import Evaluation, Objective

GOOGLE_HEAD = ("cls/squad/output_weights", "cls/squad/output_bias")  # run_squad's names, [2, hidden] and [2]


class SpanExtraction(Objective):
    """The mean of the start and the end position's cross-entropy (run_squad's loss), each over the
    window's real positions (padding never scores, so a window's loss does not depend on its batch)."""

    name = "question_answerer"
    METRICS = ("squad", "cmrc")
    reading = ("metric", "version_2_with_negative")
    metric, version_2_with_negative = "squad", False

    def loss(self, model, features, labels, training=True):
        """(mean loss, {"span_accuracy": both ends right}) of a batch; labels [batch, 2]."""
        return self.span_stats(model(features, training=training), features["padding_mask"], labels)

    def span_stats(self, logits, padding_mask, labels):
        hidden = tf.where(padding_mask[:, :, None], logits, tf.constant(-1e4, logits.dtype))
        starts, ends = hidden[:, :, 0], hidden[:, :, 1]
        loss = (sparse_xent(labels[:, 0], starts) + sparse_xent(labels[:, 1], ends)) / 2
        right = ((tf.argmax(starts, -1, output_type=labels.dtype) == labels[:, 0])
                 & (tf.argmax(ends, -1, output_type=labels.dtype) == labels[:, 1]))
        return tf.reduce_mean(loss), {"span_accuracy": tf.reduce_mean(tf.cast(right, tf.float32))}

    def evaluate(self, outputs, targets):
        """data/squad_input's `Answers` against {id: [gold texts]} -> eval_exact_match, eval_f1, ...: the
        official script's numbers (`metric`: SQuAD v1.1, v2.0 with null_odds, or CMRC 2018)."""
        if self.metric == "cmrc":
            scores = qa_metrics.cmrc_scores(targets, outputs.predictions)
        else:
            scores = qa_metrics.squad_scores(targets, outputs.predictions,
                                             outputs.null_odds if self.version_2_with_negative else None)
        return Evaluation({f"eval_{k}": v for k, v in scores.items() if k not in ("total", "skipped")})

    def main_metric(self, task=None):
        return "eval_f1"

    def hf_architecture(self, weights):
        return "BertForQuestionAnswering"

    def hf_facts(self, labels):
        return {}

    def prediction_files(self, predictions, rows):
        """run_squad's files: predictions.json, nbest_predictions.json and (v2) null_odds.json, from the
        `Answers` found (which name their questions; `rows` are not read)."""
        return prediction_files.answers(predictions, self.version_2_with_negative)
