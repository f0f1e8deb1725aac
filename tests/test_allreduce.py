"""Gradients between towers on the GPU path, built with the exact objects a GPU run builds (devices.DevicePlan
of GPUs, distribute.make_strategy, CollectiveAllReduce with NCCL) on CPU devices, where NCCL-hinted
collectives run as RING through the same packing and concatenation: executed, not only traced. Also the
dtype each gradient crosses as, and a float16 sum over 8 towers that no longer overflows."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_python, tiny_config

from bert_mgpu.core import _compat
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import memory, optimization, training

CPU_TOWERS = ["/cpu:0", "/cpu:1"]


def gpu_strategy(towers_per_gpu=1):
    """What `--n_gpus=2` (or one GPU split in 2 towers) builds, on the two CPU devices."""
    gpus = ("0", "1") if towers_per_gpu == 1 else ("0",)
    plan = devices.plan_devices(len(gpus), towers_per_gpu, gpus)
    return plan, distribute.make_strategy(plan, devices=CPU_TOWERS, timeout_seconds=120)


def collectives(graph):
    """(communication hint, dtype, elements) of each tower-0 all-reduce in a traced step."""
    return [(op.get_attr("communication_hint").decode(), op.get_attr("T"), op.inputs[0].shape.num_elements())
            for op in graph.get_operations() if op.type == "CollectiveReduceV2" and op.device.endswith("CPU:0")]


def test_a_gpu_plan_builds_tensorflows_nccl_collectives_and_ring_where_towers_share_a_gpu():
    plan, strategy = gpu_strategy()
    assert plan.all_reduce == "nccl"
    options = _compat.collective_options(strategy)
    assert options.implementation.name == "NCCL" and options.timeout_seconds == 120
    plan, strategy = gpu_strategy(towers_per_gpu=2)
    assert plan.all_reduce == "ring" and _compat.collective_options(strategy).implementation.name == "RING"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float32"])
def test_the_gpu_step_runs_with_every_precision_in_packs_of_one_dtype_last_layers_first(policy):
    """A mixed_float16 step sends float16 (dense layers) and float32 (LayerNorms, embeddings, head)
    gradients; TensorFlow concatenates each pack into one buffer, so a pack mixing them crashed every
    mixed_float16 multi-GPU run. Executed here on the GPU run's objects: every pack has one dtype, the
    packs hold every gradient element once, the first pack holds the head's last variable, and two
    steps leave both towers' weights bit-equal."""
    _, strategy = gpu_strategy()
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(500, hidden_size=64, intermediate_size=256), 2, policy)
        opt = optimization.create_optimizer(1e-3, 10, 0, float16=policy == "mixed_float16")
    trainer = training.Trainer(strategy, model, opt, bytes_per_pack=2**14)
    batch = memory.classifier_batch(8, 16)
    batch = (batch[0], np.arange(8, dtype=np.int32) % 2)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors(batch).repeat(2))
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"}, sent
    losses = [trainer.train_step(next(batches))[0] for _ in range(2)]
    assert all(np.isfinite(losses)) and trainer.applied_steps == 2, losses
    grads = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    packs = [n for _, _, n in sent if n > 1]  # the step's scalars (loss, statistics) cross alone
    assert sum(packs) == grads and len(packs) >= 4, sent
    dtypes = {d for _, d, n in sent if n > 1}
    expect = {tf.float16, tf.float32} if policy == "mixed_float16" else {tf.float32}
    assert dtypes == expect, sent
    for v in model.trainable_variables:
        a, b = strategy.experimental_local_results(v.value)
        assert np.array_equal(a.numpy(), b.numpy()), v.path


