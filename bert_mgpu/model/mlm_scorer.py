"""A pretrainer's masked-LM head read as a scorer: what fill-mask and pseudo-perplexity need, on the device.

The head's [batch, positions, vocab] logits never leave the tower: the model returns, at each asked
position, the log-probability of a given token and the `top_k` most likely tokens (log-probabilities and
ids), packed in one float32 tensor [batch, positions, 1 + 2 top_k] (ids below 2^24 are exact in float32).

Example:
    scorer = masked_lm_scorer(pretrainer.model, top_k=5)
    out = scorer({"token_ids": ..., "segment_ids": ..., "padding_mask": ..., "mask_positions": [[3]],
                  "target_ids": [[2769]]})
    target_log_prob, top_log_probs, top_ids = split_scores(out.numpy(), 5)
"""

import keras
import numpy as np
import tensorflow as tf


class _Score(keras.layers.Layer):
    def __init__(self, top_k, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.top_k = top_k

    def call(self, logits, target_ids):
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        target = tf.gather(log_probs, tf.maximum(target_ids, 0), batch_dims=2)[..., None]
        top = tf.math.top_k(log_probs, self.top_k)
        return tf.concat([target, top.values, tf.cast(top.indices, tf.float32)], -1)


def masked_lm_scorer(model, top_k=5):
    """`model` (pretraining_model.build_pretrainer) -> a Keras model of its inputs and `target_ids`
    [batch, positions] (int32; negative: none) -> float32 [batch, positions, 1 + 2 top_k]."""
    inputs = {name: keras.Input(shape=(None,), dtype=dtype, name=name) for name, dtype in (
        ("token_ids", "int32"), ("segment_ids", "int32"), ("padding_mask", "bool"), ("mask_positions", "int32"),
        ("target_ids", "int32"))}
    logits = model({k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask", "mask_positions")})
    return keras.Model(inputs, _Score(top_k, name="scores")(logits["mlm_logits"], inputs["target_ids"]),
                       name="masked_lm_scorer")


def split_scores(out, top_k):
    """[..., 1 + 2 top_k] -> (target log-probability [...], top log-probabilities [..., k], top ids [..., k])."""
    return out[..., 0], out[..., 1:1 + top_k], np.rint(out[..., 1 + top_k:]).astype(np.int64)
