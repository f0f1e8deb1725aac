"""--auto_batch_size: the search, and real peak-memory trials of a training step on 2 CPU towers."""

import os

import keras
import pytest
from conftest import run_python, tiny_config

from bert_mgpu.core.errors import UserError
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import memory, optimization, training


@pytest.mark.parametrize("largest, cap", [(37, 4096), (1, 4096), (0, 4096), (64, 64), (100, 64)])
def test_largest_fitting_finds_the_edge_in_few_trials(largest, cap):
    tried = []
    found = memory.largest_fitting(lambda b: tried.append(b) or b <= largest, cap)
    assert found == min(largest, cap)
    assert len(tried) <= 2 * max(1, found).bit_length() + 1


def allocator_like(rng):
    """A random step-peak model as an allocator reports one: weights, activations linear in the batch, a
    log term, rounding to bins -> (peak(batch), usable MiB, cap)."""
    import numpy as np

    base, per, log_term, binned = rng.uniform(5, 200), rng.uniform(0.05, 20), rng.uniform(0, 3), rng.uniform(0.01, 5)
    usable, cap = rng.uniform(base + per / 2, base + per * 3000), int(rng.choice([4096, 100, 64, 12]))
    return (lambda b: np.ceil((base + per * b + log_term * per * np.floor(np.log2(b))) / (binned * per)) * binned * per,
            usable, cap)


def both_searches(peak, usable, cap):
    """(edge, sizes tried) of the search by bisection, then of the one guessing from the peaks."""
    tried, trials = [], []
    found = memory.largest_fitting(lambda b: tried.append(b) or peak(b) <= usable, cap)
    guessed = memory.largest_fitting(lambda b: trials.append((b, peak(b))) or peak(b) <= usable, cap,
                                     guess=lambda low, high: memory.linear_edge(trials, usable))
    return (found, tried), (guessed, [b for b, _ in trials])


def test_a_guess_from_measured_peaks_finds_the_same_edge_in_fewer_trials():
    """Peaks as an allocator reports them (weights, activations linear in the batch, a log term, rounding
    to bins): with `linear_edge` guessing, the search returns what bisection does, in fewer trials."""
    import numpy as np

    rng = np.random.default_rng(0)
    plain, guessed = [], []
    for _ in range(400):
        peak, usable, cap = allocator_like(rng)
        (found, tried), (found_guessing, trials) = both_searches(peak, usable, cap)
        assert found_guessing == found
        assert len(trials) <= 2 * (2 * max(1, found).bit_length() + 1)  # a poor guess: bisection's next step
        plain.append(len(tried))
        guessed.append(len(trials))
    assert np.mean(guessed) < 0.7 * np.mean(plain), (np.mean(guessed), np.mean(plain))  # measured 5.7 vs 9.2

    # A straight line: from 1 and 2 to the edge, then the size past it.
    _, (found, trials) = both_searches(lambda b: 100 + 3.0 * b, 250.0, 4096)
    assert found == 50 and trials == [1, 2, 8, 32, 50, 51]
    assert memory.linear_edge([(4, None), (2, 10.0)], 50.0) is None  # one measured point: no line
    assert memory.linear_edge([(1, 10.0), (2, 10.0)], 50.0) is None  # flat: no line


@pytest.mark.process
def test_step_peak_grows_with_batch_and_the_search_stops_at_the_limit():
    plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(plan)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_size=64, intermediate_size=256), 2)
        opt = optimization.create_optimizer(0.0, 10, 0)  # trials are real steps: learning rate 0
        opt.build(model.trainable_variables)
    trainer = training.Trainer(strategy, model, opt)
    make = lambda n: memory.classifier_batch(n, 32)  # noqa: E731
    peaks = memory.step_peaks(trainer, make, plan, [1, 2, 4, 8, 16])
    # The step's working memory grows with the batch. Not by a fixed ratio: the same trial reads 8.7 to
    # 10.2 MiB at batch 8 and 12.4 to 16.9 at 16 from process to process (the BFC allocator's rounding);
    # oneDNN's allocator reads 0 above the resident weights for the smallest batches.
    assert peaks[16] > peaks[8] >= peaks[4] >= peaks[2] >= peaks[1] and peaks[16] > 2 * peaks[1], peaks
    limit = (peaks[8] + peaks[16]) / 2  # so 8 fits and 16 does not; the edge lies between them
    weights = [w.numpy().copy() for w in model.weights]
    best, trials = memory.find_batch_size(trainer, make, plan, limit_mb=limit, cap=64)
    got = dict(trials)
    usable = memory.RUN_MARGIN * limit  # 2% of the limit kept for what a run holds beyond a step
    assert 8 <= best < 16 and got[best] <= usable < got[best + 1]
    assert all((w.numpy() == v).all() for w, v in zip(model.weights, weights))  # trials train nothing