@pytest.mark.parametrize("head", ["tagger_crf", "span", "multiple_choice"])
def test_the_token_heads_step_on_the_gpu_path_in_mixed_float16(head):
    """run_ner_mgpu.py --crf, run_squad_mgpu.py and run_multiple_choice_mgpu.py on GPUs: the token, span and
    choice heads' float32 scores, the CRF's float32 transitions and the encoder's float16 gradients cross in
    packs of one dtype on NCCL; both towers stay equal."""
    from bert_mgpu.model.choice_objectives import MultipleChoice
    from bert_mgpu.model.span_objectives import SpanExtraction
    from bert_mgpu.model.tagging_objectives import CRFTagging

    _, strategy = gpu_strategy()
    config = tiny_config(500, hidden_size=64, intermediate_size=256)
    with strategy.scope():
        if head == "span":
            model, loss = modeling.build_span_model(config, "mixed_float16"), SpanExtraction().loss
        elif head == "multiple_choice":
            model, loss = modeling.build_choice_model(config, "mixed_float16"), MultipleChoice().loss
        else:
            model, loss = modeling.build_tagger(config, 5, "mixed_float16", crf=True), CRFTagging().loss
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=True)
    trainer = training.Trainer(strategy, model, opt, loss_fn=loss, bytes_per_pack=2**14)
    features, _ = memory.classifier_batch(8, 16)
    if head == "span":
        labels = np.stack([np.arange(8) % 16, (np.arange(8) * 3) % 16], 1).astype(np.int32)
    elif head == "multiple_choice":  # 8 questions of 4 choices, the last choice of odd ones padding
        features = {k: v.reshape(8, 4, 4) for k, v in memory.classifier_batch(32, 4)[0].items()}
        features["padding_mask"][1::2, 3] = False
        features["token_ids"][1::2, 3] = 0
        labels = (np.arange(8) % 3).astype(np.int32)
    else:
        labels = np.where(np.arange(16) % 3 == 1, np.arange(8 * 16).reshape(8, 16) % 5, -1).astype(np.int32)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(2))
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"} and {d for _, d, n in sent if n > 1} == {tf.float16, tf.float32}
    losses = [trainer.train_step(next(batches))[0] for _ in range(2)]
    assert all(np.isfinite(losses)) and trainer.applied_steps == 2, losses
    if head == "tagger_crf":
        assert model.crf.transitions.dtype == tf.float32 and np.abs(model.crf.transitions.numpy()).max() > 0
    for v in model.trainable_variables:
        a, b = strategy.experimental_local_results(v.value)
        assert np.array_equal(a.numpy(), b.numpy()), v.path


def test_the_gpu_step_on_several_towers_per_gpu_runs_on_ring_collectives():
    _, strategy = gpu_strategy(towers_per_gpu=2)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(500), 2, "mixed_float16")
        opt = optimization.create_optimizer(1e-3, 10, 0, float16=True)
    trainer = training.Trainer(strategy, model, opt)
    batch = memory.classifier_batch(8, 16)
    batch = (batch[0], np.arange(8, dtype=np.int32) % 2)
    loss, seen = trainer.train_step(next(trainer.training_batches(tf.data.Dataset.from_tensors(batch))))
    assert np.isfinite(loss) and list(seen) == [4, 4] and trainer.applied_steps == 1
    assert {c[0] for c in collectives(trainer.step_graph(trainer.input_spec))} == {"ring"}


def test_float16_gradients_cross_as_float16_but_layer_norms_embeddings_and_the_head_in_float32():
    with distribute.make_strategy(devices.plan_devices(0, 1, ())).scope():
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
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import optimization, training
keras.mixed_precision.set_global_policy("mixed_float16")
strategy = distribute.make_strategy(devices.plan_devices(0, 8, ()))
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




@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float32"])
def test_every_variable_a_run_makes_can_be_broadcast_between_workers(policy):
    """MultiWorkerMirroredStrategy broadcasts each new variable's initial value with CollectiveBcastSend,
    whose kernels take fewer dtypes than training uses (no bfloat16): the model, the optimizer, the step
    counters and evaluation's frozen weight copies (bfloat16 ones stored as float16 bits) must all be of
    a dtype it takes. The allowed list is read from TensorFlow's op definition."""
    from tensorflow.python.framework import op_def_registry

    from bert_mgpu.model import fused_encoder

    allowed = {tf.as_dtype(t) for a in op_def_registry.get("CollectiveBcastSendV2").attr if a.name == "T"
               for t in a.allowed_values.list.type}
    assert tf.bfloat16 not in allowed and tf.float16 in allowed
    _, strategy = gpu_strategy()
    made = []
    with tf.variable_creator_scope(lambda next_creator, **kw: made.append(next_creator(**kw)) or made[-1]):
        with strategy.scope():
            model = modeling.build_classifier(tiny_config(500), 2, policy)
            opt = optimization.create_optimizer(1e-3, 10, 0, float16=policy == "mixed_float16")
        trainer = training.Trainer(strategy, model, opt)
        with strategy.scope(), fused_encoder.frozen_weights(model):
            pass
    assert len(made) > len(model.weights)  # the optimizer's slots and the frozen copies were seen too
    assert not [v.name for v in made if v.dtype not in allowed], {v.name: v.dtype for v in made}
    batch = memory.classifier_batch(4, 16)
    evaluated = trainer.evaluate(tf.data.Dataset.from_tensors((batch[0], np.arange(4, dtype=np.int32) % 2)))
    assert np.isfinite(evaluated["loss"])  # the frozen copies read back right


