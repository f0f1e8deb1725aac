"""The TensorFlow, Keras and keras-hub internals bert_mgpu/core/_compat.py reads are still where it reads them."""

import subprocess
import sys

import pytest


@pytest.mark.process
def test_onednn_decision_is_readable_and_follows_the_environment():
    code = "from bert_mgpu import _compat; print(_compat.onednn_enabled())"
    seen = {}
    for value in ("0", "1"):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**__import__("os").environ, "TF_ENABLE_ONEDNN_OPTS": value})
        assert proc.returncode == 0, ("tensorflow.python.util._pywrap_util_port.IsMklEnabled moved in this "
                                      "TensorFlow; update bert_mgpu/core/_compat.py.onednn_enabled\n"
                                      + proc.stderr[-800:])
        seen[value] = proc.stdout.strip().splitlines()[-1]
    assert seen == {"0": "False", "1": "True"}


def _moved(what, error):
    return f"{what} moved in this Keras / keras-hub / TensorFlow ({type(error).__name__}: {error}); update " \
           "bert_mgpu/core/_compat.py"


def test_keras_hub_transformer_and_masked_lm_parts_are_where_compat_reads_them():
    import keras
    import keras_hub

    from bert_mgpu.core import _compat

    backbone = keras_hub.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=12)
    try:
        parts = _compat.transformer_parts(backbone.transformer_layers[0])
        head = keras_hub.layers.MaskedLMHead(vocabulary_size=30, token_embedding=backbone.token_embedding)
        head(keras.ops.zeros([1, 4, 8]), mask_positions=keras.ops.zeros([1, 2], "int32"))
        mlm = _compat.masked_lm_parts(head)
    except AttributeError as e:
        raise AssertionError(_moved("a keras-hub private sub-layer", e)) from None
    shapes = {name: tuple(getattr(p, "kernel", p.gamma if hasattr(p, "gamma") else None).shape)
              for name, p in parts._asdict().items()}
    assert shapes == {"query": (8, 2, 4), "key": (8, 2, 4), "value": (8, 2, 4), "attention_output": (2, 4, 8),
                      "attention_norm": (8,), "intermediate": (8, 16), "output": (16, 8), "output_norm": (8,)}
    assert (tuple(mlm.dense.kernel.shape), tuple(mlm.norm.gamma.shape), tuple(mlm.bias.shape)) == \
        ((8, 8), (8,), (30,))


def test_keras_seed_generators_and_layers_are_found_and_wrapped():
    import keras

    from bert_mgpu.core import _compat

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dropout(0.5)(keras.layers.Dense(4)(inputs)))
    try:
        layers = _compat.sublayers(model)
        generators = _compat.seed_generators(model)
    except AttributeError as e:
        raise AssertionError(_moved("Keras' layer walk or seed generators", e)) from None
    assert [type(x).__name__ for x in layers][-2:] == ["Dense", "Dropout"] and len(generators) == 1
    generator = generators[0]
    plain = keras.ops.convert_to_numpy(generator.next()).tolist()
    _compat.wrap_seed_generator(generator, lambda keras_next, ordered=True: keras_next(ordered) * 0 + 7)
    _compat.wrap_seed_generator(generator, lambda keras_next, ordered=True: keras_next(ordered) * 0 + 9)
    assert keras.ops.convert_to_numpy(generator.next()).tolist() == [9, 9] and len(plain) == 2


def test_per_replica_spec_is_what_tf_distribute_reports():
    import tensorflow as tf

    from bert_mgpu.core import _compat

    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    own = strategy.experimental_distribute_dataset(tf.data.Dataset.range(4).batch(4)).element_spec
    try:
        spec = _compat.per_replica_spec(tf.TensorSpec([2], tf.int64), tf.TensorSpec([2], tf.int64))
    except (ImportError, AttributeError) as e:
        raise AssertionError(_moved("tensorflow.python.distribute.values.PerReplicaSpec", e)) from None
    assert type(spec) is type(own), (type(spec), type(own))


def test_keras_optimizer_slots_decay_and_learning_rate_are_where_compat_reads_them():
    import keras
    import numpy as np

    from bert_mgpu.core import _compat

    for cls in (keras.optimizers.AdamW, keras.optimizers.Lamb):
        kernel, bias = keras.Variable(np.ones((2, 3), "float32"), name="kernel"), keras.Variable(
            np.zeros(3, "float32"), name="bias")
        opt = cls(learning_rate=keras.optimizers.schedules.PolynomialDecay(0.5, 10, 0.0), weight_decay=0.1)
        opt.exclude_from_weight_decay(var_names=["bias"])
        opt.build([kernel, bias])
        try:
            m, v = _compat.optimizer_moments(opt, kernel)
            decays = (_compat.uses_weight_decay(opt, kernel), _compat.uses_weight_decay(opt, bias))
            lr = float(_compat.current_learning_rate(opt))
        except AttributeError as e:
            raise AssertionError(_moved(f"{cls.__name__}'s moments, decay or learning rate", e)) from None
        assert tuple(m.shape) == tuple(v.shape) == (2, 3) and m is not v, cls
        assert decays == (True, False) and lr == 0.5, (cls, decays, lr)


