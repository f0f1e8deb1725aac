import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.parallel import devices, distribute


def test_plan_follows_cuda_visible_devices_order():
    visible = devices.visible_gpu_names(6, "1,2,3,4,5,6")
    assert visible == ("1", "2", "3", "4", "5", "6")
    plan = devices.plan_devices(3, 1, visible)
    assert plan.device_type == "GPU"
    assert plan.devices == ("/gpu:0", "/gpu:1", "/gpu:2")
    assert plan.visible_names == ("1", "2", "3")
    assert (plan.towers, plan.all_reduce) == (3, "nccl")
    assert "tower 2: /gpu:2 (CUDA device 3)" in plan.describe()
    assert "global batch = 32 x 3 = 96" in plan.describe(32) and "global batch" not in plan.describe()


def test_towers_per_gpu_multiplies_towers_and_batch():
    plan = devices.plan_devices(2, 3, ("5", "7"))
    assert (plan.towers, plan.all_reduce) == (6, "ring")  # NCCL: one rank per GPU
    assert "global batch = 8 x 6 = 48" in plan.describe(8)
    assert devices.plan_devices(1, 3, ("5",)).all_reduce == "ring"
    assert plan.devices == tuple(f"/gpu:{i}" for i in range(6))
    assert "tower 4: /gpu:4 (CUDA device 7)" in plan.describe()


def test_cpu_plan_makes_logical_towers():
    plan = devices.plan_devices(0, 4, ())
    assert (plan.device_type, plan.towers) == ("CPU", 4)
    assert "global batch = 16 x 4 = 64" in plan.describe(16)
    assert "global batch = 16 x 4 x 2 accumulation steps = 128" in plan.describe(16, 2)  # was "= 64" then 128
    assert plan.devices == ("/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3")
    assert plan.all_reduce == "ring" and devices.plan_devices(0, 1, ()).all_reduce == "none"


@pytest.mark.parametrize("n_gpus, visible, message", [
    (2, (), "--n_gpus=2 but only 0 GPU(s) are visible (CUDA devices: none)"),
    (4, ("1", "3"), "--n_gpus=4 but only 2 GPU(s) are visible (CUDA devices: 1,3)"),
    (-2, ("0",), "--n_gpus=-2 is invalid"),
])
def test_bad_gpu_counts_are_one_clear_error(n_gpus, visible, message):
    with pytest.raises(UserError) as e:
        devices.plan_devices(n_gpus, 1, visible)
    assert message in str(e.value)


def test_bad_towers_and_batch():
    with pytest.raises(UserError, match="--towers_per_gpu=0 is invalid"):
        devices.plan_devices(0, 0, ())
    with pytest.raises(UserError, match="--train_batch_size=0 is invalid"):
        devices.Towers.from_plan(devices.plan_devices(0, 1, ()), train_batch_size=0)


def test_visible_names_empty_and_unset():
    assert devices.visible_gpu_names(0, "") == ()
    assert devices.visible_gpu_names(0, None) == ()
    assert devices.visible_gpu_names(2, None) == ("0", "1")
    with pytest.raises(UserError, match=r"CUDA_VISIBLE_DEVICES=0,1,7 lists 3 device\(s\) but TensorFlow sees "
                                        r"only 2 \(0, 1, 7\)"):
        devices.visible_gpu_names(2, "0,1,7")
    with pytest.raises(UserError, match=r"CUDA_VISIBLE_DEVICES=5,7 lists 2 device\(s\) but TensorFlow sees only 0"):
        devices.visible_gpu_names(0, "5,7")  # devices that do not exist: CUDA shows none


def test_strategy_on_two_logical_cpus():
    plan = devices.plan_devices(0, 2, ())
    devices.configure_devices(plan)  # runtime already started by conftest: reuses its 2 devices
    strategy = distribute.make_strategy(plan)
    assert strategy.num_replicas_in_sync == 2
    assert [d.split("/")[-1] for d in strategy.extended.worker_devices] == ["device:CPU:0", "device:CPU:1"]
    assert _compat.collective_options(strategy).implementation.name == "RING"  # TensorFlow's choice on CPUs