def _sort_peaks(meter):
    """Peak of an XLA-compiled sort of 32 then 8 MiB: its temporaries are several times its input."""
    import tensorflow as tf

    sort = tf.function(lambda x: tf.reduce_max(tf.sort(x * 3.0) - tf.sort(-x)), jit_compile=True)
    peaks = {}
    for mib in (32, 8):
        x = tf.random.uniform([mib * 2**18])  # mib MiB of float32
        sort(x)  # compile
        meter.reset()
        sort(x)
        peaks[mib] = meter.read_mb()
    return peaks


@pytest.mark.process
def test_cpu_peak_sees_the_memory_of_xla_compiled_kernels():
    """The allocator this process has keeps statistics whether TensorFlow runs oneDNN or not (.ci/run runs
    this file with TF_ENABLE_ONEDNN_OPTS=0 and =1); XLA's CPU kernels allocate from it, so the peak sees
    their temporaries, and a smaller step after a larger one reads its own peak."""
    peaks = _sort_peaks(memory.peak_meter(devices.plan_devices(0, 1, ())))
    assert 2 * 32 <= peaks[32] <= 8 * 32 and 2 * 8 <= peaks[8] <= 8 * 8, peaks


@pytest.mark.process
@pytest.mark.parametrize("onednn", ["0", "1"])
def test_towers_give_a_fresh_process_an_allocator_with_statistics(onednn):
    """What a user's process gets: Towers chooses TensorFlow's BFC CPU allocator where oneDNN is off (its
    default allocator keeps no statistics), and leaves oneDNN's own allocator alone where it is on."""
    import os
    import subprocess
    import sys

    code = ("import os, bert_mgpu, tensorflow as tf\n"
            "bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=1)\n"
            "x = tf.ones([2**20])\n"
            "tf.config.experimental.reset_memory_stats('CPU:0')\n"
            "y = x * 2.0\n"
            "print(os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'),\n"
            "      tf.config.experimental.get_memory_info('CPU:0')['peak'])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPU_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TF_ENABLE_ONEDNN_OPTS": onednn})
    assert proc.returncode == 0, proc.stderr[-1500:]
    bfc, peak = proc.stdout.split()
    assert bfc == ("true" if onednn == "0" else "None")
    assert int(peak) >= 2 * 4 * 2**20  # x and y, 4 MiB each


def test_without_statistics_auto_batch_says_so_in_one_line(monkeypatch):
    import tensorflow as tf

    def no_stats(name):
        raise ValueError(f"Cannot reset memory stats for device '{name}'")

    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", no_stats)
    with pytest.raises(UserError, match="keeps no memory statistics in this process.*TF_CPU_ALLOCATOR_USE_BFC"):
        memory.peak_meter(devices.plan_devices(0, 1, ()))


def test_cpu_needs_a_memory_limit():
    with pytest.raises(UserError, match="--auto_batch_size on CPU needs --memory_limit_mb"):
        memory.default_limit_mb(devices.plan_devices(0, 2, ()))


@pytest.mark.parametrize("free, cc, env, cap", [
    (16000, (7, 0), {}, 16000 - 1050), (80000, (8, 0), {}, 80000 - 1536), (1500, (6, 1), {}, 1500 - 225),
    (24000, (9, 0), {}, 24000 - 1800), (24000, (8, 6), {"TF_DEVICE_MIN_SYS_MEMORY_IN_MB": "100"}, 23900)])
def test_gpu_limit_is_95_percent_of_what_tensorflow_lets_a_tower_take(free, cc, env, cap, monkeypatch, caplog):
    """One tower a GPU (memory growth): TensorFlow's cap is the free memory less gpu_device.cc's reserve;
    towers sharing a GPU: the logical device's memory_limit. The log names the cap and the limit."""
    import logging

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plan = devices.plan_devices(1, 1, ("0",))
    gpus = [devices.GpuMemory("0", free, 2 * free, cc[0])]
    with caplog.at_level(logging.INFO, "bert_mgpu"):
        assert memory.default_limit_mb(plan, gpus=gpus) == pytest.approx(0.95 * cap)
    assert f"may take {cap:.0f} MiB on a tower of CUDA device 0; the limit keeps 5% of it free" in caplog.text
    split = devices.plan_devices(1, 2, ("0",))
    assert memory.default_limit_mb(split, gpus=gpus) == pytest.approx(0.95 * int(cap / 2))
    assert memory.default_limit_mb(split, memory_per_tower_mb=5000) == pytest.approx(0.95 * 5000)


