"""A faster forward pass for keras-hub's BertBackbone, computed from the backbone's own variables.

keras-hub builds each attention projection as an EinsumDense (a BatchMatMul per projection and per
gradient), applies dropout with a float32 uniform per element and runs GELU and LayerNorm as chains of
separate elementwise kernels. On CPUs that is most of a training step.
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

`recompute=True` (`--recompute`) keeps only each layer's input for the backward pass and computes the
layer again there (`keras.remat`, TensorFlow's `recompute_grad`): about one more forward pass a step
for activations that no longer grow with the layer count. A layer's dropout seeds are drawn before it,
so the recomputed layer drops what the first pass dropped and the gradients are the same.

Within `tapped()` each call also hands out its hidden states and attention scores (distillation's
intermediate losses, TinyBERT's and MiniLM's), without another output that every head would carry.

Example:
    encoder = FusedBertEncoder(build_backbone(config, "mixed_bfloat16"))
    outputs = encoder({"token_ids": ids, "segment_ids": segs, "padding_mask": mask}, training=True)
"""

import contextlib
import functools
import threading

import keras
import tensorflow as tf

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.model import kernels
from bert_mgpu.model.kernels import ACTIVATIONS

# Additive bias of a padded key: exp() of it is 0, and float16 cannot hold -1e9.
_NEG = {"float16": -3e4}


_TAPS = threading.local()  # per thread: MirroredStrategy runs each tower's step in a thread of its own


class Tap:
    """One encoder call's inner tensors: `hidden` [embeddings' output, then each layer's], each [B, L, hidden];
    `scores` each layer's attention scores before the softmax [B, heads, L, L], padded keys at a large
    negative bias (empty unless asked for); `padding_mask` [B, L]."""

    def __init__(self, padding_mask, scores):
        self.padding_mask, self.hidden, self.scores, self.want_scores = padding_mask, [], [], scores


@contextlib.contextmanager
def word_embeddings(change):
    """Within, in this thread: each call of a fused encoder passes the word embeddings it looked up [B, L,
    hidden] through `change(rows) -> rows` before adding the position and segment embeddings (adversarial
    training's perturbation, model/adversarial.py)."""
    before = getattr(_TAPS, "words", None)
    _TAPS.words = change
    try:
        yield
    finally:
        _TAPS.words = before


@contextlib.contextmanager
def tapped(scores=False):
    """Within, in this thread: each call of a fused encoder appends a `Tap` to the list yielded (its attention
    scores too with `scores`). The last layer then computes every row, not only those the head reads."""
    calls, before = [], getattr(_TAPS, "state", None)
    _TAPS.state = (calls, scores)
    try:
        yield calls
    finally:
        _TAPS.state = before


def _read(*variables):
    """Variables' values as tensors: the fused kernels are shared by every model, so they must take
    values, not variables (a traced function may otherwise keep the first model's variables)."""
    return [tf.convert_to_tensor(v.value) for v in variables]