def test_configure_refuses_more_towers_than_started_devices():
    tf.constant(1.0)  # make sure the runtime has started
    with pytest.raises(UserError, match="already started with 2 logical CPU device"):
        devices.configure_devices(devices.plan_devices(0, 3, ()))


def _two_towers():
    return distribute.make_strategy(devices.plan_devices(0, 2, ()))


def test_distribute_dataset_splits_each_global_batch_across_the_towers():
    strategy = _two_towers()
    ds = tf.data.Dataset.range(11).map(lambda i: ({"ids": tf.fill([3], i)}, i)).batch(4)
    dist = distribute.distribute_dataset(strategy, ds)
    assert dist.dataset.options().autotune.enabled is False  # no autotuning thread to wait for on drop
    seen = []
    for features, labels in dist:
        parts = strategy.experimental_local_results(labels)
        ids = strategy.experimental_local_results(features["ids"])
        assert [p.device.split("/")[-1] for p in parts] == ["device:CPU:0", "device:CPU:1"]
        for p, i in zip(parts, ids):
            np.testing.assert_array_equal(i.numpy(), np.repeat(p.numpy()[:, None], 3, axis=1))
        seen.append([p.numpy().tolist() for p in parts])
    # contiguous halves, the partial last batch 2 + 1
    assert seen == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10]]]


def test_distribute_dataset_traces_a_step_once_and_leaves_a_tower_empty_when_rows_run_out():
    strategy = _two_towers()
    ds = tf.data.Dataset.range(9).batch(4)  # batches of 4, 4, 1: the last gives tower 1 nothing
    dist = distribute.distribute_dataset(strategy, ds)
    step = tf.function(lambda b: strategy.run(lambda x: tf.stack([tf.size(x, tf.int64), tf.reduce_sum(x)]),
                                              args=(b,)), input_signature=[dist.element_spec])
    out = [[r.numpy().tolist() for r in strategy.experimental_local_results(step(b))] for b in dist]
    assert out == [[[2, 1], [2, 5]], [[2, 9], [2, 13]], [[1, 8], [0, 0]]]
    assert step.experimental_get_tracing_count() == 1


def test_distribute_dataset_cuts_every_dataset_of_one_signature_with_one_trace():
    """A prediction pass makes a new dataset: its split must not be traced again (NOTES.md item 21)."""
    strategy = _two_towers()
    first = distribute.distribute_dataset(strategy, tf.data.Dataset.range(10, 19).batch(4))
    second = distribute.distribute_dataset(strategy, tf.data.Dataset.range(5).batch(4))
    got = [[r.numpy().tolist() for r in strategy.experimental_local_results(b)] for d in (first, second) for b in d]
    assert got == [[[10, 11], [12, 13]], [[14, 15], [16, 17]], [[18], []], [[0, 1], [2, 3]], [[4], []]]
    assert first._split is second._split and first._split.experimental_get_tracing_count() == 1


def test_distribute_dataset_keeps_a_static_batch_static_per_tower():
    strategy = _two_towers()
    fixed = distribute.distribute_dataset(strategy, tf.data.Dataset.range(16).batch(4, drop_remainder=True))
    assert [s.shape.as_list() for s in fixed.element_spec._value_specs] == [[2], [2]]
    odd = distribute.distribute_dataset(strategy, tf.data.Dataset.range(15).batch(3, drop_remainder=True))
    assert [s.shape.as_list() for s in odd.element_spec._value_specs] == [[None], [None]]


def test_distribute_dataset_refuses_what_it_cannot_split():
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]])).batch(2)
    with pytest.raises(TypeError, match="splits batched dense tensors, not RaggedTensorSpec"):
        distribute.distribute_dataset(_two_towers(), ragged)
    with pytest.raises(TypeError, match="splits batched dense tensors"):
        distribute.distribute_dataset(_two_towers(), tf.data.Dataset.range(3))  # unbatched scalars


