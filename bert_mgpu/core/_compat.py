"""The one place bert_mgpu reads TensorFlow, Keras and keras-hub internals that have no public name.

Each function says what it needs and why; tests/test_compat.py fails with a clear message when an
upgrade moves one of them.
"""

import itertools
from typing import NamedTuple


def onednn_enabled():
    """Whether TensorFlow runs oneDNN on this CPU (on by default only with AVX512-VNNI/BF16 or AMX, or when
    TF_ENABLE_ONEDNN_OPTS=1), answered without starting any device: its CPU allocator, and whether that
    keeps memory statistics, follows from it."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def sublayers(model):
    """Every layer inside a Keras model, outer layers first (Keras 3 names no public walk of nested layers)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


class TransformerParts(NamedTuple):
    """The sub-layers of one keras-hub TransformerEncoder, by what they are in google-bert's terms."""

    query: object  # EinsumDense [hidden] -> [heads, size]
    key: object
    value: object
    attention_output: object  # EinsumDense [heads, size] -> [hidden]
    attention_norm: object  # LayerNormalization after (post-LN) or before (pre-LN) attention
    intermediate: object  # Dense [hidden] -> [intermediate], with the activation
    output: object  # Dense [intermediate] -> [hidden]
    output_norm: object


def transformer_parts(layer):
    """keras-hub keeps a TransformerEncoder's sub-layers in private attributes and names no public way
    to them; the fused encoder reads their weights, and build_backbone sets the activation."""
    att = layer._self_attention_layer
    return TransformerParts(att._query_dense, att._key_dense, att._value_dense, att._output_dense,
                            layer._self_attention_layer_norm, layer._feedforward_intermediate_dense,
                            layer._feedforward_output_dense, layer._feedforward_layer_norm)


class MaskedLMParts(NamedTuple):
    """keras-hub's MaskedLMHead: google-bert's `cls/predictions/transform/{dense,LayerNorm}` and
    `cls/predictions/output_bias`."""

    dense: object
    norm: object
    bias: object


def masked_lm_parts(head):
    """The weights of a keras-hub MaskedLMHead (private attributes), for checkpoints and the tied head."""
    return MaskedLMParts(head._intermediate_dense, head._intermediate_layer_norm, head._bias)


def per_replica_spec(*specs):
    """tf.distribute's PerReplicaSpec (what its own distributed datasets report as `element_spec`), for a
    step traced once for every batch; TensorFlow exports no public name for it."""
    from tensorflow.python.distribute import values

    return values.PerReplicaSpec(*specs)


def seed_generators(model):
    """Every SeedGenerator of the layers inside `model` (Keras 3 tracks a layer's in `_seed_generators`, with
    no public list)."""
    return [g for layer in sublayers(model) for g in getattr(layer, "_seed_generators", ())]


def wrap_seed_generator(generator, wrapper):
    """Make `generator.next(ordered)` return `wrapper(keras_next, ordered)`, where `keras_next` is Keras'
    own `SeedGenerator.next` of it. Keras offers no hook for per-replica seeds; this replaces the bound
    method on the instance, idempotently (a second call wraps Keras' method again, not the wrapper)."""
    import functools

    keras_next = functools.partial(type(generator).next, generator)
    generator.next = functools.partial(wrapper, keras_next)


def optimizer_moments(optimizer, variable):
    """(first, second) moment slots of `variable` in a Keras Adam / AdamW / Lamb: Keras keeps them in
    private lists indexed by a private lookup. TowerOptimizer updates them in its own program."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def uses_weight_decay(optimizer, variable):
    """Whether Keras' decoupled weight decay applies to `variable` (`exclude_from_weight_decay`)."""
    return optimizer._use_weight_decay(variable)


def current_learning_rate(optimizer):
    """The learning rate of the coming step (a schedule evaluated at `iterations`), as Keras computes it."""
    return optimizer._get_current_learning_rate()


def multi_worker_local_devices(device_type, count):
    """A context in which MultiWorkerMirroredStrategy takes `count` devices of `device_type` on this
    worker as its towers. Left alone it takes every GPU TensorFlow sees, or one CPU device: neither the
    plan's logical towers (several per GPU, or several CPU towers, as the tests run) nor --n_gpus."""
    import contextlib

    from tensorflow.python.distribute import collective_all_reduce_strategy

    extended = collective_all_reduce_strategy.CollectiveAllReduceExtended

    def local_devices(self, cluster_resolver, worker_device):
        return tuple(f"{worker_device}/device:{device_type}:{i}" for i in range(count)), device_type

    @contextlib.contextmanager
    def patched():
        original = extended._initialize_local_devices
        extended._initialize_local_devices = local_devices
        try:
            yield
        finally:
            extended._initialize_local_devices = original

    return patched()


def host_cross_device_ops(strategy):
    """MultiWorkerMirroredStrategy's collectives between the workers' host CPUs (one value per worker),
    which TensorFlow keeps for "host tensors (e.g. early stopping)" under a private name. The public
    `reduce_to` picks them only when a worker has several towers; these never queue behind a GPU's
    steps, so a worker can agree with the others on the host while its GPUs still run."""
    return strategy.extended._host_cross_device_ops


