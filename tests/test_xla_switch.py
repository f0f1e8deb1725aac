"""BERT_MGPU_XLA=0 runs bert_mgpu's kernels and optimizer programs without XLA: the same ops, the same numbers
to rounding, the same dropout masks to the bit, and nothing marked for XLA in the traced graph."""

import numpy as np
import tensorflow as tf
from conftest import tiny_config

from bert_mgpu.core import xla
from bert_mgpu.model import kernels
from bert_mgpu.model.fused_encoder import FusedBertEncoder
from bert_mgpu.model.modeling import build_backbone


def _xla_calls(fn=None, graph=None):
    """How many calls in `fn`'s traced graph XLA must compile, and how many calls there are in all."""
    graph = graph or tf.function(fn, autograph=False).get_concrete_function().graph
    calls = [op for op in graph.get_operations() if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
    return sum(op.node_def.attr["_XlaMustCompile"].b for op in calls), len(calls)


def test_the_switch_is_read_when_a_kernel_is_traced(monkeypatch):
    x, gamma, beta = tf.ones([2, 8]), tf.ones([8]), tf.zeros([8])
    monkeypatch.delenv(xla.SWITCH, raising=False)
    assert xla.enabled() and _xla_calls(lambda: kernels.norm(x, gamma, beta, 1e-12)) == (1, 1)
    monkeypatch.setenv(xla.SWITCH, "0")
    assert not xla.enabled() and _xla_calls(lambda: kernels.norm(x, gamma, beta, 1e-12)) == (0, 1)
    monkeypatch.setenv(xla.SWITCH, "1")
    assert _xla_calls(lambda: kernels.norm(x, gamma, beta, 1e-12)) == (1, 1)


def test_a_function_that_calls_kernels_keeps_a_trace_for_each_setting(monkeypatch):
    """softmax_dropout is traced around its kernels: traced with the switch off, it must not serve a call with
    it on (and so leave a step of an XLA test unfused after an unfused test in the same process)."""
    scores, seed = tf.random.stateless_normal([2, 3, 5], [1, 2]), tf.constant([1, 2])
    monkeypatch.setenv(xla.SWITCH, "0")
    plain = kernels.softmax_dropout(scores, 0.1, seed)
    monkeypatch.setenv(xla.SWITCH, "1")
    fused = kernels.softmax_dropout(scores, 0.1, seed)
    np.testing.assert_allclose(plain, fused, atol=1e-6)
    traces = kernels.softmax_dropout.traces
    on, off = (_xla_calls(graph=traces[mode].get_concrete_function(scores, 0.1, seed).graph) for mode in (True, False))
    assert on[0] >= 1 and off[0] == 0 and on[1] == off[1] >= 1, (on, off)


def test_the_encoder_gives_the_same_outputs_gradients_and_masks_with_and_without_xla(monkeypatch):
    backbone = build_backbone(tiny_config(30, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    fused = FusedBertEncoder(backbone)
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(1, 30, (3, 11)).astype("int32"), "segment_ids": np.zeros((3, 11), "int32"),
         "padding_mask": np.ones((3, 11), bool)}
    weights = rng.normal(size=(3, 11, backbone.hidden_dim)).astype("float32")

    def run():
        with tf.GradientTape() as tape:
            y = fused(x, training=True)
            loss = tf.reduce_sum(y["sequence_output"] * weights) + tf.reduce_sum(y["pooled_output"])
        grads = tape.gradient(loss, backbone.trainable_variables)
        mask = kernels.dropout_mask(tf.constant([64, 33]), 0.1, tf.constant([7, 3]), tf.float32)
        return y["sequence_output"].numpy(), [tf.convert_to_tensor(g).numpy() for g in grads], mask.numpy()

    monkeypatch.delenv(xla.SWITCH, raising=False)
    out, grads, mask = run()
    monkeypatch.setenv(xla.SWITCH, "0")
    out0, grads0, mask0 = run()
    np.testing.assert_array_equal(mask0, mask)  # the counter-based hash is integer arithmetic: bit-equal
    assert 0.85 < (mask > 0).mean() < 0.95
    np.testing.assert_allclose(out0, out, atol=1e-5)
    assert sum(np.abs(g).max() for g in grads) > 0
    for v, a, b in zip(backbone.trainable_variables, grads0, grads):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=v.path)
