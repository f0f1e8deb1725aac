"""R-Drop (issue 70 item 4): two dropout passes, their losses averaged plus alpha / 4 x the symmetric KL, against
a NumPy reference; one pass where there is no dropout or no training; the heads without a softmax refuse; the
GPU run's step (NCCL, mixed_float16) all-reduces it once."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_config
from test_allreduce import collectives, gpu_strategy

from bert_mgpu.core.errors import UserError
from bert_mgpu.model import modeling
from bert_mgpu.model.objectives import Classification, MultiLabel, Regression
from bert_mgpu.model.rdrop import symmetric_kl, with_rdrop
from bert_mgpu.model.span_objectives import SpanExtraction
from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification
from bert_mgpu.train import memory, optimization, training
from bert_mgpu.train.train_config import TrainConfig


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_symmetric_kl(a, b):
    lp, lq = np_log_softmax(a.astype(np.float64)), np_log_softmax(b.astype(np.float64))
    return (np.exp(lp) * (lp - lq)).sum(-1) + (np.exp(lq) * (lq - lp)).sum(-1)


def test_symmetric_kl_is_both_kl_divergences_summed_and_zero_between_equal_outputs():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 5)).astype(np.float32), rng.normal(size=(6, 5)).astype(np.float32) * 3
    np.testing.assert_allclose(symmetric_kl(a, b).numpy(), np_symmetric_kl(a, b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(symmetric_kl(tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)).numpy(),
                               np_symmetric_kl(tf.cast(a, tf.bfloat16).numpy().astype(np.float32),
                                               tf.cast(b, tf.bfloat16).numpy().astype(np.float32)), rtol=1e-5)
    assert symmetric_kl(a, b).dtype == tf.float32 and np.array_equal(symmetric_kl(a, a).numpy(), np.zeros(6))


class Spy:
    """A model that keeps its outputs, to check the loss against the passes it was computed from."""

    def __init__(self, model):
        self.model, self.outputs = model, []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.outputs.append(out.numpy())
        return out


def batch(n=8, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 38, size=(n, length)).astype(np.int32)
    ids[:, 0] = 2
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 0}
    return features, rng.integers(0, 3, n).astype(np.int32)


def test_the_loss_is_the_two_passes_mean_cross_entropy_and_alpha_over_4_times_their_kl():
    keras.utils.set_random_seed(3)
    model = modeling.build_classifier(tiny_config(38, hidden_dropout_prob=0.3), 3)
    features, labels = batch()
    spy = Spy(model)
    loss, stats = with_rdrop(Classification().loss, Classification().divergence, 4.0)(spy, features, labels)
    first, second = spy.outputs
    assert np.abs(first - second).max() > 1e-3  # each pass its own dropout masks
    ce = [-np_log_softmax(x.astype(np.float64))[np.arange(8), labels].mean() for x in (first, second)]
    kl = np_symmetric_kl(first, second).mean()
    assert float(stats["rdrop_kl"]) == pytest.approx(kl, rel=1e-5) and kl > 1e-4
    assert float(loss) == pytest.approx((ce[0] + ce[1]) / 2 + 4.0 / 4 * kl, rel=1e-5)


def test_without_dropout_or_training_it_is_the_plain_loss():
    keras.utils.set_random_seed(3)
    model = modeling.build_classifier(tiny_config(38, hidden_dropout_prob=0.0,
                                                  attention_probs_dropout_prob=0.0), 3)
    features, labels = batch()
    plain, _ = Classification().loss(model, features, labels)
    loss, stats = with_rdrop(Classification().loss, Classification().divergence, 4.0)(model, features, labels)
    assert float(stats["rdrop_kl"]) == 0.0 and float(loss) == pytest.approx(float(plain), rel=1e-6)
    spy = Spy(model)
    loss, stats = with_rdrop(Classification().loss, Classification().divergence, 4.0)(spy, features, labels,
                                                                                     training=False)
    assert len(spy.outputs) == 1 and stats == {}  # evaluation: one pass, no dropout


def test_a_taggers_divergence_counts_its_labelled_positions_only():
    rng = np.random.default_rng(1)
    first, second = rng.normal(size=(2, 6, 4)).astype(np.float32), rng.normal(size=(2, 6, 4)).astype(np.float32)
    labels = np.array([[1, -1, 2, -1, -1, -1], [0, 3, -1, -1, -1, -1]], np.int32)
    got = float(TokenClassification().divergence(first, second, labels))
    want = np_symmetric_kl(first, second)[labels != -1].mean()
    assert got == pytest.approx(want, rel=1e-5)
    second[labels == -1] += 100.0  # what unlabelled positions (pieces after a word's first, padding) hold
    assert float(TokenClassification().divergence(first, second, labels)) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("objective", [Regression(), MultiLabel(), CRFTagging(), SpanExtraction()])
def test_heads_without_a_softmax_over_classes_refuse_in_one_line(objective):
    with pytest.raises(UserError, match="--rdrop_alpha compares two passes' softmax"):
        objective.check_rdrop()
    Classification().check_rdrop()
    TokenClassification().check_rdrop()


def test_the_config_checks_alpha_and_a_resumed_run_compares_it():
    with pytest.raises(UserError, match=r"--rdrop_alpha=-1.0: must be a finite number, 0 or more"):
        TrainConfig(rdrop_alpha=-1.0).check()
    assert TrainConfig(rdrop_alpha=4.0).settings(8)["rdrop_alpha"] == 4.0
    assert "rdrop_alpha" not in TrainConfig().settings(8)  # runs from before it resume as they were


def test_the_gpu_step_runs_both_passes_and_all_reduces_the_gradients_once():
    """--rdrop_alpha on GPUs: NCCL collectives over a mixed_float16 tagger whose step runs the model twice
    on each tower: its collectives are the one-pass step's (the gradients are all-reduced once, the statistics
    as before), the KL is above 0 and both towers' weights stay bit-equal."""
    _, strategy = gpu_strategy()
    with strategy.scope():
        model = modeling.build_tagger(tiny_config(500, hidden_size=64, intermediate_size=256), 5, "mixed_float16")
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=True)
    objective = TokenClassification()
    trainer = training.Trainer(strategy, model, opt, loss_fn=with_rdrop(objective.loss, objective.divergence, 4.0),
                               bytes_per_pack=2**14)
    features, _ = memory.classifier_batch(8, 16)
    labels = np.where(np.arange(16) % 3 == 1, np.arange(8 * 16).reshape(8, 16) % 5, -1).astype(np.int32)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(2))
    sent = collectives(trainer.step_graph(trainer.input_spec))
    one_pass = collectives(training.Trainer(strategy, model, opt, loss_fn=objective.loss, bytes_per_pack=2**14)
                           .step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"}
    assert sent == one_pass and len(sent) > 10  # the same gradient packs; the statistics are reduced apart
    losses = [trainer.train_step(next(batches))[0] for _ in range(2)]
    assert all(np.isfinite(losses)) and trainer.applied_steps == 2, losses
    assert trainer.stats["rdrop_kl"] > 0, trainer.stats
    for v in model.trainable_variables:
        a, b = strategy.experimental_local_results(v.value)
        assert np.array_equal(a.numpy(), b.numpy()), v.path
