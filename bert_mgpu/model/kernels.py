"""Every hand-written kernel of bert_mgpu: XLA-compiled elementwise ops and ops with their own gradient.

Dropout from a counter-based hash (the mask is recomputed from the seed in the backward pass, never
stored); attention's softmax+dropout with one backward kernel; bias+activation with a hand-written
backward; bias+dropout+residual+LayerNorm; the masked-LM cross-entropy on low-precision logits; and
`ACTIVATIONS`, the one table of BERT's `hidden_act` values. Each is here because it measurably beat
what TensorFlow's own ops compute (the measurements are in benchmarks/NOTES.md).

Example:
    y = softmax_dropout(scores, 0.1, seed)           # the backward recomputes the same mask
    h = ACTIVATIONS["gelu"].fused(x @ w, b)            # gelu(x @ w + b), one kernel each way
"""

import dataclasses
from typing import Callable

import keras
import tensorflow as tf

from bert_mgpu.core.xla import calling_kernels, compiled


def _mix64(z):
    """SplitMix64's finalizer: a bijection of uint64 whose every output bit depends on every input bit."""
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 30)) * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 27)) * tf.constant(0x94D049BB133111EB, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 31))


def keep(shape, rate, seed):
    """Bool mask of `shape`, each element kept with probability 1 - rate (exact to 2**-32).

    Counter-based: element i's 32 bits are half of SplitMix64's output for counter i // 2 under a key
    mixed from `seed` (int32 [2]). Nothing is stored between calls, and the same seed gives the same
    mask, which is how the dropout gradient below recomputes it. TensorFlow's stateless Philox drew
    16 bits an element, at four times the cost.
    """
    n = tf.reduce_prod(shape)
    key = _mix64(tf.bitcast(tf.cast(seed, tf.int32), tf.uint64))
    counter = tf.cast(tf.range((n + 1) // 2, dtype=tf.int64), tf.uint64)
    bits = tf.reshape(tf.bitcast(_mix64(counter * tf.constant(0x9E3779B97F4A7C15, tf.uint64) + key), tf.uint32),
                      [-1])[:n]
    threshold = tf.cast(tf.cast(rate, tf.float64) * 2.0**32, tf.uint32)
    return tf.reshape(bits >= threshold, shape)


@compiled
def dropout_mask(shape, rate, seed, dtype):
    """1/(1-rate) (rounded to dtype) where kept, 0 where dropped: for the fused kernels that take a mask."""
    return tf.where(keep(shape, rate, seed), tf.constant(1.0 / (1.0 - rate), dtype), tf.constant(0.0, dtype))


@compiled
def _dropout_kernel(x, rate, seed):
    scaled = tf.cast(tf.cast(x, tf.float32) / (1.0 - rate), x.dtype)
    return tf.where(keep(tf.shape(x), rate, seed), scaled, tf.zeros_like(x))


@compiled
def _softmax_dropout_backward(dy, probs, rate, seed):
    """d scores of dropout(softmax(scores)): the mask recomputed from `seed`, then softmax's backward
    probs * (dp - rowsum(dp * probs)), in float32, in one kernel (autodiff ran the dropout's kernel
    and four passes of TensorFlow ops, in bfloat16 under mixed precision)."""
    dp = tf.where(keep(tf.shape(dy), rate, seed), tf.cast(dy, tf.float32) / (1.0 - rate), 0.0)
    p = tf.cast(probs, tf.float32)
    return tf.cast(p * (dp - tf.reduce_sum(dp * p, axis=-1, keepdims=True)), dy.dtype)


@tf.RegisterGradient("BertMgpuSoftmaxDropout")
def _softmax_dropout_gradient(op, dy, *_):
    _, _, probs, rate, seed = op.inputs
    return None, _softmax_dropout_backward(dy, probs, rate, seed), None, None, None


@calling_kernels
def softmax_dropout(scores, rate, seed):
    """dropout(softmax(scores)) over the last axis, no mask kept; the backward is
    `_softmax_dropout_backward`, which recomputes the mask from the same seed."""
    probs = tf.nn.softmax(scores)
    rate = tf.constant(rate, tf.float32)
    return with_gradient("BertMgpuSoftmaxDropout", _dropout_kernel(probs, rate, seed), scores, probs, rate, seed)


def with_gradient(name, y, *inputs):
    """y as a function of `inputs` whose gradient is the one registered as `name`, not autodiff's.

    A gradient override on an identity, registered once at import: `tf.custom_gradient` would register
    a new gradient closure per trace, and those keep traced steps alive.
    The callers are tf.functions, so the override holds when they are called eagerly too.
    """
    with tf.compat.v1.get_default_graph().gradient_override_map({"IdentityN": name}):
        return tf.identity_n([tf.stop_gradient(y), *inputs])[0]


def _layer_norm(x, gamma, beta, eps):
    """LayerNorm in float32 (as Keras computes it under mixed precision), returned in x's dtype."""
    x32 = tf.cast(x, tf.float32)
    mean, var = tf.nn.moments(x32, axes=[-1], keepdims=True)
    y = (x32 - mean) * tf.math.rsqrt(var + eps) * gamma + beta
    return tf.cast(y, x.dtype)


def _gelu(z):
    return 0.5 * z * (1.0 + tf.math.erf(z * 0.7071067811865476))


def _gelu_slope(z):  # Phi(z) + z * phi(z)
    return 0.5 * (1.0 + tf.math.erf(z * 0.7071067811865476)) + z * tf.exp(-0.5 * z * z) * 0.3989422804014327


def _gelu_tanh(z):  # 0.5 * z * (1 + tanh(u)) = z * sigmoid(2u): no cancellation where tanh(u) is near -1
    return z * tf.sigmoid(1.5957691216057308 * (z + 0.044715 * z * z * z))


def _gelu_tanh_slope(z):
    s = tf.sigmoid(1.5957691216057308 * (z + 0.044715 * z * z * z))
    return s + z * s * (1.0 - s) * 1.5957691216057308 * (1.0 + 0.134145 * z * z)


def _bias_activation(name, value, slope):
    """act(x + b), computed in float32 in one XLA kernel, with a hand-written backward.

    Differentiating the XLA kernel instead makes its forward write out the float32 intermediates the
    gradient needs, then runs a backward kernel over them; this backward reads only x and b.
    """
    f32 = lambda t: tf.cast(t, tf.float32)  # noqa: E731

    @compiled
    def forward(x, b):
        return tf.cast(value(f32(x) + f32(b)), x.dtype)

    @compiled
    def backward(dy, x, b):
        dz = f32(dy) * slope(f32(x) + f32(b))
        return tf.cast(dz, x.dtype), tf.cast(tf.reduce_sum(dz, axis=0), b.dtype)

    @tf.RegisterGradient(f"BertMgpuBias{name}")
    def gradient(op, dy, *_):
        return (None, *backward(dy, op.inputs[1], op.inputs[2]))

    @calling_kernels
    def bias_activation(x, b):
        return with_gradient(f"BertMgpuBias{name}", forward(x, b), x, b)

    return bias_activation


bias_gelu_exact = _bias_activation("Gelu", _gelu, _gelu_slope)
bias_gelu_tanh = _bias_activation("GeluTanh", _gelu_tanh, _gelu_tanh_slope)
bias_relu = _bias_activation("Relu", tf.nn.relu, lambda z: tf.cast(z > 0, z.dtype))


@compiled
def residual_norm(x, b, mask, residual, gamma, beta, eps):
    """LayerNorm(residual + dropout(x + b)); mask is the dropout mask (ones when not training)."""
    return _layer_norm((x + b) * mask + residual, gamma, beta, eps)


@compiled
def norm(x, gamma, beta, eps):
    return _layer_norm(x, gamma, beta, eps)


@compiled
def bias_dropout_residual(x, b, mask, residual):
    return (x + b) * mask + residual


@dataclasses.dataclass(frozen=True)
class Activation:
    """One `hidden_act`: Keras' function (keras-hub's layers run it), the fused training kernel
    `fused(x, b) = act(x + b)`, and the form used for inference, which grappler folds into oneDNN's
    matmul with its bias (no pass of its own); training keeps the fused kernel, whose backward needs
    the pre-activation that the folded matmul does not give. `portable` is written with ops every
    converter takes: TensorFlow's exact GELU is an `Erfc`, which ONNX Runtime has no kernel for."""

    keras: Callable
    fused: Callable
    inference: Callable
    portable: Callable


_exact = Activation(lambda x: keras.activations.gelu(x, approximate=False), bias_gelu_exact,
                    lambda z: tf.nn.gelu(z, approximate=False), _gelu)
_tanh = Activation(lambda x: keras.activations.gelu(x, approximate=True), bias_gelu_tanh,
                   lambda z: tf.nn.gelu(z, approximate=True), _gelu_tanh)

# Hugging Face's names: "gelu" is the exact (erf) GELU; google-bert's code and keras-hub's BertBackbone
# use the tanh approximation ("gelu_new", "gelu_pytorch_tanh").
ACTIVATIONS = {"gelu": _exact, "gelu_new": _tanh, "gelu_pytorch_tanh": _tanh,
               "relu": Activation(keras.activations.relu, bias_relu, tf.nn.relu, tf.nn.relu)}


@compiled
def _logsumexp(logits):
    x = tf.cast(logits, tf.float32)
    top = tf.reduce_max(x, axis=-1)
    return top + tf.math.log(tf.reduce_sum(tf.exp(x - top[:, None]), axis=-1))


@compiled
def _xent_backward(dloss, logits, lse, labels):
    x = tf.cast(logits, tf.float32)
    hit = tf.cast(tf.equal(tf.range(tf.shape(x)[1])[None, :], labels[:, None]), tf.float32)
    return tf.cast((tf.exp(x - lse[:, None]) - hit) * dloss[:, None], logits.dtype)


@tf.RegisterGradient("BertMgpuSparseXent")
def _xent_gradient(op, dloss, *_):
    _, logits, labels, lse = op.inputs
    return None, _xent_backward(dloss, logits, lse, labels), None, None


@calling_kernels
def sparse_xent(labels, logits):
    """Cross-entropy [N] of logits [N, vocab] (any float dtype) against integer labels [N], in float32.

    What `sparse_categorical_crossentropy(from_logits=True)` computes, without a float32 copy of the
    logits: one kernel reads them for the log-sum-exp, and the backward is one kernel writing the
    gradient in the logits' dtype.
    """
    labels = tf.cast(labels, tf.int32)
    lse = _logsumexp(logits)
    picked = tf.cast(tf.gather(logits, labels, batch_dims=1), tf.float32)
    return with_gradient("BertMgpuSparseXent", lse - picked, logits, labels, lse)
