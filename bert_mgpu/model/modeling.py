"""BERT encoder (keras-hub's BertBackbone) and its heads: sequence classification, token classification, spans
and multiple choice.

The sequence head follows google-bert's run_classifier: dropout on the pooled [CLS] output, then one dense
layer (truncated-normal init, stddev initializer_range). The token head is the same on every position's
output, as Hugging Face's BertForTokenClassification. Both run in float32 whatever the policy, so logits and
losses are float32 under mixed_float16 / mixed_bfloat16.

Example:
    model = build_classifier(BertConfig(vocab_size=30522), num_labels=2, policy="mixed_bfloat16")
    logits = model({"token_ids": ids, "segment_ids": segs, "padding_mask": ids != 0})
"""

import keras
import keras_hub

from bert_mgpu.core import _compat
from bert_mgpu.model.crf import CRF
from bert_mgpu.model.fused_encoder import FusedBertEncoder
from bert_mgpu.model.kernels import ACTIVATIONS


def build_backbone(config, policy="float32"):
    """A keras-hub BertBackbone shaped by a google-bert BertConfig, with the config's activation. For ELECTRA
    and ALBERT keras-hub's ElectraBackbone: the same layers, and the embeddings' projection when their width
    is not the hidden one. ELECTRA's pooler is left untrained and unused (it has none); ALBERT's distinct
    layers (`config.layer_count`) run in `backbone.schedule`'s order, which the encoders follow."""
    shape = dict(
        num_layers=config.layer_count,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        dropout=config.hidden_dropout_prob,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size,
        dtype=keras.DTypePolicy(policy),
        name="bert",
    )
    if config.model_type == "bert":
        backbone = keras_hub.models.BertBackbone(vocabulary_size=config.vocab_size, **shape)
    else:
        backbone = keras_hub.models.ElectraBackbone(vocab_size=config.vocab_size, embedding_dim=config.embedding_width,
                                                    **shape)
        backbone.pooled_dense.trainable = config.has_pooler
    backbone.has_pooler, backbone.schedule = config.has_pooler, config.schedule  # what the encoders follow
    # keras-hub fixes tanh-GELU in its constructor; the feed-forward Dense applies `activation` at call
    # time, so setting it here gives the activation the checkpoint was trained with.
    backbone.hidden_act = config.hidden_act  # what FusedBertEncoder computes
    for layer in backbone.transformer_layers:
        _compat.transformer_parts(layer).intermediate.activation = ACTIVATIONS[config.hidden_act].keras
        # Pre-LN: each layer's existing LayerNorms move in front of their sub-layers (keras-hub's
        # `normalize_first`, read at call time); the MLM head's own LayerNorm then normalizes the output.
        layer.normalize_first = config.encoder_ln_mode == "pre-ln"
    return backbone


class _FirstRow(keras.layers.Layer):
    """[batch, length, hidden] -> [CLS]'s row [batch, hidden]: ELECTRA's pooled output."""

    def call(self, x):
        return x[:, 0]

    def compute_output_spec(self, x):
        return keras.KerasTensor((x.shape[0], x.shape[-1]), x.dtype)


def reference_encoder(backbone, hidden_states=False):
    """keras-hub's own layers of an ELECTRA or ALBERT `backbone` called in its family's order: each pass of
    `backbone.schedule` (ALBERT's shared layers), ELECTRA's [CLS] row as the pooled output. The unfused
    reference, which the exports convert, as BertBackbone is BERT's. `hidden_states`: also each pass's output
    ("hidden_states", a list)."""
    b = backbone
    inputs = {"token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
              "segment_ids": keras.Input(shape=(None,), dtype="int32", name="segment_ids"),
              "padding_mask": keras.Input(shape=(None,), dtype="bool", name="padding_mask")}
    tokens = b.token_embedding(inputs["token_ids"])
    x = b.embeddings_add((tokens, b.position_embedding(tokens), b.segment_embedding(inputs["segment_ids"])))
    x = b.embeddings_dropout(b.embeddings_layer_norm(x))
    if hasattr(b, "embeddings_projection"):
        x = b.embeddings_projection(x)
    states = []
    for index in b.schedule:
        x = b.transformer_layers[index](x, padding_mask=inputs["padding_mask"])
        states.append(x)
    first = _FirstRow(dtype=b.dtype_policy, name="first_row")(x)
    outputs = {"sequence_output": x, "pooled_output": b.pooled_dense(first) if b.has_pooler else first}
    if hidden_states:
        outputs["hidden_states"] = states
    return keras.Model(inputs, outputs, name="reference_encoder")


def encoder_variables(backbone):
    """The backbone's variables a checkpoint holds: all of them but an ELECTRA backbone's unused pooler."""
    if getattr(backbone, "has_pooler", True):
        return list(backbone.weights)
    skip = {id(v) for v in backbone.pooled_dense.weights}
    return [v for v in backbone.weights if id(v) not in skip]


