"""The one place bert_mgpu reads TensorFlow, Keras and keras-hub internals that have no public name.

Each function says what it needs and why; tests/test_compat.py fails with a clear message when an
upgrade moves one of them.
"""

from typing import NamedTuple


def onednn_enabled():
    """Whether TensorFlow runs oneDNN on this CPU (on by default only with AVX512-VNNI/BF16 or AMX, or when
    TF_ENABLE_ONEDNN_OPTS=1), answered without starting any device: its CPU allocator, and whether that
    keeps memory statistics, follows from it."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def sublayers(model):
    """Every layer inside a Keras model, outer layers first (Keras 3 names no public walk of nested layers)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


class TransformerParts(NamedTuple):
    """The sub-layers of one keras-hub TransformerEncoder, by what they are in google-bert's terms."""

    query: object  # EinsumDense [hidden] -> [heads, size]
    key: object
    value: object
    attention_output: object  # EinsumDense [heads, size] -> [hidden]
    attention_norm: object  # LayerNormalization after (post-LN) or before (pre-LN) attention
    intermediate: object  # Dense [hidden] -> [intermediate], with the activation
    output: object  # Dense [intermediate] -> [hidden]
    output_norm: object


def transformer_parts(layer):
    """keras-hub keeps a TransformerEncoder's sub-layers in private attributes and names no public way
    to them; the fused encoder reads their weights, and build_backbone sets the activation."""
    att = layer._self_attention_layer
    return TransformerParts(att._query_dense, att._key_dense, att._value_dense, att._output_dense,
                            layer._self_attention_layer_norm, layer._feedforward_intermediate_dense,
                            layer._feedforward_output_dense, layer._feedforward_layer_norm)


class MaskedLMParts(NamedTuple):
    """keras-hub's MaskedLMHead: google-bert's `cls/predictions/transform/{dense,LayerNorm}` and
    `cls/predictions/output_bias`."""

    dense: object
    norm: object
    bias: object


def masked_lm_parts(head):
    """The weights of a keras-hub MaskedLMHead (private attributes), for checkpoints and the tied head."""
    return MaskedLMParts(head._intermediate_dense, head._intermediate_layer_norm, head._bias)


def per_replica_spec(*specs):
    """tf.distribute's PerReplicaSpec (what its own distributed datasets report as `element_spec`), for a
    step traced once for every batch; TensorFlow exports no public name for it."""
    from tensorflow.python.distribute import values

    return values.PerReplicaSpec(*specs)


def seed_generators(layer):
    """A Keras layer's SeedGenerators (Keras 3 tracks them in `_seed_generators`, with no public list)."""
    return list(getattr(layer, "_seed_generators", ()))


def wrap_seed_generator(generator, wrapper):
    """Make `generator.next(ordered)` return `wrapper(keras_next, ordered)`, where `keras_next` is Keras'
    own `SeedGenerator.next` of it. Keras offers no hook for per-replica seeds; this replaces the bound
    method on the instance, idempotently (a second call wraps Keras' method again, not the wrapper)."""
    import functools

    keras_next = functools.partial(type(generator).next, generator)
    generator.next = functools.partial(wrapper, keras_next)


def optimizer_moments(optimizer, variable):
    """(first, second) moment slots of `variable` in a Keras Adam / AdamW / Lamb: Keras keeps them in
    private lists indexed by a private lookup. TowerOptimizer updates them in its own program."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def uses_weight_decay(optimizer, variable):
    """Whether Keras' decoupled weight decay applies to `variable` (`exclude_from_weight_decay`)."""
    return optimizer._use_weight_decay(variable)


def current_learning_rate(optimizer):
    """The learning rate of the coming step (a schedule evaluated at `iterations`), as Keras computes it."""
    return optimizer._get_current_learning_rate()
