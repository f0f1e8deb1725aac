"""A faster forward pass for keras-hub's BertBackbone, computed from the backbone's own variables.

keras-hub builds each attention projection as an EinsumDense (a BatchMatMul per projection and per
gradient), applies dropout with a float32 uniform per element and runs GELU and LayerNorm as chains of
separate elementwise kernels. On CPUs that is most of a training step (profile in benchmarks/NOTES.md).
This layer computes the same function with:
  - one [tokens, 3*hidden] matmul for query, key and value, and plain 2-D matmuls everywhere else;
  - the padding mask turned into one additive bias, shared by every layer;
  - dropout from a counter-based hash, 32 bits an element (rate exact to 2**-32), not a float32 uniform;
    on the attention probabilities, mask and multiply in one kernel, and one backward kernel that
    recomputes the mask and takes softmax's backward with it;
  - bias+GELU and bias+dropout+residual+LayerNorm each compiled by XLA into one fused kernel, while the
    matmuls and the softmax stay on TensorFlow's oneDNN kernels (XLA's CPU matmuls are slower here).

The variables are the backbone's, so checkpoints, optimizers and `model.backbone` are unchanged, and
`BertBackbone(inputs)` and `FusedBertEncoder(backbone)(inputs)` agree to float rounding (tested).

Example:
    encoder = FusedBertEncoder(build_backbone(config, "mixed_bfloat16"))
    outputs = encoder({"token_ids": ids, "segment_ids": segs, "padding_mask": mask}, training=True)
"""

import contextlib

import keras
import tensorflow as tf

# Additive bias of a padded key: exp() of it is 0, and float16 cannot hold -1e9.
_NEG = {"float16": -3e4}


def _mix64(z):
    """SplitMix64's finalizer: a bijection of uint64 whose every output bit depends on every input bit."""
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 30)) * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 27)) * tf.constant(0x94D049BB133111EB, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, 31))


