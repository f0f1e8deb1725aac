"""R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): each training batch goes
through the model twice, each pass with its own dropout masks, and the loss adds how far the two passes'
predicted distributions are apart. With `alpha`, as bert4keras' `crossentropy_with_rdrop` computes it (the
paper's loss halved, so that alpha 0 is the plain loss):

    loss = (CE_1 + CE_2) / 2 + alpha / 4 x (KL(P_1 || P_2) + KL(P_2 || P_1))

Evaluation and prediction run one pass, without dropout, as before.

Example:
    loss_fn = with_rdrop(objective.loss, objective.divergence, alpha=4.0)
    loss, stats = loss_fn(model, features, labels, training=True)   # stats["rdrop_kl"]: the KL term
"""

import tensorflow as tf


def symmetric_kl(first, second):
    """KL(P || Q) + KL(Q || P) of the softmaxes of two logits tensors, over the last axis, in float32:
    sum over classes of (p - q)(log p - log q)."""
    first, second = tf.cast(first, tf.float32), tf.cast(second, tf.float32)
    log_p, log_q = tf.nn.log_softmax(first), tf.nn.log_softmax(second)
    return tf.reduce_sum((tf.exp(log_p) - tf.exp(log_q)) * (log_p - log_q), -1)


class Recording:
    """The model, keeping each output it gives (the objective's loss calls it once a pass); any other
    attribute is the model's."""

    def __init__(self, model):
        self._model, self.outputs = model, []

    def __call__(self, *args, **kwargs):
        out = self._model(*args, **kwargs)
        self.outputs.append(out)
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def with_rdrop(loss_fn, divergence, alpha):
    """A training loss `(model, features, labels, training) -> (loss, stats)` from `loss_fn` (the head's) with
    R-Drop's second pass; `divergence(first, second, labels)`: the mean over examples (or labelled tokens)
    of the two passes' symmetric KL (the objective's). Its statistics are the first pass's and `rdrop_kl`."""

    def loss(model, features, labels, training=True):
        if not training:
            return loss_fn(model, features, labels, training)
        recording = Recording(model)
        first, stats = loss_fn(recording, features, labels, training)
        second, _ = loss_fn(recording, features, labels, training)
        kl = divergence(*recording.outputs, labels)
        return (first + second) / 2 + alpha / 4 * kl, {**stats, "rdrop_kl": kl}

    return loss
