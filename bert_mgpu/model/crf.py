"""A linear-chain CRF over a tagger's label scores: learnt transitions, negative log-likelihood, Viterbi.

The score of a tag path y over n positions is sum_t emissions[t, y_t] + sum_{t>0} transitions[y_{t-1}, y_t];
the likelihood normalizes it over every path (the forward algorithm, in float32 whatever the policy). Only
the positions that carry a label take part (each word's first WordPiece): they are moved to the front of their
row by a stable sort, so shapes stay static (XLA) and the chain runs word to word, as BERT-BiLSTM-CRF-NER's
and bert4keras' CRFs do over their tokens. Decoding runs on the host per window (`viterbi`), and in a
SavedModel's graph over each text's words (`viterbi_tf`).

Example:
    crf = CRF(num_labels)                  # in the model, after the head: it passes the scores through
    nll = -log_likelihood(logits, labels, crf.transitions)   # labels -1 where a position has none
"""

import keras
import tensorflow as tf

from bert_mgpu.core.viterbi import viterbi  # noqa: F401 (crf.viterbi, as before)


class CRF(keras.layers.Layer):
    """Holds the transition scores [from, to] (float32); called on the scores, returns them unchanged, so the
    transitions are the model's weights (checkpoints, gradients, every tower)."""

    def __init__(self, num_labels, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.num_labels = num_labels
        self.transitions = self.add_weight(shape=(num_labels, num_labels), initializer="zeros", name="transitions")

    def call(self, scores):
        return scores

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels}


def _front(values, mask):
    """Each row's masked positions moved to its front, in order (a stable sort keeps shapes static)."""
    width = tf.shape(mask)[1]
    key = tf.where(mask, 0, width) + tf.range(width)[None, :]
    return tf.gather(values, tf.argsort(key, axis=1, stable=True), batch_dims=1)


def log_likelihood(emissions, labels, transitions):
    """Log-probability [batch] of each row's labelled path (labels -1 elsewhere); 0 for a row with none."""
    emissions, transitions = tf.cast(emissions, tf.float32), tf.cast(tf.convert_to_tensor(transitions), tf.float32)
    mask = labels >= 0
    lengths = tf.reduce_sum(tf.cast(mask, tf.int32), 1)
    scores, tags = _front(emissions, mask), _front(tf.where(mask, labels, 0), mask)
    steps = tf.sequence_mask(lengths, tf.shape(labels)[1])
    stepf = tf.cast(steps, tf.float32)
    unary = tf.reduce_sum(tf.gather(scores, tags, batch_dims=2) * stepf, 1)
    pair = tf.gather_nd(transitions, tf.stack([tags[:, :-1], tags[:, 1:]], -1))
    binary = tf.reduce_sum(pair * stepf[:, 1:], 1)

    def forward(alpha, step):  # time-major: one position of every row
        emission, live = step
        moved = tf.reduce_logsumexp(alpha[:, :, None] + transitions[None], axis=1) + emission
        return tf.where(live[:, None], moved, alpha)

    time_major = tf.transpose(scores, [1, 0, 2])
    alpha = tf.scan(forward, (time_major[1:], _live(lengths, tf.shape(labels)[1])[1:]), initializer=time_major[0])
    last = tf.cond(tf.shape(time_major)[0] > 1, lambda: alpha[-1], lambda: time_major[0])
    log_z = tf.reduce_logsumexp(last, axis=1)
    return tf.where(lengths > 0, unary + binary - log_z, 0.0)


def viterbi_tf(emissions, lengths, transitions):
    """`viterbi` in TensorFlow ops over rows: emissions [rows, n, labels], each row's first `lengths` positions
    its own -> the best paths [rows, n] (positions past a row's length repeat its last tag)."""
    emissions = tf.cast(emissions, tf.float32)
    transitions = tf.cast(tf.convert_to_tensor(transitions), tf.float32)
    labels = tf.shape(transitions)[0]
    n = tf.shape(emissions)[1]  # 0 or 1 (a batch of texts of 0 or 1 word): padded to 2 for the scans, cut after
    emissions = tf.pad(emissions, [[0, 0], [0, tf.maximum(2 - n, 0)], [0, 0]])
    time_major = tf.transpose(emissions, [1, 0, 2])
    live = _live(lengths, tf.shape(emissions)[1])
    stay = tf.range(labels)[None, :]  # a step past a row's end points each tag at itself

    def forward(carry, step):
        score, _ = carry
        emission, alive = step
        total = score[:, :, None] + transitions[None]  # [rows, from, to]
        moved = tf.reduce_max(total, 1) + emission
        back = tf.argmax(total, 1, output_type=tf.int32)
        return (tf.where(alive[:, None], moved, score),
                tf.where(alive[:, None], back, tf.broadcast_to(stay, tf.shape(back))))

    rows = tf.shape(emissions)[0]
    start = (time_major[0], tf.zeros([rows, labels], tf.int32))
    scores, backs = tf.scan(forward, (time_major[1:], live[1:]), initializer=start)
    best = tf.argmax(scores[-1], 1, output_type=tf.int32)

    def backward(tag, back):
        return tf.gather(back, tag, batch_dims=1)

    earlier = tf.scan(backward, backs, initializer=best, reverse=True)  # the tag before each later step
    return _rows_first(tf.concat([earlier, best[None]], 0))[:, :n]


# Time-major masks and paths without an integer or boolean Transpose: for one, oneDNN's graph pass logs
# "E0000 ... oneDNN supports DT_BOOL only on platforms with AVX-512" on every run (data/input_pipeline.combine).
def _live(lengths, n):
    """[n, rows] bool: position t of row r is within its length."""
    return tf.range(n)[:, None] < tf.cast(lengths, tf.int32)[None, :]


def _rows_first(paths):
    """[n, rows] -> [rows, n], by a gather."""
    n, rows = tf.shape(paths)[0], tf.shape(paths)[1]
    return tf.gather(tf.reshape(paths, [-1]), tf.range(rows)[:, None] + tf.range(n)[None, :] * rows)
