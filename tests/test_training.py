"""The training step on towers: 2 towers on 2 logical CPUs equal 1 tower on the same global batch."""

import contextlib
import gc

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_config

from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import optimization, schedules, training


def batch(n=8, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 38, size=(n, length)).astype(np.int32)
    ids[:, 0] = 2
    for i in range(n):
        ids[i, rng.integers(4, length):] = 0
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 0}
    return features, rng.integers(0, 2, n).astype(np.int32), np.arange(n, dtype=np.int32)


def one_step(towers, steps=1, policy="float32", initial_scale=None, data=None, use_xla=False, accum_steps=1):
    plan = devices.plan_devices(0, towers, ())
    strategy = distribute.make_strategy(plan)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_dropout_prob=0.0), 2, policy)
        opt = optimization.create_optimizer(1e-3, 10, 0, float16=policy == "mixed_float16",
                                            initial_scale=initial_scale)
    trainer = training.Trainer(strategy, model, opt, use_xla=use_xla, accum_steps=accum_steps)
    before = [v.numpy() for v in model.trainable_variables]
    ds = tf.data.Dataset.from_tensors(data or batch()).repeat()
    it = iter(strategy.experimental_distribute_dataset(ds))
    results = [trainer.train_step(next(it)) for _ in range(steps)]
    return trainer, before, [v.numpy() for v in model.trainable_variables], results


_TRAJECTORIES = {}


def trajectory(towers):
    """The weights before and after each of 3 float32 steps on `towers` towers, and each step's results:
    one Trainer (one first step, about 10 s of tracing and compiling) serves every test that compares them.
    The steps are deterministic (one_step's seed, no dropout), so step k here is what a fresh run of k steps
    gives (test_a_finished_trainer_leaves_no_traced_step_behind checks it)."""
    if towers not in _TRAJECTORIES:
        trainer, before, _, _ = one_step(towers, steps=0)
        it = iter(trainer.strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch()).repeat()))
        weights, results = [before], []
        for _ in range(3):
            results.append(trainer.train_step(next(it)))
            weights.append([v.numpy() for v in trainer.model.trainable_variables])
        _TRAJECTORIES[towers] = weights, results  # numbers only: the trainer and its traces die here
    return _TRAJECTORIES[towers]


def test_two_towers_equal_one_tower_on_the_same_global_batch():
    (before, one, *_), [(loss1, seen1), *_] = trajectory(1)
    (_, two, *_), [(loss2, seen2), *_] = trajectory(2)
    assert list(seen1) == [8] and list(seen2) == [4, 4]  # split across towers, not duplicated
    assert abs(loss1 - loss2) < 1e-6
    moved = max(np.abs(a - b).max() for a, b in zip(before, one))
    assert moved > 1e-5  # the step did change the weights
    assert max(np.abs(a - b).max() for a, b in zip(one, two)) < 1e-6


def test_three_steps_two_towers_still_equal_one():
    one, two = trajectory(1)[0][3], trajectory(2)[0][3]
    assert max(np.abs(a - b).max() for a, b in zip(one, two)) < 1e-5


def test_classifier_steps_accumulated_over_two_halves_equal_one_step():
    """The classifier's --gradient_accumulation_steps: each tower's 4 rows as 2 x 2, the same 2 steps."""
    weights, results = trajectory(2)
    whole, results1 = weights[2], results[:2]
    _, _, halves, results2 = one_step(2, steps=2, accum_steps=2)
    assert [list(seen) for _, seen in results2] == [[4, 4], [4, 4]]
    assert all(abs(a[0] - b[0]) < 1e-5 for a, b in zip(results1, results2))
    assert max(np.abs(a - b).max() for a, b in zip(whole, halves)) < 1e-5


def test_xla_compiled_towers_give_the_same_step():
    (_, plain, *_), [(loss1, _), *_] = trajectory(2)
    _, _, xla, [(loss2, seen)] = one_step(2, use_xla=True)
    assert list(seen) == [4, 4] and abs(loss1 - loss2) < 1e-5
    assert max(np.abs(a - b).max() for a, b in zip(plain, xla)) < 1e-5