class FusedBertEncoder(keras.layers.Layer):
    """Runs `backbone` (a keras-hub BertBackbone) -> {"sequence_output", "pooled_output"}, faster."""

    def __init__(self, backbone, pooled_only=False, recompute=False, **kwargs):
        """pooled_only: the caller uses "pooled_output" alone (a classifier); see `call`.
        recompute: recompute each layer in the backward pass instead of keeping its activations."""
        super().__init__(dtype=backbone.dtype_policy, name=kwargs.pop("name", "fused_encoder"), **kwargs)
        self.backbone, self.pooled_only, self.recompute = backbone, pooled_only, recompute
        self.rate = float(backbone.dropout)
        self.seed_generator = keras.random.SeedGenerator(1234, name="dropout_seed")
        # build_backbone records the config's hidden_act; keras-hub's own default is the tanh GELU.
        self.activation = ACTIVATIONS[getattr(backbone, "hidden_act", "gelu_new")]
        self._frozen = _Frozen()  # see frozen_weights()
        self.adapters = None  # LoRA's (model/lora.py), added to the kernels they name

    def compute_output_spec(self, inputs, training=False):
        ids = inputs["token_ids"]
        hidden = self.backbone.hidden_dim
        rows = inputs["output_positions"].shape if "output_positions" in inputs else ids.shape
        rows = (ids.shape[0], 0) if self.pooled_only else rows
        return {"sequence_output": keras.KerasTensor((*rows, hidden), self.compute_dtype),
                "pooled_output": keras.KerasTensor((ids.shape[0], hidden), self.compute_dtype)}

    def _dropping(self, training):
        return bool(training) and self.rate > 0.0

    def _seed(self):
        return tf.cast(self.seed_generator.next(), tf.int32)

    def _mask(self, shape, training, seed=None):
        if not self._dropping(training):
            return tf.ones([], self.compute_dtype)
        return kernels.dropout_mask(shape, self.rate, self._seed() if seed is None else seed, self.compute_dtype)

    def _w(self, variable, shape=None):
        """The variable's value in the compute dtype: a tensor even when no cast is needed (see `_read`)."""
        copy = self._frozen.copies.get(id(variable)) if self._frozen.active else None
        v = _unstored(copy, self.compute_dtype) if copy is not None else tf.cast(_read(variable)[0],
                                                                                 self.compute_dtype)
        return v if shape is None else tf.reshape(v, shape)

    def _kernel(self, index, parts, target, shape=None):
        """Layer `index`'s `target` kernel in the compute dtype, with its LoRA delta added where it has one."""
        w = self._w(getattr(parts, target).kernel, shape)
        if self.adapters is None or target not in self.adapters.spec.targets:
            return w
        return w + tf.cast(tf.reshape(self.adapters.delta(index, target), tf.shape(w)), w.dtype)

    def _cast_variables(self):
        bb = self.backbone
        dense = [bb.pooled_dense] if getattr(bb, "has_pooler", True) else []
        dense += [bb.embeddings_projection] if hasattr(bb, "embeddings_projection") else []
        for p in map(_compat.transformer_parts, bb.transformer_layers):  # not kept: Keras would track them
            dense += [p.query, p.key, p.value, p.attention_output, p.intermediate, p.output]
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
        # would have Keras cast the whole word-embedding table to bfloat16 first.
        words = bb.token_embedding(ids)
        change = getattr(_TAPS, "words", None)
        if change is not None:
            words = change(words)
        x = words + bb.position_embedding.position_embeddings[:length] + bb.segment_embedding(segments)
        ln = bb.embeddings_layer_norm
        x = kernels.norm(tf.cast(x, dtype), *_read(ln.gamma, ln.beta), ln.epsilon)
        x = x * self._mask(tf.shape(x), training)
        project = getattr(bb, "embeddings_projection", None)  # ELECTRA's, when its embeddings are narrower
        if project is not None:
            x = tf.matmul(tf.reshape(x, [tokens, -1]), self._w(project.kernel)) + self._w(project.bias)
        x = tf.reshape(x, [tokens, hidden])

        neg = tf.constant(_NEG.get(dtype, -1e9), dtype)
        bias = tf.where(tf.cast(inputs["padding_mask"], tf.bool), tf.constant(0.0, dtype), neg)
        bias = tf.reshape(bias, [batch, 1, 1, length])
        scale = tf.constant(1.0 / size ** 0.5, dtype)
        rows = inputs.get("output_positions")
        if self.pooled_only:
            rows = tf.zeros([batch, 0], tf.int32)
        if rows is not None:  # [CLS] first, for the pooler
            rows = tf.concat([tf.zeros([batch, 1], rows.dtype), rows], axis=1)
        tap = self._tap(inputs["padding_mask"], training)
        if tap:
            tap.hidden.append(tf.reshape(x, [batch, length, hidden]))
        schedule = getattr(bb, "schedule", range(len(bb.transformer_layers)))  # ALBERT's passes of shared layers
        last = len(schedule) - 1
        for i, index in enumerate(schedule):
            layer = bb.transformer_layers[index]
            # The layer's three dropout seeds, drawn in the order the layer uses them.
            seeds = [self._seed() for _ in range(3)] if self._dropping(training) else [None] * 3

            def run(x, index=index, layer=layer, seeds=seeds, rows=rows if i == last and not tap else None):
                return self._layer(index, layer, _compat.transformer_parts(layer), x, bias, scale, batch, length,
                                   heads, size, training, rows, seeds, tap.scores if tap and tap.want_scores else None)

            x = keras.remat(run)(x) if self.recompute and training else run(x)
            if tap:
                tap.hidden.append(tf.reshape(x, [batch, length, hidden]))
        if tap and rows is not None:  # every row was computed: keep those asked for
            x = tf.reshape(tf.gather(tap.hidden[-1], rows, batch_dims=1), [-1, hidden])

        sequence = tf.reshape(x, [batch, -1, hidden])
        if getattr(bb, "has_pooler", True):
            pool = bb.pooled_dense
            pooled = tf.tanh(tf.matmul(sequence[:, 0], self._w(pool.kernel)) + self._w(pool.bias))
        else:  # ELECTRA: [CLS]'s output, as google-research/electra fine-tunes
            pooled = sequence[:, 0]
        return {"sequence_output": sequence if rows is None else sequence[:, 1:], "pooled_output": pooled}

    def _tap(self, padding_mask, training):
        """This call's Tap when inside `tapped()` (in this thread), else None."""
        state = getattr(_TAPS, "state", None)
        if state is None:
            return None
        calls, scores = state
        if scores and self.recompute and training:
            raise UserError("attention scores cannot be handed out by recomputed layers (--recompute)")
        calls.append(Tap(padding_mask, scores))
        return calls[-1]

    def _layer(self, index, layer, parts, x, bias, scale, batch, length, heads, size, training, rows=None,
               seeds=(None, None, None), scores_out=None):
        """One encoder layer on x [B*L, hidden]; with rows [B, R], only those rows' outputs [B*R, hidden].
        seeds: its attention-probability, attention-output and feed-forward dropout seeds (None: drawn).
        scores_out: a list the attention scores [B, heads, L, L] are appended to."""
        p, hidden = parts, heads * size
        pre_ln = layer.normalize_first
        ln1, ln2 = p.attention_norm, p.output_norm
        w_qkv = tf.concat([self._kernel(index, p, t, [hidden, hidden]) for t in ("query", "key", "value")], axis=1)
        b_qkv = tf.concat([self._w(d.bias, [hidden]) for d in (p.query, p.key, p.value)], axis=0)

        h = kernels.norm(x, *_read(ln1.gamma, ln1.beta), ln1.epsilon) if pre_ln else x
        if rows is None:
            qkv = _matmul_bias(h, w_qkv, b_qkv, fold=not training and _cpu_onednn())
            qkv = tf.transpose(tf.reshape(qkv, [batch, length, 3, heads, size]), [2, 0, 3, 1, 4])
            q, k, v = tf.unstack(qkv)  # unstack, not qkv[i]: a slice's gradient writes a full-size zero tensor
        else:
            def pick(t):
                return tf.reshape(tf.gather(tf.reshape(t, [batch, length, hidden]), rows, batch_dims=1), [-1, hidden])

            w_q, w_kv = tf.split(w_qkv, [hidden, 2 * hidden], axis=1)
            b_q, b_kv = tf.split(b_qkv, [hidden, 2 * hidden])
            kv = tf.transpose(tf.reshape(tf.matmul(h, w_kv) + b_kv, [batch, length, 2, heads, size]),
                              [2, 0, 3, 1, 4])
            k, v = tf.unstack(kv)
            x, h = pick(x), pick(h)
            q = tf.transpose(tf.reshape(tf.matmul(h, w_q) + b_q, [batch, -1, heads, size]), [0, 2, 1, 3])
        q = q * scale
        scores = tf.matmul(q, k, transpose_b=True) + bias  # [B, H, L, L]
        if scores_out is not None:
            scores_out.append(scores)
        if self._dropping(training):
            probs = kernels.softmax_dropout(scores, self.rate, self._seed() if seeds[0] is None else seeds[0])
        else:
            probs = tf.nn.softmax(scores)
        context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [-1, hidden])
        out = tf.matmul(context, self._kernel(index, p, "attention_output", [hidden, hidden]))
        mask = self._mask(tf.shape(out), training, seeds[1])
        b_out = self._w(p.attention_output.bias)
        if pre_ln:
            x = kernels.bias_dropout_residual(out, b_out, mask, x)
            h = kernels.norm(x, *_read(ln2.gamma, ln2.beta), ln2.epsilon)
        else:
            x = h = kernels.residual_norm(out, b_out, mask, x, *_read(ln1.gamma, ln1.beta), ln1.epsilon)

        inner, outer = p.intermediate, p.output
        if training:
            h = self.activation.fused(tf.matmul(h, self._kernel(index, p, "intermediate")), self._w(inner.bias))
        else:
            h = self.activation.inference(tf.nn.bias_add(tf.matmul(h, self._kernel(index, p, "intermediate")),
                                                         self._w(inner.bias)))
        out = tf.matmul(h, self._kernel(index, p, "output"))
        mask = self._mask(tf.shape(out), training, seeds[2])
        if pre_ln:
            return kernels.bias_dropout_residual(out, self._w(outer.bias), mask, x)
        return kernels.residual_norm(out, self._w(outer.bias), mask, x, *_read(ln2.gamma, ln2.beta), ln2.epsilon)