def wait_for_workers(barrier_id, timeout_seconds):
    """Block until every worker of the job reaches `barrier_id` (TensorFlow's coordination service, which
    MultiWorkerMirroredStrategy starts): True; False without a job (one machine), or if the barrier
    failed (a worker gone, the timeout). Public TensorFlow has no barrier outside a collective."""
    from tensorflow.python.eager import context

    ctx = context.context()
    wait = ctx.wait_at_barrier
    if ctx.coordination_service is None:
        return False
    try:
        wait(barrier_id, int(timeout_seconds * 1000))
    except Exception:  # noqa: BLE001 - any failure means: go on without the others
        return False
    return True


def exchange_with_workers(key, value, workers, index, timeout_seconds):
    """Every worker's `value` (a string), in worker order, through the key-value store of TensorFlow's
    coordination service, which MultiWorkerMirroredStrategy starts: no collective, so it works whatever
    each worker's towers are. Each worker writes `key/<index>` and reads the others'; None without a job."""
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx.coordination_service is None:
        return None
    ctx.set_config_key_value(f"{key}/{index}", value)
    return [value if i == index else ctx.get_config_key_value(f"{key}/{i}", int(timeout_seconds * 1000))
            for i in range(workers)]


def preemption_handler(cluster_resolver, checkpoint_manager, termination_config):
    """TensorFlow's PreemptionCheckpointHandler, told its platform by this worker's devices. Left alone it
    asks GCE's metadata server over the network, and on a GCE machine without GPUs it then does nothing
    at all (its `save_checkpoint_if_preempted` returns at once)."""
    import tensorflow as tf
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util

    kind = util.PlatformDevice.INTERNAL_GPU if tf.config.list_logical_devices("GPU") else \
        util.PlatformDevice.INTERNAL_CPU
    original, util.detect_platform = util.detect_platform, lambda: kind
    try:
        return tf.distribute.experimental.PreemptionCheckpointHandler(cluster_resolver, checkpoint_manager,
                                                                      termination_config=termination_config)
    finally:
        util.detect_platform = original


def save_if_preempted(handler):
    """`handler.save_checkpoint_if_preempted()`, without the deprecation warning TensorFlow's own code in
    it prints (its save reads the deprecated `total_run_calls`)."""
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        handler.save_checkpoint_if_preempted()


def stop_preemption_watchers(handler):
    """End the handler's two watcher threads, as it does itself before a preemption's exit. Its `__del__`
    would too, but the running threads keep it alive: without this each run leaves them behind."""
    handler._stop_poll_termination_signal_thread()
    handler._stop_cluster_wise_termination_watcher_thread()


def mirrored_with_collectives(devices, implementation, timeout_seconds=None):
    """MirroredStrategy over `devices` reducing with TensorFlow's CollectiveAllReduce (its default on GPUs),
    with `implementation` ("NCCL" or "RING") and `timeout_seconds` on every collective it launches.

    TensorFlow builds that CollectiveAllReduce itself, with collective keys no other strategy in the process
    shares, and picks NCCL for physical GPUs, RING for logical ones or CPUs; its public constructor takes no
    options. Setting them on the strategy's own instance (and its per-device launchers) lets a run choose
    its timeout, and lets a test build a GPU run's exact objects on CPU devices (there NCCL-hinted
    collectives run as RING, through the same packing and concatenation).

    Every strategy made here gets collective keys of its own (`_collective_key_base`, as TensorFlow's own
    tests do): two strategies over the same devices would otherwise reuse group and instance keys, and
    the second's collectives fail on the first's cached shapes, which aborts every collective of the
    process (a notebook's second model, gpu_check, the tests). One tower too: its batches come as
    PerReplica values of one, whose `strategy.gather` is a one-member collective."""
    import tensorflow as tf
    from tensorflow.python.distribute import cross_device_ops

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation),
        timeout_seconds=timeout_seconds)
    cls = tf.distribute.MirroredStrategy
    base, cls._collective_key_base = cls._collective_key_base, next(_KEY_BASES)
    try:
        strategy = cls(devices=list(devices))
    finally:
        cls._collective_key_base = base
    extended = strategy.extended
    collective = extended._collective_ops
    if not isinstance(collective, cross_device_ops.CollectiveAllReduce) or extended._cross_device_ops is not collective:
        raise RuntimeError(f"MirroredStrategy over {devices} no longer reduces with CollectiveAllReduce by default "
                           f"({type(extended._cross_device_ops).__name__}); update bert_mgpu/core/_compat.py")
    collective._options = options
    for launcher in collective._launchers:
        launcher._options = options
    extended._communication_options = options
    return strategy


_KEY_BASES = itertools.count(10_000, 10_000)  # group keys per strategy: one per device set it reduces over


def collective_options(strategy):
    """The CommunicationOptions a strategy's CollectiveAllReduce launches with (None for other reductions)."""
    from tensorflow.python.distribute import cross_device_ops

    ops = getattr(strategy.extended, "_cross_device_ops", None)
    return ops._options if isinstance(ops, cross_device_ops.CollectiveAllReduce) else None


def add_layer_after_build(layer, name, sublayer):
    """Set `layer.<name> = sublayer` on a built Keras layer, tracked (its variables join the model's and its
    checkpoint's). Keras 3 locks a built layer's state; `Dense.enable_lora` unlocks it the same way."""
    locked = layer._tracker.locked
    layer._tracker.unlock()
    try:
        setattr(layer, name, sublayer)
    finally:
        if locked:
            layer._tracker.lock()