def test_gpu_limits_come_from_the_gpu_with_least_free_memory_as_it_was_before_the_run(tmp_path, monkeypatch):
    """A fake nvidia-smi describing two different cards, the second busy with another process: every tower
    gets what TensorFlow would take of the busy one; a card nvidia-smi cannot describe asks for the flag."""
    cards = {"0": ("80000", "81920", "8.0"), "1": ("10000", "24576", "8.6")}  # free, total, compute capability
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(
        f'case "$*" in *{field}*"-i {i}") echo {value}; exit 0;; esac\n' for i, card in cards.items()
        for field, value in zip(("memory.free", "memory.total", "compute_cap"), card)) + "exit 9\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    plan = devices.plan_devices(2, 2, ("0", "1"))
    gpus = devices.gpu_memory(plan)
    assert [(g.name, g.free_mb, g.total_mb, g.cc_major) for g in gpus] == [("0", 80000, 81920, 8),
                                                                           ("1", 10000, 24576, 8)]
    assert devices.smallest_gpu(plan, gpus).name == "1"
    assert devices.tower_memory_limit_mb(plan, gpus=gpus) == int((10000 - 1536) / 2)  # not 92% of 81920 / 2
    assert memory.default_limit_mb(plan, gpus=gpus) == pytest.approx(0.95 * int((10000 - 1536) / 2))
    one_each = devices.plan_devices(2, 1, ("0", "1"))
    assert memory.default_limit_mb(one_each, gpus=gpus) == pytest.approx(0.95 * (10000 - 1536))
    with pytest.raises(UserError, match="cannot read the memory of CUDA device.s. 2 with nvidia-smi"):
        devices.tower_memory_limit_mb(devices.plan_devices(2, 2, ("0", "2")))


FRESH_PROCESS = """
import gc, json
import keras, tensorflow as tf
from conftest import tiny_config
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import memory, optimization, training
from bert_mgpu.train.loop import Hook, Loop

plan = devices.plan_devices(0, 2, ())
strategy = distribute.make_strategy(plan)
keras.utils.set_random_seed(0)
make = lambda n: memory.classifier_batch(n, 64)
held = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"] / 2**20
before, run, after = held(), [], []

class Held(Hook):
    def after_step(self, loop, record):
        run.append(held())

def search(model):  # as find_for_model: the probe is gone when it returns
    with strategy.scope():
        probe = training.Trainer(strategy, model, optimization.create_optimizer(0.0, 10, 0))
    return memory.find_batch_size(probe, make, plan, limit_mb=1e9, cap=4)[0], held()

def fit(name, auto_batch):
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_size=64, intermediate_size=256), 2)
    best, searched = search(model) if auto_batch else (4, None)
    gc.collect()
    data = tf.data.Dataset.from_tensors(make(2 * best)).repeat()
    with strategy.scope():
        trainer = training.Trainer(strategy, model, optimization.create_optimizer(1e-3, 100, 0, optimizer=name))
    Loop(trainer, 2 * best, log_every=1, hooks=[Held()], verbose=False).run(data.take(4), until_step=4)
    trainer.evaluate(data.take(2))
    run.append(held())
    weights.append(model.count_params())
    return best, searched

weights = []
best, searched = fit("adamw", auto_batch=True)  # the search's optimizer is the process's first
for name in ("lamb", "adamw"):
    gc.collect()
    after.append(held())
    fit(name, auto_batch=False)
gc.collect()
after.append(held())

from bert_mgpu.model.fused_encoder import _matmul_bias
x, w, b = tf.ones([4096, 64]), tf.ones([64, 96]), tf.ones([96])
fold = tf.function(lambda x: _matmul_bias(x, w, b, fold=True))
gc.collect()
start = held()
fold(x).numpy()
gc.collect()
print(json.dumps(dict(best=best, searched=searched, run=run[:5], before=before, later=run[5:], after=after,
                      weights=weights, folded=held() - start)))
"""


