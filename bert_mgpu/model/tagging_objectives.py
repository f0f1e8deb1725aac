"""Token classification's objectives (NER): a label a word on its first WordPiece, scored by entities as
conlleval counts them; `CRFTagging` adds a linear-chain CRF (crf.py). See objective.py for the seam.

Example:
    kind = TokenClassification()
    loss, stats = kind.loss(model, features, labels)        # labels -1 where a piece carries none
    results = kind.evaluate(predicted_tags, true_tags)      # eval_f1, ...; results.report: each entity type's
    files = kind.read_as(data_format="cluener").prediction_files(predicted_tags, sentences)
"""

import logging

import tensorflow as tf

from bert_mgpu.core import prediction_files
from bert_mgpu.core.entities import split_tag
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.crf import log_likelihood, viterbi
from bert_mgpu.model.distillation import soft_cross_entropy
from bert_mgpu.model.kernels import sparse_xent
from bert_mgpu.model.objective import Evaluation, Objective, focal, label_maps
from bert_mgpu.model.rdrop import symmetric_kl

log = logging.getLogger("bert_mgpu")


class TokenClassification(Objective):
    """A label a token (NER): cross-entropy over the positions that carry a label (each word's first
    WordPiece; the others are -1), and entity-level scores as conlleval counts them."""

    name = "tagger"
    reading = ("data_format",)  # the sentences' format: "cluener" adds its submission file
    data_format = None
    IGNORED = -1
    UNTAGGED = -2  # a word's first piece in unlabelled text (distillation): the soft term reads it, the loss not
    distillable = True
    weighable = True  # each token's cross-entropy, weighted by its tag and focused (objective.focal)
    softmax_outputs = True  # R-Drop compares each labelled token's two softmaxes

    def loss(self, model, features, labels, training=True):
        """(mean cross-entropy over labelled positions, {"token_accuracy"}); a batch without one gives 0."""
        return self.token_stats(model(features, training=training), labels)

    def token_stats(self, logits, labels):
        """(mean cross-entropy over labelled positions, {"token_accuracy"}) of the scores."""
        labels = tf.reshape(labels, [-1])
        flat = tf.reshape(logits, [-1, tf.shape(logits)[-1]])
        weight = tf.cast(labels != self.IGNORED, tf.float32)
        known = tf.where(labels == self.IGNORED, 0, labels)
        per = focal(sparse_xent(known, flat), known, self.class_weights, self.focal_gamma)
        count = tf.maximum(tf.reduce_sum(weight), 1.0)
        right = tf.cast(tf.equal(tf.argmax(flat, -1, output_type=labels.dtype), labels), tf.float32)
        return tf.reduce_sum(per * weight) / count, {"token_accuracy": tf.reduce_sum(right * weight) / count}

    def divergence(self, first, second, labels):
        """The mean symmetric KL over the labelled positions (each word's first piece), as the loss's mean."""
        labels = tf.reshape(labels, [-1])
        width = tf.shape(first)[-1]
        per = symmetric_kl(tf.reshape(first, [-1, width]), tf.reshape(second, [-1, width]))
        weight = tf.cast(labels != self.IGNORED, tf.float32)
        return tf.reduce_sum(per * weight) / tf.maximum(tf.reduce_sum(weight), 1.0)

    def hard_part(self, features, labels):
        """Distillation: the head's loss skips unlabelled words as it skips a word's later pieces."""
        return features, tf.where(labels == self.UNTAGGED, self.IGNORED, labels)

    def soft_term(self, student, teacher, labels, temperature, features):
        """Distillation's soft loss: the tempered cross-entropy x T^2 (objectives.soft_cross_entropy) of each
        word's first piece, tagged or not, averaged over them as the loss averages over tagged ones."""
        labels = tf.reshape(labels, [-1])
        width = tf.shape(student)[-1]
        per = soft_cross_entropy(tf.reshape(student, [-1, width]), tf.reshape(teacher, [-1, width]), temperature)
        weight = tf.cast(labels != self.IGNORED, tf.float32)
        return tf.reduce_sum(per * weight) / tf.maximum(tf.reduce_sum(weight), 1.0)

    def decoder(self, model):
        """How a window's word scores become label ids: None, each word's best label."""
        return None

    def serving_chunks(self, tag_ids, last_in_row, labels):
        """`entities`' chunks in TensorFlow ops, over words end to end (`last_in_row`: a text's last word)
        -> (first word, last word, type index) of each entity in order, and the type names. The same rules
        as core/entities.py: an I- or E- after O, E-, S- or another type starts one."""
        prefixes, kinds = zip(*(split_tag(label) for label in labels))
        types = sorted({k for k in kinds if k})
        code = {"O": 0, "B": 1, "I": 2, "E": 3, "S": 4}
        prefix = tf.gather(tf.constant([code.get(p, 2) for p in prefixes], tf.int32), tag_ids)
        kind = tf.gather(tf.constant([types.index(k) if k else -1 for k in kinds], tf.int32), tag_ids)
        first_in_row = tf.roll(last_in_row, 1, 0)  # the word after a text's last
        before_prefix = tf.where(first_in_row, 0, tf.roll(prefix, 1, 0))
        before_kind = tf.where(first_in_row, -1, tf.roll(kind, 1, 0))
        after_prefix = tf.where(last_in_row, 0, tf.roll(prefix, -1, 0))
        after_kind = tf.where(last_in_row, -1, tf.roll(kind, -1, 0))
        inside = prefix != 0
        starts = inside & ((prefix == 1) | (prefix == 4) | (before_prefix == 0) | (before_prefix >= 3)
                           | (kind != before_kind))
        ends = inside & ((prefix >= 3) | (after_prefix == 0) | (after_prefix == 1) | (after_prefix == 4)
                         | (kind != after_kind))
        first, last = tf.where(starts)[:, 0], tf.where(ends)[:, 0]
        return first, last, tf.gather(kind, first), types

    def evaluate(self, outputs, targets):
        """Predicted tag sequences (strings) against the true ones -> eval_precision, eval_recall, eval_f1
        (entities, conlleval's rules) and eval_accuracy (words); `report`: each type's (precision, recall, F1,
        support)."""
        results, per_type = prediction_files.tag_scores(targets, outputs)
        return Evaluation(results, {kind: (v["precision"], v["recall"], v["f1"], v["support"])
                                    for kind, v in per_type.items()})

    def main_metric(self, task=None):
        return "eval_f1"

    def hf_architecture(self, weights):
        return "BertForTokenClassification"

    def hf_facts(self, labels):
        """config.json's id2label and label2id, as Hugging Face writes them."""
        return label_maps(labels)

    def prediction_files(self, predictions, rows):
        """{file name: text} for sentences `rows` (guid, tokens, tags or None) and their predicted tags:
        predict.txt (CoNLL columns `token [true] predicted`, a blank line between sentences: what conlleval
        reads), predictions.jsonl (each sentence's text and entities: type, text, character start and end in
        the text, end exclusive, and the token span), test_results.txt when every sentence has its true tags
        (eval_results.txt's scores, named test_) and, for CLUENER's data, cluener_predict.json (its
        submission format, character offsets, end inclusive). The text is the tokens joined by a space, or
        run together when every token is one character (Chinese). In predict.txt each white-space
        character of a token (CLUENER's texts hold spaces, a character a token) is written as [SPACE]:
        a space token would leave its line two columns, which conlleval and the CoNLL reader refuse;
        predictions.jsonl keeps the text as it is."""
        return prediction_files.tagged(rows, predictions, self.data_format)


