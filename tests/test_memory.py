"""--auto_batch_size: the search, and real peak-memory trials of a training step on 2 CPU towers."""

import keras
import pytest

from bert_mgpu import devices, memory, modeling, optimization, training
from bert_mgpu.errors import UserError
from conftest import tiny_config


@pytest.mark.parametrize("largest, cap", [(37, 4096), (1, 4096), (0, 4096), (64, 64), (100, 64)])
def test_largest_fitting_finds_the_edge_in_few_trials(largest, cap):
    tried = []
    found = memory.largest_fitting(lambda b: tried.append(b) or b <= largest, cap)
    assert found == min(largest, cap)
    assert len(tried) <= 2 * max(1, found).bit_length() + 1


def test_step_peak_grows_with_batch_and_the_search_stops_at_the_limit():
    plan = devices.plan_devices(0, 2, 1, ())
    strategy = devices.make_strategy(plan)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_size=64, intermediate_size=256), 2)
        opt = optimization.create_optimizer(1e-3, 10, 0)
        opt.build(model.trainable_variables)
    trainer = training.Trainer(strategy, model, opt)
    make = lambda n: memory.classifier_batch(n, 32)  # noqa: E731
    _, probe = memory.find_batch_size(trainer, make, plan, limit_mb=1e9, cap=16)
    peaks = dict(probe)
    assert peaks[16] > 1.5 * peaks[8] > 2.0 * peaks[4]  # the step's working memory grows with the batch
    limit = (peaks[8] + peaks[16]) / 2  # so 8 fits and 16 does not; the edge lies between them
    weights = [w.numpy().copy() for w in model.weights]
    best, trials = memory.find_batch_size(trainer, make, plan, limit_mb=limit, cap=64)
    got = dict(trials)
    assert 8 <= best < 16 and got[best] <= limit and got[best + 1] > limit
    assert all((w.numpy() == v).all() for w, v in zip(model.weights, weights))  # trials train nothing


def test_cpu_peak_sees_the_memory_of_xla_compiled_kernels():
    """The fused encoder's kernels are XLA-compiled; on CPU their buffers and scratch come from TensorFlow's
    allocator too, so the peak the search reads sees them (here: sort's temporaries, several times its
    input), and a smaller step after a larger one reads its own peak."""
    import tensorflow as tf

    plan = devices.plan_devices(0, 1, 1, ())
    sort = tf.function(lambda x: tf.reduce_max(tf.sort(x * 3.0) - tf.sort(-x)), jit_compile=True)
    peaks = {}
    for mib in (256, 64):
        x = tf.random.uniform([mib * 2**18])  # mib MiB of float32
        sort(x)  # compile
        memory.reset_peak(plan)
        sort(x)
        peaks[mib] = memory.peak_mb(plan)
    assert 2 * 256 <= peaks[256] <= 8 * 256 and 2 * 64 <= peaks[64] <= 8 * 64, peaks


def test_cpu_needs_a_memory_limit():
    with pytest.raises(UserError, match="--auto_batch_size on CPU needs --memory_limit_mb"):
        memory.default_limit_mb(devices.plan_devices(0, 2, 1, ()))
