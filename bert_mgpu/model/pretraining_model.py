"""BERT for pretraining: the encoder with google-bert's masked-LM head and optional next-sentence head.

The masked-LM head (keras-hub's MaskedLMHead) gathers the hidden states at the masked positions first,
so its transform and the vocabulary projection run on `max_predictions_per_seq` rows per sequence rather
than on every token; the projection is tied to the word embeddings and adds its own output bias, as
google-bert's `get_masked_lm_output`. Heads take Google's names (`cls/predictions/...`,
`cls/seq_relationship/...`), so a Google release's heads load into them and bert_mgpu writes them back
under those names.

Example:
    model = build_pretrainer(config, policy="mixed_bfloat16", nsp=True)
    out = model({"token_ids": ids, "segment_ids": segs, "padding_mask": ids != 0, "mask_positions": pos})
    out["mlm_logits"]  # [batch, predictions, vocab], compute dtype;  out["nsp_logits"]: [batch, 2] float32
"""

import logging

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.fused_encoder import FusedBertEncoder
from bert_mgpu.model.kernels import ACTIVATIONS
from bert_mgpu.model.modeling import build_backbone

log = logging.getLogger("bert_mgpu")


class TiedMaskedLMHead(keras_hub.layers.MaskedLMHead):
    """keras-hub's MaskedLMHead, projecting onto the word embeddings with one `transpose_b` matmul.

    keras-hub's reverse embedding transposes the [vocab, hidden] table in every forward pass and the
    gradient back in every backward pass; the matmul reads the table as it is stored.
    Same variables, same result.
    """

    def call(self, inputs, mask_positions):
        # A gather per row, as keras.ops.take_along_axis computes it without its Transpose of the int64
        # positions, for which oneDNN's graph pass logs an error line on every run (data/input_pipeline.combine).
        x = tf.gather(inputs, mask_positions, batch_dims=1)
        parts = _compat.masked_lm_parts(self)
        x = parts.norm(parts.dense(x))
        table = tf.cast(self.token_embedding.embeddings, self.compute_dtype)
        rows = tf.reshape(x, [-1, tf.shape(x)[-1]])
        logits = tf.matmul(rows, table, transpose_b=True)
        logits = tf.reshape(logits, tf.concat([tf.shape(x)[:-1], [-1]], 0)) + tf.cast(parts.bias, self.compute_dtype)
        return self.activation(logits) if self.activation is not None else logits


def build_pretrainer(config, policy="float32", nsp=True, fused=True):
    """Functional model: inputs + `mask_positions` -> {"mlm_logits", "nsp_logits" (if nsp)}.

    The masked-LM logits stay in the compute dtype (bfloat16 under mixed_bfloat16): `sparse_xent`
    computes the loss from them in float32 without a float32 copy of [batch, predictions, vocab].

    Attributes `.backbone`, `.mlm_head` and `.nsp_head` (None without NSP) address the parts.
    """
    if config.model_type != "bert":
        raise UserError(f"model_type={config.model_type}: run_pretraining trains BERT's masked-LM and next-sentence "
                        f"heads; an {config.model_type.upper()} is fine-tuned here (run_classifier, run_ner, "
                        "run_squad, ...), not pretrained")
    backbone = build_backbone(config, policy)
    init = keras.initializers.TruncatedNormal(stddev=config.initializer_range)
    inputs = {
        "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
        "segment_ids": keras.Input(shape=(None,), dtype="int32", name="segment_ids"),
        "padding_mask": keras.Input(shape=(None,), dtype="bool", name="padding_mask"),
        "mask_positions": keras.Input(shape=(None,), dtype="int32", name="mask_positions"),
    }
    positions = inputs["mask_positions"]
    if fused:  # the last layer runs only at the masked positions; the head then takes them in order
        encoded = FusedBertEncoder(backbone)({**inputs, "output_positions": positions})
        positions = keras.ops.cumsum(keras.ops.ones_like(positions), axis=1) - 1
    else:
        encoded = backbone({k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")})
    mlm_head = TiedMaskedLMHead(
        vocabulary_size=config.vocab_size, token_embedding=backbone.token_embedding,
        intermediate_activation=ACTIVATIONS[config.hidden_act].keras, layer_norm_epsilon=1e-12,
        kernel_initializer=init, dtype=keras.DTypePolicy(policy), name="mlm_head")
    logits = mlm_head(encoded["sequence_output"], mask_positions=positions)
    outputs = {"mlm_logits": keras.layers.Activation("linear", dtype=keras.DTypePolicy(policy),
                                                     name="mlm_logits")(logits)}
    nsp_head = None
    if nsp:
        nsp_head = keras.layers.Dense(2, kernel_initializer=init, dtype="float32", name="nsp_head")
        outputs["nsp_logits"] = nsp_head(encoded["pooled_output"])
    model = keras.Model(inputs, outputs, name="bert_pretrainer")
    model.backbone, model.mlm_head, model.nsp_head = backbone, mlm_head, nsp_head
    return model


def head_variables(model):
    """{Google name: (variable, transpose?)} for the pretraining heads the model has."""
    mlm = _compat.masked_lm_parts(model.mlm_head)
    out = {
        "cls/predictions/transform/dense/kernel": (mlm.dense.kernel, False),
        "cls/predictions/transform/dense/bias": (mlm.dense.bias, False),
        "cls/predictions/transform/LayerNorm/gamma": (mlm.norm.gamma, False),
        "cls/predictions/transform/LayerNorm/beta": (mlm.norm.beta, False),
        "cls/predictions/output_bias": (mlm.bias, False),
    }
    if model.nsp_head is not None:  # Google keeps the NSP weights as [2, hidden]
        out["cls/seq_relationship/output_weights"] = (model.nsp_head.kernel, True)
        out["cls/seq_relationship/output_bias"] = (model.nsp_head.bias, False)
    return out


def head_checkpoint_objects(model):
    """{key: variable} for a bert_mgpu checkpoint: Google names, the NSP kernel in Keras' layout."""
    return {("cls/seq_relationship/kernel" if t else name): v
            for name, (v, t) in head_variables(model).items()}


def head_weights(model):
    """The heads as {Google name: float32 array} in Google's shapes."""
    return {name: (v.numpy().T if t else v.numpy()).astype(np.float32)
            for name, (v, t) in head_variables(model).items()}


def assign_heads(model, weights, source):
    """Load whichever heads `weights` holds; returns the names initialized fresh (logged by the caller)."""
    fresh = []
    for name, (var, transpose) in head_variables(model).items():
        if name not in weights:
            fresh.append(name)
            continue
        value = weights[name].T if transpose else weights[name]
        if tuple(value.shape) != tuple(var.shape):
            raise UserError(f"{source}: {name} is {list(weights[name].shape)}, model wants "
                            f"{list(var.shape)[::-1] if transpose else list(var.shape)}")
        var.assign(value)
    return fresh
