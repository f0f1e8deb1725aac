"""The one training loop: hooks stop and evaluate, Keras callbacks hear every evaluation and can stop it,
and every record carries the same keys for fine-tuning and pretraining."""

import csv
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_config
from test_pretraining import new_pretrainer, text, text_data  # noqa: F401  (text: a fixture)
from test_training import batch

from bert_mgpu.io import run_dir
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import optimization, training
from bert_mgpu.train.budget import Budget
from bert_mgpu.train.loop import Evaluation, Hook, Loop


def tiny_trainer(steps=20):
    strategy = distribute.make_strategy(devices.plan_devices(0, 2, ()))
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_dropout_prob=0.0), 2)
        opt = optimization.create_optimizer(1e-3, steps, 0)
    features, labels, _ = batch()
    return training.Trainer(strategy, model, opt), tf.data.Dataset.from_tensors((features, labels)).repeat()


def test_evaluation_hook_and_keras_early_stopping_and_csv_logger(tmp_path):
    """Validation losses 0.9, 0.5, 0.6, 0.7 every 2 steps: EarlyStopping(patience=2) stops after the
    fourth evaluation (step 8); CSVLogger wrote one row per evaluation with the val_ keys."""
    trainer, data = tiny_trainer()
    losses = iter([0.9, 0.5, 0.6, 0.7, 0.8, 0.9])
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)
    log_csv = str(tmp_path / "log.csv")
    loop = Loop(trainer, 8, hooks=[Evaluation(lambda: {"loss": next(losses)}, every=2)],
                callbacks=[stopper, keras.callbacks.CSVLogger(log_csv)], log_every=2, verbose=False)
    loop.run(data, until_step=20)
    assert loop.step == 8 and loop.stop == "stopped by a Keras callback at step 8", loop.stop
    evaluations = [r for r in loop.history if "eval_loss" in r]
    assert [(r["step"], r["eval_loss"]) for r in evaluations] == [(2, 0.9), (4, 0.5), (6, 0.6), (8, 0.7)]
    with open(log_csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["val_loss"]) for r in rows] == [0.9, 0.5, 0.6, 0.7]
    assert all(np.isfinite(float(r["loss"])) for r in rows)  # the training record's loss beside it


def test_hooks_stop_add_to_records_and_the_loop_saves_once_at_the_end():
    class StopAt(Hook):
        def __init__(self):
            self.seen = []

        def should_stop(self, loop):
            return "five is enough" if loop.step >= 5 else None

        def before_step(self, loop):
            self.seen.append(loop.step)

        def on_log(self, loop, record):
            record["hook_key"] = 1.5

    trainer, data = tiny_trainer()
    saved, hook = [], StopAt()
    loop = Loop(trainer, 8, hooks=[hook], log_every=1, save=lambda: saved.append(loop.step), save_every=2,
                verbose=False)
    record = loop.run(data, until_step=20)
    assert loop.stop == "five is enough" and hook.seen == [0, 1, 2, 3, 4] and saved == [2, 4, 5]
    keys = {"step", "loss", "learning_rate", "loss_scale", "examples_per_second", "skipped_steps", "hook_key"}
    assert set(record) == keys and record["step"] == 5 and [r["step"] for r in loop.history] == [1, 2, 3, 4, 5]
    assert record["examples_per_second"] > 0 and record["skipped_steps"] == 0


@pytest.mark.parametrize("kind", ["classifier", "pretraining"])
def test_both_apis_log_the_same_keys_to_tensorboard(tmp_path, kind, text):  # noqa: F811  (the fixture)
    """The drift the loop removed: pretraining logged sequences_per_second and no skipped_steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if kind == "classifier":
        trainer, data = tiny_trainer()
        run = run_dir.Run(str(tmp_path), {"x": 1})
        Loop(trainer, 8, writer=run.writer, log_every=2, verbose=False).run(data, until_step=4)
        run.close()
        expected = set()
    else:
        pre = new_pretrainer(text)
        pre.fit(text_data(pre, text), str(tmp_path), Budget(num_train_steps=4), log_every=2, verbose=False)
        expected = {"mlm_loss", "mlm_accuracy", "tokens_per_second", "progress", "system/cpu_percent"}
    events = EventAccumulator(os.path.join(str(tmp_path), "train"), size_guidance={"tensors": 0}).Reload()
    tags = set(events.Tags()["tensors"])
    common = {"loss", "learning_rate", "loss_scale", "examples_per_second", "skipped_steps"}
    assert common | expected <= tags, tags


def test_reading_every_fifth_step_trains_bit_identically_with_one_host_read_per_interval():
    """The host waits for the device only on logging steps; what is computed does not change."""
    weights, reads = {}, {}
    for log_every in (1, 5):
        trainer, data = tiny_trainer()
        loop = Loop(trainer, 8, log_every=log_every, verbose=False)
        loop.run(data, until_step=10)
        weights[log_every] = [v.numpy() for v in trainer.model.weights]
        reads[log_every] = trainer.host_reads
        assert [r["step"] for r in loop.history] == list(range(log_every, 11, log_every))
    assert reads == {1: 10, 5: 2}
    for a, b in zip(weights[1], weights[5]):
        np.testing.assert_array_equal(a, b)


class CountingChief:
    """Stands in for agree.ChiefDecides on worker 1 of 2: counts agreements; the chief's clock runs
    3 s behind this worker's."""

    workers = 2

    def __init__(self):
        self.calls = 0

    def __call__(self, values, any_of=()):
        self.calls += 1
        return [v - 3.0 for v in values]