def _matmul_bias(x, w, b, fold):
    """x @ w + b. With `fold` (inference under oneDNN) the bias rides in the matmul: x padded with 32 columns
    of ones against the weight with the bias row and 31 zero rows (the depth stays a multiple of 32). With the
    bias fused, oneDNN leaves its AMX matmul for a slower inner product (NOTES item 53). Padded, not
    concatenated with constants: TensorFlow folds a constant of the batch's shape into the traced function,
    which then holds it for its life (item 61)."""
    if not fold:
        return tf.matmul(x, w) + b
    w = tf.pad(tf.concat([w, b[None]], axis=0), [[0, 31], [0, 0]])
    return tf.matmul(tf.pad(x, [[0, 0], [0, 32]], constant_values=1), w)


def _cpu_onednn():
    """Whether the matmuls run on oneDNN's CPU kernels: no GPU (where the bias rides in cuBLAS's matmul
    as it is) and oneDNN on."""
    return _compat.onednn_enabled() and not tf.config.list_logical_devices("GPU")


def set_recompute(model, on):
    """`--recompute`: every fused encoder of `model` recomputes its layers in the backward pass (or not)."""
    encoders = [layer for layer in _compat.sublayers(model) if isinstance(layer, FusedBertEncoder)]
    if on and not encoders:
        raise UserError("--recompute needs the fused encoder: drop --fused_encoder=false")
    for encoder in encoders:
        encoder.recompute = bool(on)