@pytest.mark.parametrize("fused", [True, False])
def test_each_tower_draws_its_own_dropout_masks_and_the_first_tower_keeps_keras_own(fused):
    import keras
    from conftest import tiny_config

    from bert_mgpu.io import run_dir
    from bert_mgpu.model import modeling

    strategy = distribute.make_strategy(devices.plan_devices(0, 2, ()))
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38), 2, "float32", fused=fused)  # dropout 0.1
    ids = np.tile(np.arange(2, 14, dtype=np.int32), (8, 1))  # every row the same, 4 on each tower
    batch = next(iter(distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(
        {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}))))
    states = {k: v.numpy() for k, v in run_dir.rng_states(model).items()}

    def towers_logits():  # traced anew each time: per_tower_seeds acts on the traced step
        step = tf.function(lambda b: strategy.run(lambda f: model(f, training=True), args=(b,)))
        out = [t.numpy() for t in strategy.experimental_local_results(step(batch))]
        for k, v in run_dir.rng_states(model).items():
            v.assign(states[k])
        return out

    keras_own = towers_logits()
    assert not np.allclose(keras_own[0][0], keras_own[0][1])  # dropout is on: rows of one tower differ
    np.testing.assert_array_equal(keras_own[0], keras_own[1])  # Keras alone: the towers drop the same units
    distribute.per_tower_seeds(model)
    distribute.per_tower_seeds(model)  # a second call changes nothing
    tower_0, tower_1 = towers_logits()
    np.testing.assert_array_equal(tower_0, keras_own[0])
    assert np.abs(tower_1 - tower_0).max() > 1e-3


@pytest.mark.parametrize("n_gpus, visible, kind, towers, why", [
    (-1, ("3", "5"), "GPU", 2, "every visible GPU"), (-1, (), "CPU", 1, "no GPU visible: the CPU"),
    (0, ("3", "5"), "CPU", 1, "--n_gpus=0: the CPU, GPUs hidden from TensorFlow"),
    (1, ("3", "5"), "GPU", 1, "--n_gpus=1")])
def test_the_default_takes_every_visible_gpu_and_the_log_says_which(n_gpus, visible, kind, towers, why):
    plan = devices.plan_devices(n_gpus, 1, visible)
    assert (plan.device_type, plan.towers) == (kind, towers)
    assert plan.describe().splitlines()[0].endswith(f"({why})")
    assert devices.Towers.__init__.__defaults__[0] == -1


def test_a_cpu_plan_hides_the_gpus_from_tensorflow(monkeypatch):
    """With --n_gpus=0 TensorFlow must not map the GPUs' memory nor place unscoped ops on GPU:0."""
    calls = []
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda devs, kind=None: calls.append((list(devs), kind)))
    devices._apply_plan(tf, devices.plan_devices(0, 1, ("0", "1")), None)
    assert calls == [([], "GPU")]


def _fake_nvidia_smi(tmp_path, monkeypatch, rows):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(f"'{r}'" for r in rows) + "\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")


def test_a_gpu_tensorflow_skips_is_named_with_its_compute_capability(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, ["0, GPU-aaa, NVIDIA A100-SXM4-40GB, 8.0", "1, GPU-bbb, Tesla K80, 3.7"])
    smi = devices.nvidia_smi_gpus()
    assert smi[1] == ("1", "GPU-bbb", "Tesla K80", "3.7")
    with pytest.raises(UserError, match=r"lists 2 device\(s\) but TensorFlow sees only 1 \(0 \(NVIDIA A100-SXM4-40GB, "
                       r"compute capability 8.0\), 1 \(Tesla K80, compute capability 3.7\)\)"):
        devices.visible_gpu_names(1, "0,1", smi)
    with pytest.raises(UserError, match="^nvidia-smi lists 2 device.*Tesla K80"):
        devices.visible_gpu_names(1, None, smi)  # CUDA_VISIBLE_DEVICES unset: every GPU nvidia-smi lists
    assert devices.visible_gpu_names(2, None, smi) == ("0", "1")


