"""The fused encoder computes keras-hub's BertBackbone from the same variables, and drops at `rate`."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_config

from bert_mgpu.model.fused_encoder import FusedBertEncoder
from bert_mgpu.model.kernels import (
    ACTIVATIONS,
    bias_gelu_exact,
    bias_gelu_tanh,
    bias_relu,
    dropout_mask,
    softmax_dropout,
)
from bert_mgpu.model.modeling import build_backbone


def _inputs(batch=3, length=12, seed=0):
    rng = np.random.default_rng(seed)
    lengths = [length, 7, 4][:batch]
    mask = np.arange(length)[None, :] < np.array(lengths)[:, None]
    return {"token_ids": np.where(mask, rng.integers(1, 30, (batch, length)), 0).astype("int32"),
            "segment_ids": (np.arange(length)[None, :] >= 3).astype("int32").repeat(batch, 0),
            "padding_mask": mask}


@pytest.mark.parametrize("ln_mode,act", [("post-ln", "gelu"), ("pre-ln", "gelu_new"), ("post-ln", "relu")])
def test_same_outputs_and_gradients_as_keras_hub(ln_mode, act):
    """Inference (the activation folded into the matmul) and training (the XLA kernels, dropout 0 here)."""
    backbone = build_backbone(tiny_config(30, encoder_ln_mode=ln_mode, hidden_act=act, hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0))
    fused = FusedBertEncoder(backbone)
    x = _inputs()
    real = x["padding_mask"]  # padded positions' outputs are not used by anything
    for training in (False, True):
        ref, out = backbone(x, training=training), fused(x, training=training)
        np.testing.assert_allclose(out["sequence_output"].numpy()[real], ref["sequence_output"].numpy()[real],
                                   atol=2e-5)
        np.testing.assert_allclose(out["pooled_output"], ref["pooled_output"], atol=2e-5)
    weights = np.random.default_rng(1).normal(size=ref["sequence_output"].shape) * real[..., None]

    def grads(fn):
        with tf.GradientTape() as tape:
            y = fn(x, training=True)
            loss = tf.reduce_sum(y["sequence_output"] * weights) + tf.reduce_sum(y["pooled_output"])
        return tape.gradient(loss, backbone.trainable_variables)

    for v, a, b in zip(backbone.trainable_variables, grads(fused), grads(backbone)):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), atol=1e-4, err_msg=v.path)


def test_same_outputs_under_mixed_bfloat16():
    backbone = build_backbone(tiny_config(30), "mixed_bfloat16")
    x = _inputs()
    ref, out = backbone(x), FusedBertEncoder(backbone)(x)
    assert out["sequence_output"].dtype == tf.bfloat16
    real = x["padding_mask"]
    err = np.abs(out["sequence_output"].numpy()[real].astype("float32")
                 - ref["sequence_output"].numpy()[real].astype("float32"))
    assert err.max() < 0.1 and err.mean() < 0.01


def test_every_hidden_act_computes_one_function_in_keras_training_and_inference():
    """For each hidden_act, Keras' function (keras-hub's layers), the fused training kernel and the folded
    inference form agree (GELU's exact and tanh forms differ by up to 1e-3 on this range)."""
    z = tf.linspace(-5.0, 5.0, 201)
    for name, act in ACTIVATIONS.items():
        fused = act.fused(z, tf.zeros([201])).numpy()
        np.testing.assert_allclose(act.inference(z).numpy(), fused, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(np.asarray(act.keras(z)), fused, atol=1e-6, err_msg=name)
    zero = tf.zeros([201])
    assert float(tf.reduce_max(tf.abs(bias_gelu_exact(z, zero) - bias_gelu_tanh(z, zero)))) > 1e-4


def test_a_bias_folded_into_its_matmul_gives_the_same_values():
    """Inference under oneDNN adds the query/key/value bias inside the matmul (a ones column, a bias row)."""
    from bert_mgpu.model.fused_encoder import _matmul_bias

    rng = np.random.default_rng(0)
    x, w, b = (rng.normal(size=s).astype(np.float32) for s in ([37, 24], [24, 72], [72]))
    np.testing.assert_allclose(_matmul_bias(x, w, b, fold=True), x @ w + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_matmul_bias(x, w, b, fold=False), x @ w + b, rtol=1e-5, atol=1e-5)
    low = [tf.cast(t, tf.bfloat16) for t in (x, w, b)]
    exact = tf.cast(low[0], tf.float32) @ tf.cast(low[1], tf.float32) + tf.cast(low[2], tf.float32)
    folded = tf.cast(_matmul_bias(*low, fold=True), tf.float32)
    assert folded.shape == (37, 72) and np.abs(folded - exact).max() <= 2 ** -7 * np.abs(exact).max()


def test_mixed_precision_never_casts_the_whole_embedding_table():
    """Each step gathers the rows it needs; a cast of the [vocab, hidden] table would read all of it."""
    backbone = build_backbone(tiny_config(30), "mixed_bfloat16")
    encoder = FusedBertEncoder(backbone)
    x = {k: tf.constant(v) for k, v in _inputs().items()}
    graph = tf.function(lambda: encoder(x, training=True)).get_concrete_function().graph
    casts = [op.inputs[0].shape.as_list() for op in graph.get_operations() if op.type == "Cast"]
    assert casts.count([3, 12, 32]) >= 2  # the word and segment rows gathered, then cast
    assert [30, 32] not in casts and [2, 32] not in casts  # the word and segment tables


def test_dropout_mask_rate_and_scale():
    mask = dropout_mask(tf.constant([64, 129, 31]), 0.1, tf.constant([5, 6]), tf.float32).numpy()
    assert mask.shape == (64, 129, 31)
    assert set(np.unique(mask)) == {0.0, np.float32(1 / 0.9)}
    dropped = float((mask == 0).mean())
    assert abs(dropped - 0.1) < 0.0024  # 256k draws: 4 standard deviations
    np.testing.assert_array_equal(mask, dropout_mask(tf.constant([64, 129, 31]), 0.1, tf.constant([5, 6]),
                                                      tf.float32))  # the same seed, the same mask


def test_dropout_masks_look_independent():
    """The hash's streams: no correlation between seeds one apart, between the two halves of one 64-bit
    draw (neighbouring elements), or along rows; odd sizes and rates other than 0.1 too."""
    n = 1 << 20
    sd = lambda p: 4 * (p * (1 - p) / n) ** 0.5  # noqa: E731  (4 standard deviations)
    a = dropout_mask(tf.constant([n]), 0.1, tf.constant([7, 0]), tf.float32).numpy() == 0
    b = dropout_mask(tf.constant([n]), 0.1, tf.constant([7, 1]), tf.float32).numpy() == 0
    assert abs((a & b).mean() - 0.01) < sd(0.01)
    assert abs((a[0::2] & a[1::2]).mean() - 0.01) < 2 * sd(0.01)
    assert abs((a[:-1] & a[1:]).mean() - 0.01) < sd(0.01)
    rows = a.reshape(1024, 1024)
    assert abs((rows[:-1] & rows[1:]).mean() - 0.01) < sd(0.01)
    for rate, size in ((0.5, 99_999), (0.02, 1_000_001)):
        m = dropout_mask(tf.constant([size]), rate, tf.constant([1, 2]), tf.float32).numpy()
        assert abs((m == 0).mean() - rate) < 4 * (rate * (1 - rate) / size) ** 0.5


@pytest.mark.parametrize("length", [16, 12])
def test_attention_softmax_dropout_backward_reuses_the_forward_mask(length):
    """The hand-written backward equals autodiff of softmax then the same mask, in float32 and bfloat16."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(scale=2.0, size=(4, 3, length, length)), tf.float32)
    dy = tf.constant(rng.normal(size=(4, 3, length, length)), tf.float32)
    for dtype, tol in ((tf.float32, 1e-5), (tf.bfloat16, 2e-2)):
        for run in (lambda f: f(), lambda f: tf.function(f)()):
            def step():
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = softmax_dropout(tf.cast(x, dtype), 0.25, tf.constant([3, 9]))  # noqa: B023
                return y, tape.gradient(y, x, output_gradients=tf.cast(dy, dtype))  # noqa: B023

            y, dx = run(step)
            kept = y.numpy() != 0  # softmax is positive: a zero is a dropped element
            assert 0.2 < 1 - kept.mean() < 0.3
            with tf.GradientTape() as tape:
                tape.watch(x)
                ref = tf.where(kept, tf.nn.softmax(x) / 0.75, 0.0)
            np.testing.assert_allclose(tf.cast(y, tf.float32), ref, rtol=tol, atol=tol / 10)
            np.testing.assert_allclose(tf.cast(dx, tf.float32), tape.gradient(ref, x, output_gradients=dy),
                                       rtol=tol, atol=tol)


def test_training_mode_drops_and_changes_each_call():
    """A training call draws one dropout seed for the embeddings and three a layer (7 for 2 layers), so each
    call drops anew; the generator's state replayed replays the call bit for bit; inference draws none."""
    backbone = build_backbone(tiny_config(30, hidden_dropout_prob=0.1))
    fused = FusedBertEncoder(backbone)
    x = _inputs()
    c = fused(x)["pooled_output"].numpy()
    start = fused.seed_generator.state.numpy().copy()
    np.testing.assert_array_equal(fused(x)["pooled_output"], c)
    np.testing.assert_array_equal(fused.seed_generator.state.numpy(), start)  # inference drew no seed
    a = fused(x, training=True)["pooled_output"].numpy()
    np.testing.assert_array_equal(fused.seed_generator.state.numpy() - start, [0, 7])
    b = fused(x, training=True)["pooled_output"].numpy()
    np.testing.assert_array_equal(fused.seed_generator.state.numpy() - start, [0, 14])
    assert (a != b).mean() == 1.0 and (a != c).mean() == 1.0  # every output moved, as dropout upstream does
    fused.seed_generator.state.assign(start)
    np.testing.assert_array_equal(fused(x, training=True)["pooled_output"], a)


def test_each_model_uses_its_own_variables_in_graphs():
    """The fused kernels are shared module functions; a second model must not see the first's weights."""
    x = _inputs()
    for seed in (1, 2):
        tf.keras.utils.set_random_seed(seed)
        backbone = build_backbone(tiny_config(30))
        fused = FusedBertEncoder(backbone)
        got = tf.function(lambda x: fused(x)["pooled_output"])(x)  # noqa: B023
        np.testing.assert_allclose(got, backbone(x)["pooled_output"], atol=2e-5)


def test_a_process_that_builds_many_models_reads_each_ones_frozen_copies_without_a_retracing_warning():
    """frozen_weights' refresh is one tf.function a model; made from one lambda, TensorFlow counted the sixth
    model's trace as retracing and warned (seen in a benchmark's sixth fit in one process)."""
    import logging

    from bert_mgpu.model.fused_encoder import frozen_weights

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        for seed in range(7):
            tf.keras.utils.set_random_seed(seed)
            fused = FusedBertEncoder(build_backbone(tiny_config(30), "mixed_bfloat16"))
            fused(_inputs())
            with frozen_weights(fused):
                copies = fused._frozen.copies
            weights = fused._cast_variables()
            assert len(copies) == len(weights) > 0
            for v in weights:  # each model's copies hold its own weights, not an earlier model's (bf16 bits)
                np.testing.assert_array_equal(tf.bitcast(copies[id(v)], tf.bfloat16).numpy(),
                                              tf.cast(v, tf.bfloat16).numpy())
    finally:
        tf.get_logger().removeHandler(handler)
    assert not [m for m in seen if "retracing" in m], seen


@pytest.mark.parametrize("ln_mode", ["post-ln", "pre-ln"])
def test_last_layer_on_used_rows_only_changes_nothing(ln_mode):
    backbone = build_backbone(tiny_config(30, encoder_ln_mode=ln_mode))
    x = _inputs()
    full = FusedBertEncoder(backbone)(x)
    pooled = FusedBertEncoder(backbone, pooled_only=True)(x)
    assert pooled["sequence_output"].shape == (3, 0, 32)
    np.testing.assert_allclose(pooled["pooled_output"], full["pooled_output"], atol=1e-5)
    positions = np.array([[1, 5, 11], [2, 3, 6], [0, 1, 3]], np.int32)
    picked = FusedBertEncoder(backbone)(dict(x, output_positions=positions))
    want = np.take_along_axis(full["sequence_output"].numpy(), positions[..., None], axis=1)
    np.testing.assert_allclose(picked["sequence_output"], want, atol=1e-5)

    def grads(encoder, inputs, pick):
        with tf.GradientTape() as tape:
            y = encoder(inputs)
            loss = tf.reduce_sum(pick(y["sequence_output"]) ** 2) + tf.reduce_sum(y["pooled_output"])
        return tape.gradient(loss, backbone.trainable_variables)

    a = grads(FusedBertEncoder(backbone), x, lambda s: tf.gather(s, positions, batch_dims=1))
    b = grads(FusedBertEncoder(backbone), dict(x, output_positions=positions), lambda s: s)
    for v, ga, gb in zip(backbone.trainable_variables, a, b):
        np.testing.assert_allclose(tf.convert_to_tensor(ga), tf.convert_to_tensor(gb), atol=1e-4, err_msg=v.path)


@pytest.mark.parametrize("kernel,reference", [
    (bias_gelu_exact, tf.nn.gelu), (bias_gelu_tanh, lambda z: tf.nn.gelu(z, approximate=True)),
    (bias_relu, tf.nn.relu)])
def test_bias_activation_hand_written_backward_matches_autodiff(kernel, reference):
    """act(x + b)'s gradient is written by hand (see _bias_activation): it must be the true one, eagerly
    and in a traced function, and in bfloat16 no less accurate than differentiating the bfloat16 ops."""
    rng = np.random.default_rng(0)
    x, b, dy = (tf.constant(rng.normal(size=s) * 3, tf.float32) for s in ([64, 48], [48], [64, 48]))

    def grads(fn, x, b, dy):
        with tf.GradientTape() as tape:
            tape.watch([x, b])
            y = fn(x, b)
        return [y, *tape.gradient(y, [x, b], output_gradients=dy)]

    truth = [tf.cast(t, tf.float32) for t in grads(lambda x, b: reference(x + b),
                                                    *(tf.cast(t, tf.float64) for t in (x, b, dy)))]
    for got in (grads(kernel, x, b, dy), tf.function(grads, autograph=False)(kernel, x, b, dy)):
        for g, t in zip(got, truth):
            np.testing.assert_allclose(g, t, rtol=1e-5, atol=1e-5)
    lo = [tf.cast(t, tf.bfloat16) for t in (x, b, dy)]
    truth = grads(lambda x, b: reference(x + b), *(tf.cast(t, tf.float32) for t in lo))
    ours = grads(kernel, *lo)
    autodiff = grads(lambda x, b: reference(x + b), *lo)
    for o, a, t in zip(ours, autodiff, truth):
        err = lambda v: float(tf.reduce_max(tf.abs(tf.cast(v, tf.float32) - t)))  # noqa: E731, B023
        assert o.dtype == tf.bfloat16 and err(o) <= err(a), (err(o), err(a))


@pytest.mark.parametrize("ln_mode,positions", [("post-ln", False), ("pre-ln", True)])
def test_recompute_gives_the_same_gradients_with_dropout_on(ln_mode, positions):
    """--recompute: each layer computed again in the backward pass, dropping what the first pass dropped;
    eager and traced, with the last layer on chosen rows (a masked LM's) too."""
    backbone = build_backbone(tiny_config(30, encoder_ln_mode=ln_mode, hidden_dropout_prob=0.2,
                                          attention_probs_dropout_prob=0.2))
    fused = FusedBertEncoder(backbone)
    x = _inputs()
    if positions:
        x["output_positions"] = np.array([[1, 2], [3, 0], [1, 1]], np.int32)
    start = fused.seed_generator.state.numpy()
    rows = x["output_positions"].shape[1] if positions else x["token_ids"].shape[1]
    weights = np.random.default_rng(1).normal(size=(3, rows, backbone.hidden_dim)).astype("float32")

    def grads():
        fused.seed_generator.state.assign(start)  # the same dropout masks for every run
        with tf.GradientTape() as tape:
            y = fused(x, training=True)
            loss = tf.reduce_sum(y["sequence_output"] * weights) + tf.reduce_sum(y["pooled_output"])
        return [loss] + tape.gradient(loss, backbone.trainable_variables)

    plain = grads(), tf.function(grads, autograph=False)()  # eager and traced
    assert np.abs(plain[0][0] - grads()[0]) == 0  # the state reset gives the same masks
    fused.recompute = True
    for got, want in zip((grads(), tf.function(grads, autograph=False)()), plain):
        for v, a, b in zip(["loss"] + [v.path for v in backbone.trainable_variables], got, want):
            a, b = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()
            # Equal up to float32 sums taken in another order: 1e-6, of the tensor's largest value above 1.
            assert np.abs(a - b).max() <= 1e-6 * max(1.0, np.abs(b).max()), (v, np.abs(a - b).max())