MULTI_WORKER_PROBE = """
import socket, sys
import tensorflow as tf
from bert_mgpu.core import _compat
from bert_mgpu.parallel.cluster import Cluster
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
cluster = Cluster({"worker": [f"127.0.0.1:{port}"]}, "worker", 0, "test")
try:
    alone = _compat.wait_for_workers("before_the_job", 5)
    with _compat.multi_worker_local_devices("CPU", 2):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster.resolver())
    ops = _compat.host_cross_device_ops(strategy)
    together = _compat.wait_for_workers("in_the_job", 30)
except AttributeError as e:
    sys.exit(f"MOVED {type(e).__name__}: {e}")
print("barrier", alone, together)
print("devices", list(strategy.extended.worker_devices))
with tf.device("/cpu:0"):
    total = tf.function(lambda x: ops.reduce(tf.distribute.ReduceOp.SUM, x, destinations="/cpu:0"))(
        tf.constant([1.5, 2.0], tf.float64))
print("sum", total.numpy().tolist())
"""


def test_multi_worker_strategy_takes_the_plans_towers_and_reduces_on_the_host():
    """MultiWorkerMirroredStrategy's choice of local devices, its host collectives and its coordination
    service's barrier (all private), in a job of one worker on loopback; a process of its own, since the
    strategy starts a server in it."""
    import os

    proc = subprocess.run([sys.executable, "-c", MULTI_WORKER_PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert "MOVED" not in proc.stderr, ("MultiWorkerMirroredStrategy's CollectiveAllReduceExtended."
                                        "_initialize_local_devices, _host_cross_device_ops or the context's "
                                        "wait_at_barrier moved in this "
                                        "TensorFlow; update bert_mgpu/core/_compat.py\n" + proc.stderr[-800:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "devices ['/job:worker/replica:0/task:0/device:CPU:0', '/job:worker/replica:0/task:0/device:CPU:1']" \
        in lines
    assert "sum [1.5, 2.0]" in lines  # one worker: its own values
    assert "barrier False True" in lines  # no job, nothing to wait for; in the job, everyone (itself) came


def test_preemption_handler_is_told_its_platform_saves_once_at_the_agreed_step_and_stops_its_threads():
    """TensorFlow's PreemptionCheckpointHandler as distribute.preemption_handler builds it, in local mode
    (no cluster): a watcher that turns true makes the call after the next one save, then call exit_fn."""
    import threading

    import tensorflow as tf

    from bert_mgpu.core import _compat
    from bert_mgpu.parallel import distribute

    signal_seen, saves = threading.Event(), []

    class Stopped(Exception):
        pass

    def stop():
        raise Stopped

    calls = [0]

    def step():
        _compat.save_if_preempted(handler)
        calls[0] += 1

    try:
        from tensorflow.python.distribute.failure_handling import failure_handling_util as util

        assert callable(util.detect_platform) and util.PlatformDevice.INTERNAL_CPU
        handler = distribute.preemption_handler(tf.distribute.MirroredStrategy(["/cpu:0"]),
                                                lambda: signal_seen.wait(30), lambda: saves.append(calls[0]), stop)
        assert handler._platform_device == util.PlatformDevice.INTERNAL_CPU  # not asked of GCE's metadata server
        for _ in range(3):  # no signal: no save
            step()
        signal_seen.set()
        for _ in range(100):  # its watcher thread sees the flag at once
            if handler._received_own_sigterm.is_set():
                break
            threading.Event().wait(0.05)
        with pytest.raises(Stopped):
            for _ in range(7):
                step()
        assert saves == [4] and calls == [4]  # the call after the one that saw the signal
        assert handler._poll_termination_signal_thread is None  # it stopped its watcher before the exit

        quiet = distribute.preemption_handler(tf.distribute.MirroredStrategy(["/cpu:0"]), lambda: False,
                                              saves.append, stop)
        watcher = quiet._poll_termination_signal_thread
        assert watcher.is_alive()
        _compat.stop_preemption_watchers(quiet)
        assert not watcher.is_alive() and quiet._poll_termination_signal_thread is None
    except AttributeError as e:
        raise AssertionError(_moved("PreemptionCheckpointHandler's platform detection or watcher threads", e)) \
            from None


def test_mirrored_strategy_collectives_take_the_options_compat_sets_and_keys_of_their_own():
    """MirroredStrategy's own CollectiveAllReduce (private), its options and launchers, and the key base that
    keeps two strategies over the same devices apart: both strategies run an all-reduce, in turn."""
    import tensorflow as tf

    from bert_mgpu.core import _compat

    results = []
    for implementation in ("NCCL", "RING"):
        try:
            strategy = _compat.mirrored_with_collectives(["/cpu:0", "/cpu:1"], implementation, timeout_seconds=30)
            options = _compat.collective_options(strategy)
        except (AttributeError, RuntimeError) as e:
            raise AssertionError(_moved("MirroredStrategy's CollectiveAllReduce and its options", e)) from None
        assert options.implementation.name == implementation and options.timeout_seconds == 30
        assert all(launcher._options is options for launcher in strategy.extended._collective_ops._launchers)
        step = tf.function(lambda s=strategy: s.run(lambda: tf.distribute.get_replica_context().all_reduce(
            "sum", tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32) + 1.0)))
        results.append([float(t) for t in strategy.experimental_local_results(step())])
    assert results == [[3.0, 3.0], [3.0, 3.0]]
