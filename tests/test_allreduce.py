"""Gradients between towers: packs TensorFlow's NCCL path really sends (traced, never run, on CPU devices),
the dtype each gradient crosses as, and a float16 sum over 8 towers that no longer overflows."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_python, tiny_config

from bert_mgpu import devices, distribute, memory, modeling, optimization, training


def nccl_packs(graph):
    """Element counts of the NCCL all-reduces in a traced graph, one per pack (tower 0's op of each)."""
    ops = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
    return sorted(int(op.inputs[0].shape.num_elements()) for op in ops if op.get_attr("num_devices") and
                  op.device.endswith("CPU:0"))


@pytest.mark.parametrize("bytes_per_pack", [None, 2**16, 2**20])
def test_the_step_sends_its_gradients_in_packs_of_the_size_asked_last_layers_first(bytes_per_pack):
    """MirroredStrategy with NcclAllReduce on two CPU towers, traced: TensorFlow would concatenate every
    gradient into one buffer; the step's own packs give one NCCL op per pack and tower, each about
    bytes_per_pack, holding together all gradient elements exactly once."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.NcclAllReduce())
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(500, hidden_size=64, intermediate_size=256), 2)
        opt = optimization.create_optimizer(1e-3, 10, 0)
    trainer = training.Trainer(strategy, model, opt, bytes_per_pack=bytes_per_pack)
    batch = memory.classifier_batch(4, 16)
    spec = distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(batch)).element_spec
    graph = trainer.step_graph(spec)
    packs = nccl_packs(graph)
    total = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert sum(packs) == total
    all_ops = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
    assert len(all_ops) == 2 * len(packs)  # one op a tower for each pack
    if bytes_per_pack is None:
        assert packs == [total]
        return
    largest = max(int(np.prod(v.shape)) for v in model.trainable_variables) * 4
    assert len(packs) >= total * 4 // max(bytes_per_pack, largest)
    assert all(p * 4 <= max(bytes_per_pack, largest) for p in packs)
    order = distribute.gradient_packs([int(np.prod(v.shape)) * 4 for v in model.trainable_variables], bytes_per_pack)
    assert order[0][0] == len(model.trainable_variables) - 1  # the head's last variable leads the first pack


def test_float16_gradients_cross_as_float16_but_layer_norms_embeddings_and_the_head_in_float32():
    with distribute.make_strategy(devices.plan_devices(0, 1, 1, ())).scope():
        model = modeling.build_classifier(tiny_config(38), 2, "mixed_float16")
    dtypes = dict(zip((v.path for v in model.trainable_variables),
                      training.allreduce_dtypes(model, tf.float16)))
    kinds = {}
    for path, dtype in dtypes.items():
        kind = ("norm" if "norm" in path else "embedding" if "embedding" in path else
                "head" if "classifier" in path or "logits" in path else "dense")
        kinds.setdefault(kind, set()).add(dtype)
    assert kinds["dense"] == {tf.float16}, dtypes
    assert kinds["norm"] == {tf.float32} and kinds["embedding"] == {tf.float32}, dtypes
    assert kinds.get("head", {tf.float32}) == {tf.float32}, dtypes
    assert set(training.allreduce_dtypes(model, tf.float32)) == {tf.float32}


EIGHT_TOWERS = """
import keras, numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
from bert_mgpu import devices, distribute, optimization, training
keras.mixed_precision.set_global_policy("mixed_float16")
strategy = distribute.make_strategy(devices.plan_devices(0, 8, 1, ()))
with strategy.scope():
    inputs = keras.Input([1])
    model = keras.Model(inputs, keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(inputs))
    opt = optimization.create_optimizer(1e-3, 10, 0, float16=True, initial_scale=1.0)
def loss_fn(model, features, labels, training=True):  # gradient of the kernel: 10000 on every tower
    return tf.reduce_sum(tf.cast(model(features), tf.float32)) * 10000.0, {}
trainer = training.Trainer(strategy, model, opt, loss_fn=loss_fn)
assert trainer.allreduce_dtype == tf.float16
batch = (np.ones([8, 1], np.float32), np.zeros([8], np.int32))
dist = next(iter(distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(batch))))
trainer.train_step(dist)
print("applied", trainer.applied_steps, "skipped", trainer.skipped_steps,
      "kernel", float(model.weights[0].numpy()[0, 0]))