def _keep(shape, rate, seed):
    """Bool mask of `shape`, each element kept with probability 1 - rate (exact to 2**-32).

    Counter-based: element i's 32 bits are half of SplitMix64's output for counter i // 2 under a key
    mixed from `seed` (int32 [2]). Nothing is stored between calls, and the same seed gives the same
    mask, which is how the dropout gradient below recomputes it. TensorFlow's stateless Philox drew
    16 bits an element at 4x the time (benchmarks/NOTES.md, item 10).
    """
    n = tf.reduce_prod(shape)
    key = _mix64(tf.bitcast(tf.cast(seed, tf.int32), tf.uint64))
    counter = tf.cast(tf.range((n + 1) // 2, dtype=tf.int64), tf.uint64)
    bits = tf.reshape(tf.bitcast(_mix64(counter * tf.constant(0x9E3779B97F4A7C15, tf.uint64) + key), tf.uint32),
                      [-1])[:n]
    threshold = tf.cast(tf.cast(rate, tf.float64) * 2.0**32, tf.uint32)
    return tf.reshape(bits >= threshold, shape)


@tf.function(jit_compile=True)
def _dropout_mask(shape, rate, seed, dtype):
    """1/(1-rate) (rounded to dtype) where kept, 0 where dropped: for the fused kernels that take a mask."""
    return tf.where(_keep(shape, rate, seed), tf.constant(1.0 / (1.0 - rate), dtype), tf.constant(0.0, dtype))


@tf.function(jit_compile=True)
def _dropout_kernel(x, rate, seed):
    scaled = tf.cast(tf.cast(x, tf.float32) / (1.0 - rate), x.dtype)
    return tf.where(_keep(tf.shape(x), rate, seed), scaled, tf.zeros_like(x))


@tf.function(jit_compile=True)
def _softmax_dropout_backward(dy, probs, rate, seed):
    """d scores of dropout(softmax(scores)): the mask recomputed from `seed`, then softmax's backward
    probs * (dp - rowsum(dp * probs)), in float32, in one kernel (autodiff ran the dropout's kernel
    and four passes of TensorFlow ops, in bfloat16 under mixed precision; NOTES.md, item 27)."""
    dp = tf.where(_keep(tf.shape(dy), rate, seed), tf.cast(dy, tf.float32) / (1.0 - rate), 0.0)
    p = tf.cast(probs, tf.float32)
    return tf.cast(p * (dp - tf.reduce_sum(dp * p, axis=-1, keepdims=True)), dy.dtype)


@tf.RegisterGradient("BertMgpuSoftmaxDropout")
def _softmax_dropout_gradient(op, dy, *_):
    _, _, probs, rate, seed = op.inputs
    return None, _softmax_dropout_backward(dy, probs, rate, seed), None, None, None


@tf.function
def _softmax_dropout(scores, rate, seed):
    """dropout(softmax(scores)) over the last axis, no mask kept; the backward is
    `_softmax_dropout_backward`, which recomputes the mask from the same seed."""
    probs = tf.nn.softmax(scores)
    rate = tf.constant(rate, tf.float32)
    return with_gradient("BertMgpuSoftmaxDropout", _dropout_kernel(probs, rate, seed), scores, probs, rate, seed)


def with_gradient(name, y, *inputs):
    """y as a function of `inputs` whose gradient is the one registered as `name`, not autodiff's.

    A gradient override on an identity, registered once at import: `tf.custom_gradient` would register
    a new gradient closure per trace, and those keep traced steps alive (benchmarks/NOTES.md, item 7).
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
    gradient needs, then runs a backward kernel over them: GELU on [4096, 1536] in bfloat16 took
    12.8 ms forward and backward, against 7 ms this way, whose backward reads only x and b
    (benchmarks/NOTES.md, item 8).
    """
    f32 = lambda t: tf.cast(t, tf.float32)  # noqa: E731

    @tf.function(jit_compile=True)
    def forward(x, b):
        return tf.cast(value(f32(x) + f32(b)), x.dtype)

    @tf.function(jit_compile=True)
    def backward(dy, x, b):
        dz = f32(dy) * slope(f32(x) + f32(b))
        return tf.cast(dz, x.dtype), tf.cast(tf.reduce_sum(dz, axis=0), b.dtype)

    @tf.RegisterGradient(f"BertMgpuBias{name}")
    def gradient(op, dy, *_):
        return (None, *backward(dy, op.inputs[1], op.inputs[2]))

    @tf.function
    def bias_activation(x, b):
        return with_gradient(f"BertMgpuBias{name}", forward(x, b), x, b)

    return bias_activation


_bias_gelu_exact = _bias_activation("Gelu", _gelu, _gelu_slope)
_bias_gelu_tanh = _bias_activation("GeluTanh", _gelu_tanh, _gelu_tanh_slope)
_bias_relu = _bias_activation("Relu", tf.nn.relu, lambda z: tf.cast(z > 0, z.dtype))


@tf.function(jit_compile=True)
def _residual_norm(x, b, mask, residual, gamma, beta, eps):
    """LayerNorm(residual + dropout(x + b)); mask is the dropout mask (ones when not training)."""
    return _layer_norm((x + b) * mask + residual, gamma, beta, eps)


@tf.function(jit_compile=True)
def _norm(x, gamma, beta, eps):
    return _layer_norm(x, gamma, beta, eps)


@tf.function(jit_compile=True)
def _bias_dropout_residual(x, b, mask, residual):
    return (x + b) * mask + residual


# For inference, the same activations as TensorFlow ops that grappler folds into oneDNN's matmul with
# its bias (one _MklNativeFusedMatMul, no pass of its own; benchmarks/NOTES.md, item 18). Training keeps
# the XLA kernels: their backward needs the pre-activation, which the folded matmul does not give.
_INFERENCE = {_bias_gelu_exact: lambda z: tf.nn.gelu(z, approximate=False),
              _bias_gelu_tanh: lambda z: tf.nn.gelu(z, approximate=True), _bias_relu: tf.nn.relu}


def _activation_kernel(layer):
    """The fused bias+activation matching the Dense layer's activation (set from the BERT config)."""
    act = layer.activation
    probe = tf.constant([-1.5, -0.3, 0.4, 2.0])
    for fn in (_bias_gelu_exact, _bias_gelu_tanh, _bias_relu):
        if bool(tf.reduce_all(tf.abs(fn(probe, tf.zeros([4])) - act(probe)) < 1e-6)):
            return fn
    raise ValueError(f"no fused kernel for activation {act}")


def _read(*variables):
    """Variables' values as tensors: the fused kernels are shared by every model, so they must take
    values, not variables (a traced function may otherwise keep the first model's variables)."""
    return [tf.convert_to_tensor(v.value) for v in variables]


class FusedBertEncoder(keras.layers.Layer):
    """Runs `backbone` (a keras-hub BertBackbone) -> {"sequence_output", "pooled_output"}, faster."""

    def __init__(self, backbone, pooled_only=False, **kwargs):
        """pooled_only: the caller uses "pooled_output" alone (a classifier); see `call`."""
        super().__init__(dtype=backbone.dtype_policy, name=kwargs.pop("name", "fused_encoder"), **kwargs)
        self.backbone, self.pooled_only = backbone, pooled_only
        self.rate = float(backbone.dropout)
        self.seed_generator = keras.random.SeedGenerator(1234, name="dropout_seed")
        self._kernels = [_activation_kernel(layer._feedforward_intermediate_dense)
                         for layer in backbone.transformer_layers]
        self._frozen = _Frozen()  # see frozen_weights()

    def compute_output_spec(self, inputs, training=False):
        ids = inputs["token_ids"]
        hidden = self.backbone.hidden_dim
        rows = inputs["output_positions"].shape if "output_positions" in inputs else ids.shape
        rows = (ids.shape[0], 0) if self.pooled_only else rows
        return {"sequence_output": keras.KerasTensor((*rows, hidden), self.compute_dtype),
                "pooled_output": keras.KerasTensor((ids.shape[0], hidden), self.compute_dtype)}

    def _mask(self, shape, training):
        if not training or self.rate == 0.0:
            return tf.ones([], self.compute_dtype)
        seed = tf.cast(self.seed_generator.next(), tf.int32)
        return _dropout_mask(shape, self.rate, seed, self.compute_dtype)

    def _w(self, variable, shape=None):
        """The variable's value in the compute dtype: a tensor even when no cast is needed (see `_read`)."""
        copy = self._frozen.copies.get(id(variable)) if self._frozen.active else None
        v = tf.convert_to_tensor(copy) if copy is not None else tf.cast(_read(variable)[0], self.compute_dtype)
        return v if shape is None else tf.reshape(v, shape)

    def _cast_variables(self):
        bb = self.backbone
        dense = [bb.pooled_dense]
        for layer in bb.transformer_layers:
            att = layer._self_attention_layer
            dense += [att._query_dense, att._key_dense, att._value_dense, att._output_dense,
                      layer._feedforward_intermediate_dense, layer._feedforward_output_dense]
        return [v for d in dense for v in (d.kernel, d.bias) if v.dtype != self.compute_dtype]

    def call(self, inputs, training=False):
        """inputs: token_ids, segment_ids, padding_mask [B, L]; optionally output_positions [B, P].

        With output_positions (or pooled_only, which means P = 0), "sequence_output" is [B, P, hidden] at
        those positions only: the last layer then computes queries, attention output and feed-forward for
        those rows (and [CLS], for the pooler) alone, since no other row of it reaches a loss. For a
        classifier (P = 0) or a masked LM (P = predictions) that skips most of one layer with the same
        results.
        """
        bb, dtype = self.backbone, self.compute_dtype
        ids, segments = inputs["token_ids"], inputs["segment_ids"]
        batch, length, hidden = tf.shape(ids)[0], tf.shape(ids)[1], bb.hidden_dim
        heads = bb.num_heads
        size = hidden // heads
        tokens = batch * length

        # The embedding layers gather float32 rows and cast them. Gathering from the variable here
        # would have Keras cast the whole word-embedding table to bfloat16 first (NOTES.md, item 14).
        x = (bb.token_embedding(ids) + bb.position_embedding.position_embeddings[:length]
             + bb.segment_embedding(segments))
        ln = bb.embeddings_layer_norm
        x = _norm(tf.cast(x, dtype), *_read(ln.gamma, ln.beta), ln.epsilon)
        x = tf.reshape(x * self._mask(tf.shape(x), training), [tokens, hidden])

        neg = tf.constant(_NEG.get(dtype, -1e9), dtype)
        bias = tf.where(tf.cast(inputs["padding_mask"], tf.bool), tf.constant(0.0, dtype), neg)
        bias = tf.reshape(bias, [batch, 1, 1, length])
        scale = tf.constant(1.0 / size ** 0.5, dtype)
        rows = inputs.get("output_positions")
        if self.pooled_only:
            rows = tf.zeros([batch, 0], tf.int32)
        if rows is not None:  # [CLS] first, for the pooler
            rows = tf.concat([tf.zeros([batch, 1], rows.dtype), rows], axis=1)
        last = len(bb.transformer_layers) - 1
        for i, (layer, act) in enumerate(zip(bb.transformer_layers, self._kernels)):
            x = self._layer(layer, act, x, bias, scale, batch, length, heads, size, training,
                            rows if i == last else None)

        sequence = tf.reshape(x, [batch, -1, hidden])
        pool = bb.pooled_dense
        pooled = tf.tanh(tf.matmul(sequence[:, 0], self._w(pool.kernel)) + self._w(pool.bias))
        return {"sequence_output": sequence if rows is None else sequence[:, 1:], "pooled_output": pooled}

    def _layer(self, layer, act, x, bias, scale, batch, length, heads, size, training, rows=None):
        """One encoder layer on x [B*L, hidden]; with rows [B, R], only those rows' outputs [B*R, hidden]."""
        att, hidden = layer._self_attention_layer, heads * size
        pre_ln = layer.normalize_first
        ln1, ln2 = layer._self_attention_layer_norm, layer._feedforward_layer_norm
        w_qkv = tf.concat([self._w(p.kernel, [hidden, hidden])
                           for p in (att._query_dense, att._key_dense, att._value_dense)], axis=1)
        b_qkv = tf.concat([self._w(p.bias, [hidden])
                           for p in (att._query_dense, att._key_dense, att._value_dense)], axis=0)

        h = _norm(x, *_read(ln1.gamma, ln1.beta), ln1.epsilon) if pre_ln else x
        if rows is None:
            qkv = tf.matmul(h, w_qkv) + b_qkv
            qkv = tf.transpose(tf.reshape(qkv, [batch, length, 3, heads, size]), [2, 0, 3, 1, 4])
            q, k, v = tf.unstack(qkv)  # unstack, not qkv[i]: a slice's gradient writes a full-size zero tensor
        else:
            pick = lambda t: tf.reshape(tf.gather(tf.reshape(t, [batch, length, hidden]), rows, batch_dims=1),
                                        [-1, hidden])  # noqa: E731
            w_q, w_kv = tf.split(w_qkv, [hidden, 2 * hidden], axis=1)
            b_q, b_kv = tf.split(b_qkv, [hidden, 2 * hidden])
            kv = tf.transpose(tf.reshape(tf.matmul(h, w_kv) + b_kv, [batch, length, 2, heads, size]),
                              [2, 0, 3, 1, 4])
            k, v = tf.unstack(kv)
            x, h = pick(x), pick(h)
            q = tf.transpose(tf.reshape(tf.matmul(h, w_q) + b_q, [batch, -1, heads, size]), [0, 2, 1, 3])
        q = q * scale
        scores = tf.matmul(q, k, transpose_b=True) + bias  # [B, H, L, L]
        if training and self.rate > 0.0:
            probs = _softmax_dropout(scores, self.rate, tf.cast(self.seed_generator.next(), tf.int32))
        else:
            probs = tf.nn.softmax(scores)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, hidden])
        out = tf.matmul(context, self._w(att._output_dense.kernel, [hidden, hidden]))
        mask = self._mask(tf.shape(out), training)
        b_out = self._w(att._output_dense.bias)
        if pre_ln:
            x = _bias_dropout_residual(out, b_out, mask, x)
            h = _norm(x, *_read(ln2.gamma, ln2.beta), ln2.epsilon)
        else:
            x = h = _residual_norm(out, b_out, mask, x, *_read(ln1.gamma, ln1.beta), ln1.epsilon)

        inner, outer = layer._feedforward_intermediate_dense, layer._feedforward_output_dense
        if training:
            h = act(tf.matmul(h, self._w(inner.kernel)), self._w(inner.bias))
        else:
            h = _INFERENCE[act](tf.nn.bias_add(tf.matmul(h, self._w(inner.kernel)), self._w(inner.bias)))
        out = tf.matmul(h, self._w(outer.kernel))
        mask = self._mask(tf.shape(out), training)
        if pre_ln:
            return _bias_dropout_residual(out, self._w(outer.bias), mask, x)
        return _residual_norm(out, self._w(outer.bias), mask, x, *_read(ln2.gamma, ln2.beta), ln2.epsilon)