def test_non_finite_gradients_skip_the_step_and_are_counted():
    trainer, before, after, _ = one_step(2, steps=1, policy="mixed_float16", initial_scale=2.0**40)
    assert trainer.skipped_steps == 1  # fp16 gradients overflow at scale 2**40: step skipped
    assert trainer.loss_scale == 2.0**39  # and the scale halved
    assert max(np.abs(a - b).max() for a, b in zip(before, after)) == 0.0  # nothing applied
    assert int(trainer.optimizer.inner_optimizer.iterations.numpy()) == 0  # nor the schedule


def test_mixed_float16_trains_with_finite_scale():
    trainer, before, after, results = one_step(2, steps=2, policy="mixed_float16")
    assert trainer.skipped_steps == 0 and trainer.loss_scale == 2.0**15
    assert all(np.isfinite(loss) for loss, _ in results)
    assert max(np.abs(a - b).max() for a, b in zip(before, after)) > 1e-5


def test_a_finished_trainer_leaves_no_traced_step_behind():
    """Notebook use: the traced step (thousands of ops) dies with its trainer. TensorFlow's own
    ReplicaContext.all_reduce would keep it for the life of the process (see distribute.all_reduce)."""
    from tensorflow.python.framework.func_graph import FuncGraph

    def steps_alive():
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, FuncGraph) and o.name == "step")

    memo = trajectory(2)[0][2]  # (built first: its trainer is gone before counting starts)
    alive = steps_alive()
    for _ in range(2):
        trainer, _, after, _ = one_step(2, steps=2)
        assert trainer.step.numpy() == 2 and steps_alive() > alive  # the trainer's own traces, while it lives
        # What lets the other tests read trajectory() for fresh runs: the same steps give the same bits.
        assert all(np.array_equal(a, b) for a, b in zip(after, memo))
        del trainer
    assert steps_alive() == alive


@pytest.mark.parametrize("n, per_batch", [(7, 4), (13, 8), (1, 4)])
def test_prediction_returns_every_example_in_order(n, per_batch):
    trainer, _, _, _ = one_step(2, steps=0)
    features, labels, index = batch(16, seed=3)
    ds = tf.data.Dataset.from_tensor_slices((features, labels, index)).take(n).batch(per_batch)
    logits, got_labels = trainer.predict_logits(ds)
    assert logits.shape == (n, 2)
    np.testing.assert_array_equal(got_labels, labels[:n])
    direct = trainer.model({k: v[:n] for k, v in features.items()}, training=False).numpy()
    np.testing.assert_allclose(logits, direct, atol=1e-5)


def test_warmup_then_linear_decay():
    """google-bert's line from step 0 (the rate falls to 90% of the peak as 10% warmup ends), and, from
    the warmup's end, transformers' get_linear_schedule_with_warmup: peak x (total - step) / (total - warmup)."""
    s = schedules.WarmupLinearDecay(1e-3, total_steps=100, warmup_steps=10)
    got = [float(s(i)) for i in (0, 5, 10, 55, 100, 120)]
    np.testing.assert_allclose(got, [0.0, 5e-4, 9e-4, 4.5e-4, 0.0, 0.0], atol=1e-9)
    s = schedules.WarmupLinearDecay(1e-3, total_steps=100, warmup_steps=10, from_warmup=True)
    steps = np.arange(0, 121)
    want = 1e-3 * np.where(steps < 10, steps / 10, np.maximum(0.0, (100 - steps) / 90))
    np.testing.assert_allclose([float(s(i)) for i in steps], want, rtol=1e-5, atol=1e-12)  # float32
    assert float(s(10)) == np.float32(1e-3) and float(s(9)) < float(s(10))  # the peak, where warmup ends
    assert float(schedules.WarmupLinearDecay(1e-3, 100, 0, from_warmup=True)(0)) == np.float32(1e-3)


