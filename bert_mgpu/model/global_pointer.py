"""GlobalPointer (Su 2021, bert4keras' `GlobalPointer`): a score for every span of every entity type, so that
nested and overlapping entities are found, and no tag sequence has to be decoded into them.

One dense layer maps each position's encoder output to a query and a key of `head_size` for every type;
rotary position embeddings (RoPE, Su et al. 2021) turn each by its position, so the score of the span from
position i to position j of type t, s_t(i, j) = q_t(i) . k_t(j) / sqrt(head_size), sees their distance j - i.
A span ending before it starts, or touching padding, scores -1e12: never chosen, and nothing in the loss
(exp(-1e12) = 0). The model is the tagger's (an encoder and a dense layer on every token, `build_tagger`)
with `SpanScores` on top, so its encoder, head weights and checkpoint names are the tagger's.

Example:
    model = build_global_pointer(BertConfig(vocab_size=30522), num_types=3, head_size=64)
    scores = model(features)  # float32 [batch, types, length, length]; a span (i, j) of type t: t, i, j
"""

import math

import keras
from keras import ops

from bert_mgpu.model.modeling import build_tagger

MASKED = -1e12  # a span that is none: its score, far below any real one


def rotary(x):
    """RoPE as bert4keras applies it: [batch, length, types, size] -> the same, each pair of features (2i,
    2i+1) at position p turned by the angle p x 10000^(-2i / size)."""
    length, size = ops.shape(x)[1], x.shape[-1]
    position = ops.cast(ops.arange(length), "float32")[:, None]
    angle = position * ops.power(10000.0, -2.0 * ops.cast(ops.arange(size // 2), "float32") / size)[None, :]
    cos = ops.repeat(ops.cos(angle), 2, axis=-1)[None, :, None, :]  # [1, length, 1, size]: cos, cos, ...
    sin = ops.repeat(ops.sin(angle), 2, axis=-1)[None, :, None, :]
    pairs = ops.reshape(x, (*ops.shape(x)[:-1], size // 2, 2))
    turned = ops.reshape(ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), ops.shape(x))  # -x1, x0, -x3, x2
    return x * cos + turned * sin


class SpanScores(keras.layers.Layer):
    """[batch, length, types x 2 x head_size] (each type's query then key, as bert4keras splits them) and the
    padding mask -> float32 span scores [batch, types, length, length]."""

    def __init__(self, num_types, head_size, **kwargs):
        super().__init__(**kwargs)
        if head_size % 2:
            raise ValueError(f"head_size={head_size}: rotary embeddings turn pairs of features; give an even size")
        self.num_types, self.head_size = num_types, head_size

    def call(self, projected, padding_mask):
        batch, length = ops.shape(projected)[0], ops.shape(projected)[1]
        x = ops.reshape(ops.cast(projected, "float32"), (batch, length, self.num_types, 2, self.head_size))
        query, key = rotary(x[:, :, :, 0]), rotary(x[:, :, :, 1])
        scores = ops.einsum("bmtd,bntd->btmn", query, key) / math.sqrt(self.head_size)
        real = ops.cast(padding_mask, "bool")
        positions = ops.arange(length)
        upper = positions[:, None] <= positions[None, :]  # the span starts at or before its end
        keep = real[:, None, :, None] & real[:, None, None, :] & upper[None, None]
        return ops.where(keep, scores, ops.full_like(scores, MASKED))

    def compute_output_spec(self, projected, padding_mask):
        b, n = projected.shape[0], projected.shape[1]
        return keras.KerasTensor((b, self.num_types, n, n), "float32")

    def get_config(self):
        return {**super().get_config(), "num_types": self.num_types, "head_size": self.head_size}


def build_global_pointer(config, num_types, head_size=64, policy="float32", dropout=None, fused=True):
    """Functional Keras model: features -> float32 span scores [batch, types, length, length]. `.backbone`
    and `.head` (one dense layer of types x 2 x head_size units, google-bert's output_weights/output_bias) as
    `build_tagger`'s, so checkpoints and LoRA address it as they do a tagger."""
    tagger = build_tagger(config, num_types * 2 * head_size, policy, dropout, fused)
    scores = SpanScores(num_types, head_size, dtype="float32", name="span_scores")(
        tagger.output, tagger.input["padding_mask"])
    model = keras.Model(tagger.input, scores, name="bert_global_pointer")
    model.backbone, model.head, model.crf = tagger.backbone, tagger.head, None
    model.num_types, model.head_size = num_types, head_size
    return model