def test_workers_agree_on_the_clock_only_on_logging_steps_and_early_steps_and_count_on_in_between():
    """Two host collectives a step (the chief's clock before and after it) kept the GPUs waiting for the
    hosts; now one agreement per logging step, plus steps 1, 2, 4, 8, ... to learn the pace, and each
    step's elapsed time is the last agreed one plus the agreed pace: the same on every worker."""
    trainer, data = tiny_trainer(40)
    ticks = iter(np.arange(0.0, 1000.0, 0.5))  # this worker's clock: 0.5 s a reading
    loop = Loop(trainer, 8, log_every=10, verbose=False, clock=lambda: next(ticks))
    loop._decide = chief = CountingChief()
    seen = []

    class Watch(Hook):
        def before_step(self, loop):
            seen.append(loop.elapsed())

    loop.hooks.append(Watch())
    loop.run(data, until_step=40)
    agreed_at = {0, 1, 2, 4, 8, 16, 32} | {10, 20, 30, 40}
    assert chief.calls == len(agreed_at) and trainer.host_reads == 4, (chief.calls, trainer.host_reads)
    assert seen[0] == 0.5 - 3.0  # the chief's time (3 s behind), not this worker's first reading (0.5 s)
    assert all(b >= a for a, b in zip(seen, seen[1:])) and seen[-1] > seen[1]  # it goes on between agreements


def test_each_record_logs_the_mean_of_its_steps_losses_and_statistics_and_the_last_partial_interval_too():
    """Logged every 4 steps and stopped by a hook after step 10: records at steps 4, 8 and 10 hold the
    means of steps 1-4, 5-8 and 9-10 (loss and statistics), read from the device once each; the same
    training logged every step gives each step's own values."""
    def loss_fn(model, features, labels, training):
        loss, stats = training_loss(model, features, labels, training)
        return loss, {**stats, "loss_squared": loss * loss}

    training_loss = training.classification_loss
    runs = {}
    for log_every in (1, 4):
        trainer, data = tiny_trainer()
        trainer.loss_fn = loss_fn

        class StopAfterTen(Hook):
            def should_stop(self, loop):
                return "ten" if loop.step >= 10 else None

        loop = Loop(trainer, 8, hooks=[StopAfterTen()], log_every=log_every, verbose=False)
        loop.run(data, until_step=20)
        runs[log_every] = (loop.history, trainer.host_reads)
    steps, reads = runs[1]
    assert [r["step"] for r in steps] == list(range(1, 11)) and reads == 10
    losses = np.array([r["loss"] for r in steps])
    squares = np.array([r["loss_squared"] for r in steps])
    assert len(set(np.round(losses, 6))) == 10  # the steps' losses differ, so a mean is not any one of them
    np.testing.assert_allclose(squares, losses ** 2, rtol=1e-5)
    history, reads = runs[4]
    assert [r["step"] for r in history] == [4, 8, 10] and reads == 3
    for record, (a, b) in zip(history, [(0, 4), (4, 8), (8, 10)]):
        np.testing.assert_allclose(record["loss"], losses[a:b].mean(), rtol=1e-6)
        np.testing.assert_allclose(record["loss_squared"], squares[a:b].mean(), rtol=1e-6)


def test_a_non_finite_loss_is_left_out_of_the_mean_unless_every_step_had_one():
    rows = tf.constant([[1.0, 10.0], [np.nan, 99.0], [3.0, 30.0]])
    np.testing.assert_allclose(training._finite_mean(rows).numpy(), [2.0, 20.0])
    assert np.isnan(training._finite_mean(tf.constant([[np.inf, 1.0], [np.nan, 3.0]])).numpy()[0])


def test_examples_per_second_leave_out_the_time_of_evaluations_and_saves():
    """On a clock where each step takes 1 s and each evaluation 100 s: 2 steps of 8 in 2 s, 8 examples/s.
    The loop finds this from the clock readings it takes anyway (none more: a worker's readings are
    agreed with the others')."""
    now = [0.0]

    class Clockwork(Hook):
        def before_step(self, loop):
            now[0] += 1.0

    trainer, data = tiny_trainer()
    slow = Evaluation(lambda: now.__setitem__(0, now[0] + 100.0) or {"loss": 0.5}, every=2)
    loop = Loop(trainer, 8, hooks=[Clockwork(), slow], log_every=2, clock=lambda: now[0], verbose=False)
    loop.run(data, until_step=6)
    rates = [r["examples_per_second"] for r in loop.history if "examples_per_second" in r]
    assert rates == pytest.approx([8.0, 8.0, 8.0])


def test_a_resumed_run_evaluates_at_the_multiples_of_the_global_step():
    """Resumed at step 5 with evaluations every 4 steps: at 8 and 12, as the run that never stopped, not 9 and
    13 counted from the resume (a best model picked at other steps; issue 66, item 4)."""
    trainer, data = tiny_trainer()
    trainer.step.assign(5)
    loop = Loop(trainer, 8, hooks=[Evaluation(lambda: {"loss": 0.5}, every=4)], log_every=2, verbose=False)
    loop.run(data, until_step=14)
    assert [r["step"] for r in loop.history if "eval_loss" in r] == [8, 12]