def build_classifier(config, num_labels, policy="float32", dropout=None, fused=True):
    """Functional Keras model: dict of token_ids/segment_ids/padding_mask -> float32 logits [batch, labels].

    The returned model has `.backbone` and `.head` attributes, which checkpoints address by name.
    """
    return _with_head(config, num_labels, policy, dropout, fused, "pooled_output", "bert_classifier")


def build_tagger(config, num_labels, policy="float32", dropout=None, fused=True, crf=False):
    """Functional Keras model: dict of token_ids/segment_ids/padding_mask -> float32 logits [batch, length,
    labels], one row of label scores a position. `.backbone` and `.head` as build_classifier's (the head's
    weights are google-bert's output_weights/output_bias, transformers' classifier.weight/bias). `crf`: the
    model also holds a CRF's transitions (`.crf`, crf.py), which its objective trains and decodes with."""
    model = _with_head(config, num_labels, policy, dropout, fused, "sequence_output", "bert_tagger")
    if not crf:
        return model
    layer = CRF(num_labels, name="crf")
    with_crf = keras.Model(model.input, layer(model.output), name="bert_tagger_crf")
    with_crf.backbone, with_crf.head, with_crf.crf = model.backbone, model.head, layer
    return with_crf


def head_variables(model):
    """A head model's own variables by their checkpoint names: the dense head's kernel and bias, and a CRF
    tagger's transitions."""
    variables = {"kernel": model.head.kernel, "bias": model.head.bias}
    if model.crf is not None:
        variables["transitions"] = model.crf.transitions
    return variables


def build_span_model(config, policy="float32", fused=True):
    """Functional Keras model: features -> float32 [batch, length, 2], a start and an end score a position
    (google-bert's run_squad head, cls/squad/output_weights; transformers' qa_outputs). No dropout before
    the head, as both."""
    return _with_head(config, 2, policy, 0.0, fused, "sequence_output", "bert_span")


class _Choices(keras.layers.Layer):
    """[batch, choices, length] inputs -> [batch x choices, length] rows, and the rows' scores back to
    [batch, choices]: a choice with no [CLS] (padding) scores -1e4, so it is never chosen."""

    def call(self, inputs):
        return {k: keras.ops.reshape(v, (-1, keras.ops.shape(v)[-1])) for k, v in inputs.items()}

    def compute_output_spec(self, inputs):
        return {k: keras.KerasTensor((None, v.shape[-1]), v.dtype) for k, v in inputs.items()}


class _ChoiceScores(keras.layers.Layer):
    def call(self, scores, padding_mask):
        scores = keras.ops.reshape(scores, keras.ops.shape(padding_mask)[:2])
        return keras.ops.where(padding_mask[:, :, 0], scores, keras.ops.full_like(scores, -1e4))

    def compute_output_spec(self, scores, padding_mask):
        return keras.KerasTensor(padding_mask.shape[:2], scores.dtype)


def build_choice_model(config, policy="float32", dropout=None, fused=True):
    """Functional Keras model: features [batch, choices, length] -> float32 scores [batch, choices], one
    from each choice's pooled [CLS] output through one dense unit (transformers' BertForMultipleChoice;
    google-bert's names output_weights [1, hidden] / output_bias). `.backbone` and `.head` as
    build_classifier's."""
    inner = _with_head(config, 1, policy, dropout, fused, "pooled_output", "bert_choice_rows")
    inputs = {
        "token_ids": keras.Input(shape=(None, None), dtype="int32", name="token_ids"),
        "segment_ids": keras.Input(shape=(None, None), dtype="int32", name="segment_ids"),
        "padding_mask": keras.Input(shape=(None, None), dtype="bool", name="padding_mask"),
    }
    scores = _ChoiceScores(dtype="float32", name="choice_scores")(inner(_Choices(name="choice_rows")(inputs)),
                                                                 inputs["padding_mask"])
    model = keras.Model(inputs, scores, name="bert_multiple_choice")
    model.backbone, model.head, model.crf = inner.backbone, inner.head, None
    return model


def _with_head(config, num_labels, policy, dropout, fused, output, name):
    """The encoder, dropout and one float32 dense layer named "classifier" on its `output`."""
    backbone = build_backbone(config, policy)
    inputs = {
        "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
        "segment_ids": keras.Input(shape=(None,), dtype="int32", name="segment_ids"),
        "padding_mask": keras.Input(shape=(None,), dtype="bool", name="padding_mask"),
    }
    pooled_only = output == "pooled_output"  # the fused encoder then skips the last layer's other rows
    if fused:
        encoder = FusedBertEncoder(backbone, pooled_only=pooled_only)
    else:
        encoder = backbone if config.model_type == "bert" else reference_encoder(backbone)
    rate = config.hidden_dropout_prob if dropout is None else dropout
    hidden = keras.layers.Dropout(rate, name="classifier_dropout")(encoder(inputs)[output])
    head = keras.layers.Dense(
        num_labels,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=config.initializer_range),
        dtype="float32",
        name="classifier",
    )
    model = keras.Model(inputs, head(hidden), name=name)
    model.backbone, model.head, model.crf = backbone, head, None  # a CRF tagger's .crf: build_tagger
    return model