class _Frozen:
    """Copies of an encoder's weights in its compute dtype, and whether traced calls read them."""

    def __init__(self):
        self.copies, self.active, self.refresh = {}, False, None


# How a copy is stored: bfloat16 as float16 holding the same 16 bits, because MultiWorkerMirroredStrategy
# broadcasts every new variable's initial value with CollectiveBcastSend, which has no bfloat16 kernel.
_STORED = {"bfloat16": "float16"}


def _unstored(copy, dtype):
    value = tf.convert_to_tensor(copy)
    return value if value.dtype == dtype else tf.bitcast(value, dtype)


def _refresh(pairs, dtype):
    return [copy.assign(tf.bitcast(tf.cast(v.value, dtype), copy.dtype) if copy.dtype != dtype
                        else tf.cast(v.value, dtype)) for v, copy in pairs]


def _refresher(pairs, dtype):
    """One function per encoder. A partial, not a lambda: TensorFlow counts traces by the Python code they
    come from, and a process that builds a sixth model (a notebook, a sweep) got its retracing warning."""
    return tf.function(functools.partial(_refresh, pairs, dtype), autograph=False)


@contextlib.contextmanager
def frozen_weights(model):
    """Within: a model's fused encoders read their weights cast once, not cast again on every call.

    For prediction and evaluation, where the weights do not change: under mixed precision every batch
    would cast each weight matrix to the compute dtype again. Entering casts them into copies made beside
    the variables (under the model's distribution strategy, so each tower has its own); functions traced
    inside read the copies.
    Enter it around every call of such a function, as `Trainer.predict_logits` does: entering is what
    brings the copies up to date. The copies stay allocated (the encoder's matrices in bfloat16: 21 MB for
    MiniLM-L6, 170 MB for BERT-base, per tower).
    """
    encoders = [layer for layer in _compat.sublayers(model) if isinstance(layer, FusedBertEncoder)]
    for encoder in encoders:
        frozen = encoder._frozen
        if frozen.refresh is None:
            stored = _STORED.get(encoder.compute_dtype, encoder.compute_dtype)
            pairs = [(v, tf.Variable(tf.zeros(v.shape, stored), trainable=False)) for v in encoder._cast_variables()]
            frozen.copies = {id(v): copy for v, copy in pairs}
            frozen.refresh = _refresher(pairs, encoder.compute_dtype)
        frozen.refresh()
        frozen.active = True
    try:
        yield
    finally:
        for encoder in encoders:
            encoder._frozen.active = False