def test_float16_models_all_reduce_in_float16_and_still_match():
    """Under mixed_float16 gradients cross towers as float16 (half the bytes); the step stays finite and
    close to the float32 all-reduce."""
    trainer, before, half, _ = one_step(2, steps=1, policy="mixed_float16")
    assert trainer.allreduce_dtype == tf.float16
    plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(plan)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_dropout_prob=0.0), 2, "mixed_float16")
        opt = optimization.create_optimizer(1e-3, 10, 0, float16=True)
    full = training.Trainer(strategy, model, opt, allreduce_dtype="float32")
    assert full.allreduce_dtype == tf.float32
    full.train_step(next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch())))))
    moved = max(np.abs(a - b).max() for a, b in zip(before, half))
    diff = max(np.abs(a - v.numpy()).max() for a, v in zip(half, model.trainable_variables))
    assert moved > 1e-4 and diff < 0.05 * moved


@pytest.mark.parametrize("towers", [1, 2])
def test_prediction_reads_the_weights_cast_once_a_pass_and_never_stale(towers, monkeypatch):
    """Under mixed precision a pass reads copies of the weights cast at its start (NOTES.md item 22): equal
    to casting every batch, brought up to date by the next pass after a training step, never checkpointed."""
    trainer, _, _, _ = one_step(towers, steps=0, policy="mixed_bfloat16")
    features, labels, index = batch(16, seed=4)
    ds = tf.data.Dataset.from_tensor_slices((features, labels, index)).batch(8)
    weights = len(trainer.model.weights)

    def cast_every_batch():  # the same pass with the weights cast in every call, as before
        with monkeypatch.context() as m:
            m.setattr(training.fused_encoder, "frozen_weights", lambda model: contextlib.nullcontext())
            m.setattr(trainer, "_predict_fn", None)
            return trainer.predict_logits(ds)[0]

    first = trainer.predict_logits(ds)[0]
    np.testing.assert_array_equal(first, cast_every_batch())
    encoder = trainer.model.get_layer("fused_encoder")
    assert len(encoder._frozen.copies) == 2 + 12 * len(encoder.backbone.transformer_layers)
    assert len(trainer.model.weights) == weights and not encoder._frozen.active
    trainer.train_step(next(iter(trainer.strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch()[:2])))))
    second = trainer.predict_logits(ds)[0]
    assert np.abs(second - first).max() > 1e-4  # the step moved the weights, and the pass saw it
    np.testing.assert_array_equal(second, cast_every_batch())


@pytest.mark.parametrize("n, per_batch", [(1, 4), (5, 4)])
def test_a_token_heads_prediction_with_an_empty_tower_returns_every_row(n, per_batch):
    """A last batch of one row on 2 towers leaves tower 1 none: the token head's all-gather refused its [0, 1, C]
    logits and aborted every later collective of the process (issue 65, item 2). Now the same logits as the
    model's own, twice in a row."""
    strategy = distribute.make_strategy(devices.plan_devices(0, 2, ()))
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = modeling.build_tagger(tiny_config(38, hidden_dropout_prob=0.0), 3)
    trainer = training.Trainer(strategy, model)
    features, _, index = batch(8, seed=4)
    labels = np.where(features["padding_mask"], 1, -1).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices((features, labels, index)).take(n).batch(per_batch)
    direct = model({k: v[:n] for k, v in features.items()}, training=False).numpy()
    for _ in range(2):
        logits, got = trainer.predict_logits(ds)
        assert logits.shape == (n, 12, 3)
        np.testing.assert_allclose(logits, direct, atol=1e-5)
        np.testing.assert_array_equal(got, labels[:n])


def test_the_steps_of_several_models_in_one_process_do_not_warn_of_retracing(caplog):
    """A GLUE suite builds a Trainer per task; each traces its steps once or twice. TensorFlow counts traces by
    code object and warned "5 out of the last 7 calls ... triggered tf.function retracing" for the suite."""
    from bert_mgpu.train.training import traced

    def model_step(k):
        def step(x):
            return x * k
        return step

    def warnings_of(wrap):
        caplog.clear()
        with caplog.at_level("WARNING", logger="tensorflow"):
            for k in range(8):  # 8 models, each step traced once and called twice
                fn = wrap(model_step(float(k)))
                assert [float(fn(tf.constant(1.0))) for _ in range(2)] == [float(k)] * 2
        return [r.getMessage() for r in caplog.records if "retracing" in r.getMessage()]

    assert warnings_of(lambda step: tf.function(step, autograph=False))  # what each Trainer did before
    assert warnings_of(lambda step: traced(step, autograph=False)) == []