def test_recompute_steps_on_the_gpu_path_with_xla_in_mixed_float16():
    """--recompute --use_xla on GPUs: each tower's XLA-compiled step recomputes the layers (dropout on),
    its float16 and float32 gradients cross on NCCL as without it, and two steps give the same weights
    (float16 rounding apart) with both towers equal."""
    from bert_mgpu.model.fused_encoder import set_recompute

    _, strategy = gpu_strategy()
    features, _ = memory.classifier_batch(8, 16)
    batch = (features, np.arange(8, dtype=np.int32) % 2)
    after, sent = {}, {}
    for recompute in (False, True):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = modeling.build_classifier(tiny_config(500, hidden_size=64, intermediate_size=256), 2,
                                              "mixed_float16")
            opt = optimization.create_optimizer(1e-3, 10, 0, float16=True)
        set_recompute(model, recompute)
        trainer = training.Trainer(strategy, model, opt, use_xla=True, bytes_per_pack=2**14)
        batches = trainer.training_batches(tf.data.Dataset.from_tensors(batch).repeat(2))
        sent[recompute] = collectives(trainer.step_graph(trainer.input_spec))
        losses = [trainer.train_step(next(batches))[0] for _ in range(2)]
        assert all(np.isfinite(losses)) and trainer.applied_steps == 2, losses
        for v in model.trainable_variables:
            a, b = strategy.experimental_local_results(v.value)
            assert np.array_equal(a.numpy(), b.numpy()), v.path
        after[recompute] = [v.numpy() for v in model.trainable_variables]
    assert sent[True] == sent[False] and {h for h, _, _ in sent[True]} == {"nccl"}
    for v, a, b in zip(model.trainable_variables, after[False], after[True]):
        assert np.abs(a - b).max() <= 1e-3 * max(1.0, np.abs(a).max()), v.path


def threads_grown(timeout, launches):
    """How many threads this process gained over `launches` all-reduces of the GPU run's strategy."""
    strategy = distribute.make_strategy(devices.plan_devices(2, 1, ("0", "1")), devices=CPU_TOWERS,
                                        timeout_seconds=timeout)
    reduce = tf.function(lambda: strategy.run(
        lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.ones([4]))))
    reduce()
    before = len(os.listdir("/proc/self/task"))
    for _ in range(launches):
        reduce()
    return len(os.listdir("/proc/self/task")) - before


def test_collectives_hold_no_thread_each_unless_a_timeout_is_asked_for():
    """TensorFlow starts a thread for each collective launched with a timeout, which sleeps out the timeout
    (`BaseCollectiveExecutor::CompleteParamsAsync` and `ExecuteAsync`, RING and NCCL alike): with a timeout
    by default, every multi-tower run gains threads each step until the machine's limit ends it (NOTES 67)."""
    proc = run_python("import run_classifier_mgpu\nfrom absl import flags\n"
                      "print(flags.FLAGS['collective_timeout_seconds'].default)")
    assert float(proc.stdout.split()[-1]) == 0  # towers_from_flags passes 0 as None: no timeout
    grown = {timeout: threads_grown(timeout, 40) for timeout in (None, 300)}
    assert grown[None] <= 8 and grown[300] >= 2 * 40, grown  # measured 1-2 and 160 (2 a tower a launch)


def test_an_empty_tower_evaluates_and_predicts_on_the_gpu_path_in_mixed_float16():
    """A last batch of one row on the GPU run's strategy (NCCL-hinted collectives, run as RING here) leaves
    tower 1 none: the token head's all-gather and the evaluation's sums go through with the filler row, and the
    logits are the model's own."""
    from bert_mgpu.model.tagging_objectives import TokenClassification

    _, strategy = gpu_strategy()
    with strategy.scope():
        model = modeling.build_tagger(tiny_config(500, hidden_size=64, intermediate_size=256), 5, "mixed_float16")
    trainer = training.Trainer(strategy, model, loss_fn=TokenClassification().loss)
    features, _ = memory.classifier_batch(3, 16)
    labels = (np.arange(3 * 16).reshape(3, 16) % 5).astype(np.int32)
    one = tf.data.Dataset.from_tensor_slices((features, labels, np.arange(3, dtype=np.int32))).take(1).batch(4)
    for _ in range(2):  # a failed all-gather aborted every later collective: the second pass would fail
        logits, got = trainer.predict_logits(one)
        assert logits.shape == (1, 16, 5)
        np.testing.assert_allclose(logits, model({k: v[:1] for k, v in features.items()}, training=False),
                                   atol=1e-2)
        np.testing.assert_array_equal(got, labels[:1])
    pairs = tf.data.Dataset.from_tensor_slices((features, labels))
    both = trainer.evaluate(pairs.take(2).batch(2))  # one row on each tower
    second = trainer.evaluate(pairs.skip(1).take(1).batch(4))  # that row alone: tower 1 empty
    first = trainer.evaluate(pairs.take(1).batch(4))
    assert both["loss"] == pytest.approx((first["loss"] + second["loss"]) / 2, rel=1e-3)