"""


def test_eight_towers_float16_sum_that_would_overflow_is_applied_not_skipped():
    """Each tower's gradient (10000) fits float16; their 8-way sum (80000) would not (max 65504). Divided
    by 8 before the cast, the sum is the mean, and the step is applied."""
    assert 8 * 10000 > np.finfo(np.float16).max > 10000
    proc = run_python(EIGHT_TOWERS, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    words = proc.stdout.split()
    assert words[words.index("applied") + 1] == "1" and words[words.index("skipped") + 1] == "0", proc.stdout
    assert float(words[words.index("kernel") + 1]) < 1.0  # the update moved the weight


def test_a_collective_timeout_reaches_the_all_reduce_options():
    strategy = distribute.make_strategy(devices.plan_devices(0, 2, 1, ()))
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38), 2)
    assert training.Trainer(strategy, model)._comm.timeout_seconds is None
    assert training.Trainer(strategy, model, collective_timeout_seconds=600)._comm.timeout_seconds == 600


GROUPS = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
from bert_mgpu import devices, distribute
plan = devices.DevicePlan("GPU", (0, 1), ("0", "1"), 2, 8)  # 2 GPUs x 2 towers, as the plan numbers them
assert plan.all_reduce == "hierarchical" and plan.tower_groups == [[0, 1], [2, 3]]
places = [f"/cpu:{i}" for i in range(4)]

def replica():
    t = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32) + 1.0  # 1..4
    values = [tf.fill([3, 2], t), tf.cast(tf.fill([5], t * 10.0), tf.float16), tf.fill([1000], t)]
    return (distribute.all_reduce(tf.distribute.ReduceOp.SUM, values, bytes_per_pack=64),
            distribute.all_reduce(tf.distribute.ReduceOp.MEAN, values))

for nccl in (False, True):
    strategy = tf.distribute.MirroredStrategy(places, cross_device_ops=tf.distribute.ReductionToOneDevice(places[0]))
    distribute.reduce_in_groups(strategy, plan.tower_groups, nccl=nccl)
    step = tf.function(lambda: strategy.run(replica))
    if not nccl:
        sums, means = step()
        for k, expect in enumerate((10.0, 100.0, 10.0)):
            for tower in strategy.experimental_local_results(sums[k]):
                assert np.all(tower.numpy() == expect), (k, tower)
            for tower in strategy.experimental_local_results(means[k]):
                assert np.allclose(tower.numpy().astype(np.float32), expect / 4), (k, tower)
        print("values ok")
    else:
        ops = step.get_concrete_function().graph.get_operations()
        nccl_ops = [op for op in ops if op.type == "NcclAllReduce"]
        print("nccl", sorted({op.device for op in nccl_ops}), len(nccl_ops),
              {op.get_attr("num_devices") for op in nccl_ops})
        print("widest add", max(len(op.inputs) for op in ops if op.type == "AddN"))

import keras
from bert_mgpu import memory, modeling, optimization, training
from bert_mgpu.config import BertConfig
weights = []
for grouped in (False, True):  # two training steps, plain reduction to tower 0 against the grouped one
    strategy = tf.distribute.MirroredStrategy(places, cross_device_ops=tf.distribute.ReductionToOneDevice(places[0]))
    if grouped:
        distribute.reduce_in_groups(strategy, plan.tower_groups, nccl=False)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = modeling.build_classifier(BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0), 2)
        opt = optimization.create_optimizer(1e-2, 10, 0)
    trainer = training.Trainer(strategy, model, opt, bytes_per_pack=4096)
    batch = memory.classifier_batch(8, 16)
    batch = (batch[0], np.arange(8) % 2)
    dist = next(iter(distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(batch))))
    for _ in range(2):
        trainer.train_step(dist)
    weights.append([w.numpy() for w in model.weights])
print("train", max(float(np.abs(a - b).max()) for a, b in zip(*weights)))
"""


def test_several_towers_on_several_gpus_sum_on_each_gpu_then_nccl_between_gpus():
    """4 logical CPU towers as 2 GPUs x 2: values right for SUM and MEAN, mixed dtypes and packs (the
    sum between groups on CPU); traced with NCCL, only each group's first device joins an NCCL all-reduce,
    two devices each, and no device adds up more than its own group's two towers."""
    proc = run_python(GROUPS, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["values"] == "ok"
    devices_, count, sizes = lines["nccl"].rsplit(" ", 2)
    assert [d.rsplit("/", 1)[-1] for d in eval(devices_)] == ["device:CPU:0", "device:CPU:2"] and sizes == "{2}"
    # SUM: packs of 64 bytes -> the [1000] value alone, then [5] float16 and [3, 2] float32 (2 dtypes): 3
    # buffers; MEAN: one pack, 2 dtypes: 2 buffers; each on the 2 group leaders
    assert int(count) == 2 * (3 + 2)
    assert lines["widest"] == "add 2"
    assert float(lines["train"]) < 1e-6  # training through the groups: the same weights as through tower 0