def test_more_than_one_mig_instance_is_refused_in_one_line_and_one_works():
    with pytest.raises(UserError, match="CUDA gives one process at most one MIG instance"):
        devices.visible_gpu_names(1, "MIG-aaa,MIG-bbb", [])
    assert devices.visible_gpu_names(1, "MIG-aaa", []) == ("MIG-aaa",)
    assert devices.gpu_memory_mb("MIG-aaa") is None  # nvidia-smi's GPU query has no MIG memory: ask the flag


def test_gpus_are_numbered_as_nvidia_smi_numbers_them(tmp_path, monkeypatch):
    env = {}
    devices.number_gpus_as_nvidia_smi(env)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    own = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    devices.number_gpus_as_nvidia_smi(own)
    assert own == {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    _fake_nvidia_smi(tmp_path, monkeypatch, ["40960"])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert devices.gpu_memory_mb("1") == 40960
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # nvidia-smi's index 1 may be another GPU
    assert devices.gpu_memory_mb("1") is None


def test_towers_name_their_batch_per_tower_and_global():
    towers = devices.Towers(n_gpus=0, towers_per_gpu=2, per_tower_batch=16)
    assert (towers.per_tower_batch, towers.global_batch, towers.batch(4)) == (16, 32, 8)
    assert devices.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8).global_batch == 16


def test_cuda_numbers_gpus_as_nvidia_smi_from_the_first_import_whatever_the_log_level(tmp_path):
    """bert_mgpu sets CUDA_DEVICE_ORDER when it is imported, before any script or notebook can start CUDA
    (scripts start TensorFlow at once when TF_CPP_MIN_LOG_LEVEL is unset, later when it is set)."""
    from conftest import run_python

    code = ("import os; import bert_mgpu.cli; print('order', os.environ.get('CUDA_DEVICE_ORDER')); "
            "import sys; print('tensorflow loaded', 'tensorflow' in sys.modules)")
    for level in (None, "2"):
        out = run_python(code, env={"CUDA_DEVICE_ORDER": None, "TF_CPP_MIN_LOG_LEVEL": level}, fresh=True).stdout
        assert "order PCI_BUS_ID" in out and "tensorflow loaded False" in out, out
    own = run_python(code, env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, fresh=True).stdout
    assert "order FASTEST_FIRST" in own


def test_one_tower_strategies_in_one_process_gather_batches_of_any_shape():
    """Two one-tower runs in one process (a notebook's second model; the next run of a resident script):
    the second's predictions gather batches of another shape. Gathering a one-tower batch launches a
    one-member collective and TensorFlow keeps each collective instance's shape for the process's life,
    so two strategies on TensorFlow's default keys failed here with "Shape mismatch in the collective
    instance 100" and aborted every collective after it. The CPU's tower, then one GPU's objects (NCCL, as
    TensorFlow picks on a GPU) on the CPU device. A process of its own: that abort is for good."""
    from conftest import run_python

    code = """
import numpy as np
import tensorflow as tf
from bert_mgpu.core import _compat
from bert_mgpu.parallel import devices, distribute

for plan in (devices.plan_devices(0, 1, []), devices.plan_devices(1, 1, ["0"])):
    for rows, labels in ((8, np.arange(8)), (4, np.ones((4, 2))), (6, np.zeros((6, 3, 2)))):
        strategy = distribute.make_strategy(plan, devices=["/cpu:0"])   # a new model's towers
        gather = tf.function(lambda b, s=strategy: [s.gather(t, axis=0) for t in b], autograph=False)
        dataset = tf.data.Dataset.from_tensor_slices((np.arange(rows), labels)).batch(rows)
        for batch in distribute.distribute_dataset(strategy, dataset):
            index, got = (t.numpy() for t in gather(batch))
            assert np.array_equal(index, np.arange(rows)) and np.array_equal(got, labels), (index, got)
    print(plan.device_type, _compat.collective_options(strategy).implementation.name, rows)
"""
    assert run_python(code).stdout.split()[-6:] == ["CPU", "RING", "6", "GPU", "NCCL", "6"]