class CRFTagging(TokenClassification):
    """Token classification with a linear-chain CRF over each window's words (crf.py): the loss is the
    negative log-likelihood of the true tag path, averaged over windows; prediction is the Viterbi path."""

    softmax_outputs = False  # it scores whole paths
    distillable = False  # its words' scores are not a distribution each: no soft term defined here

    def check_rdrop(self):
        raise UserError("--rdrop_alpha compares two passes' softmax over each token's tags; a CRF scores whole "
                        "paths: train without --crf")

    def loss(self, model, features, labels, training=True):
        """(mean negative log-likelihood over windows with a label, {"token_accuracy"} of the scores alone)."""
        logits = model(features, training=training)
        likelihood = log_likelihood(logits, labels, model.crf.transitions)
        rows = tf.maximum(tf.reduce_sum(tf.cast(tf.reduce_any(labels != self.IGNORED, 1), tf.float32)), 1.0)
        _, stats = super().token_stats(logits, labels)
        return -tf.reduce_sum(likelihood) / rows, stats

    def settings(self):
        return {**super().settings(), "crf": True}

    def reweighted(self, class_weights=None, focal_gamma=0.0):
        raise UserError("--class_weights and --focal_gamma weigh each token's softmax; a CRF's loss is the whole "
                        "path's likelihood: train without --crf")

    def decoder(self, model):
        """Each window's best path under the model's transitions as they are now."""
        transitions = model.crf.transitions.numpy()
        return lambda scores: viterbi(scores, transitions)

    def hf_architecture(self, weights):
        raise UserError("--crf: transformers' BertForTokenClassification has no CRF; export the model as google "
                        "or saved_model")