@pytest.fixture(scope="module")
def fresh_process():
    """FRESH_PROCESS's readings, from the BFC allocator's statistics (any CPU): an auto-batch search and a
    run, with the search's optimizer the process's first, then two more fits, each after the last is gone."""
    import json

    proc = run_python(FRESH_PROCESS, env={"TF_CPU_ALLOCATOR_USE_BFC": "true"}, fresh=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.process
def test_a_run_holds_between_steps_what_its_batch_search_held(fresh_process):
    """A trial stands for a run when the run holds no more between steps than the search did: weights,
    the evaluation's copies of them and the optimizer's moments, plus a few batches of token ids in the
    input pipeline; the step's own memory is the same traced step on the same batch. As in
    find_for_model, the search's optimizer (learning rate 0) is gone when the run's own takes its place.
    Between steps, because a step's peak moves with the order TensorFlow's threads run its ops
    (benchmarks/NOTES.md item 39)."""
    got = fresh_process
    assert got["best"] == 4 and got["searched"] > 2 * 3 * 111042 * 4 / 2**20, got  # 2 towers' weights, moments
    assert len(got["run"]) == 5 and max(got["run"]) <= got["searched"] + 0.1, got  # a batch: 6 KiB


@pytest.mark.process
def test_a_bias_folded_in_inference_leaves_no_batch_sized_constant_behind(fresh_process):
    """The inference matmul with its bias folded in, traced once for 4,096 rows: 32 columns of ones made as
    a constant (0.5 MiB) stayed with the traced function for its life: after its evaluation a run held one
    per batch width, which its batch search had not counted."""
    assert fresh_process["folded"] < 0.05, fresh_process


@pytest.mark.process
def test_a_model_and_its_optimizer_leave_no_memory_behind(fresh_process):
    """Weights and moments are freed with their model and optimizer, the process's first ones too: a
    program shared by every optimizer once kept the variables it was first traced with, so a run after an
    auto-batch search also held the search's moments, and a notebook the first model's."""
    got = fresh_process
    # At least each tower's float32 weights and its two Adam/LAMB moments (111,042 weights: 2.54 MiB); the
    # evaluation's copies come on top, how much of them is still held between steps varies by machine.
    assert set(got["weights"]) == {111042}, got
    assert min(got["run"] + got["later"]) > 2 * 3 * 111042 * 4 / 2**20, got
    # What stays (0.12 to 0.16 MiB) is less than half of one tower's weights (0.42 MiB; the shared program
    # kept 2.8 MiB), and a third fit adds nothing to it.
    assert max(a - got["before"] for a in got["after"]) < 0.2 and got["after"][2] <= got["after"][1] + 0.01, got


def test_gpu_trials_run_one_tower_alone_with_the_update_and_change_no_weight(monkeypatch):
    """The GPU path of the search on 2 logical CPU towers (the meter reads the host allocator): each trial
    is a forward, backward and optimizer update on the first tower alone, with learning rate 0."""
    import dataclasses

    cpu_plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(cpu_plan)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_size=64, intermediate_size=256), 2)
        opt = optimization.create_optimizer(0.0, 10, 0)
    trainer = training.Trainer(strategy, model, opt)
    monkeypatch.setattr(memory, "peak_meter", lambda plan: memory.AllocatorPeak(cpu_plan))
    gpu_plan = dataclasses.replace(cpu_plan, device_type="GPU")
    weights = [w.numpy().copy() for w in model.weights]
    best, trials = memory.find_batch_size(trainer, lambda n: memory.classifier_batch(n, 32), gpu_plan,
                                          limit_mb=1e9, cap=8)
    # Doubling; once two peaks rise, the guess (no limit: past the cap) jumps to the cap.
    assert best == 8 and [b for b, _ in trials] in ([1, 2, 4, 8], [1, 2, 8]), trials
    runs = 1 + memory.MEASURED_STEPS  # a trial: one run to trace, then the measured ones
    assert int(opt.iterations.numpy()) == runs * len(trials)  # each ran the update
    assert all((w.numpy() == v).all() for w, v in zip(model.weights, weights))


def test_cpu_trials_refuse_an_optimizer_that_would_train():
    plan = devices.plan_devices(0, 1, ())
    strategy = distribute.make_strategy(plan)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38), 2)
        opt = optimization.create_optimizer(1e-3, 10, 0)
    with pytest.raises(ValueError, match="learning rate 0"):
        memory.find_batch_size(training.Trainer(strategy, model, opt), None, plan, limit_mb=1.0)