class _Frozen:
    """Copies of an encoder's weights in its compute dtype, and whether traced calls read them."""

    def __init__(self):
        self.copies, self.active, self.refresh = {}, False, None


def _refresher(pairs):
    return tf.function(lambda: [copy.assign(tf.cast(v.value, copy.dtype)) for v, copy in pairs])


@contextlib.contextmanager
def frozen_weights(model):
    """Within: a model's fused encoders read their weights cast once, not cast again on every call.

    For prediction and evaluation, where the weights do not change: under mixed precision every batch
    cast each weight matrix to the compute dtype, 113 ms of a 2 s pass over the demo's dev set
    (benchmarks/NOTES.md, item 22). Entering casts them into copies made beside the variables (under the
    model's distribution strategy, so each tower has its own); functions traced inside read the copies.
    Enter it around every call of such a function, as `Trainer.predict_logits` does: entering is what
    brings the copies up to date. The copies stay allocated (the encoder's matrices in bfloat16: 21 MB for
    MiniLM-L6, 170 MB for BERT-base, per tower).
    """
    encoders = [layer for layer in model._flatten_layers() if isinstance(layer, FusedBertEncoder)]
    for encoder in encoders:
        frozen = encoder._frozen
        if frozen.refresh is None:
            pairs = [(v, tf.Variable(tf.zeros(v.shape, encoder.compute_dtype), trainable=False))
                     for v in encoder._cast_variables()]
            frozen.copies = {id(v): copy for v, copy in pairs}
            frozen.refresh = _refresher(pairs)
        frozen.refresh()
        frozen.active = True
    try:
        yield
    finally:
        for encoder in encoders:
            encoder._frozen.active = False
