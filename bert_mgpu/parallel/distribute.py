"""tf.distribute in one place: the strategy over a plan's towers, the gradient all-reduce, per-tower
random seeds, and global batches split onto the towers. The rest of bert_mgpu is strategy-agnostic: it
builds models under `strategy.scope()` and calls what is here.

Example:
    strategy = make_strategy(plan_devices(n_gpus=0, towers_per_gpu=2, visible_gpus=[]))
    for batch in distribute_dataset(strategy, dataset):     # per-tower values
        strategy.run(step, args=(batch,))
"""

from bert_mgpu.core import _compat
from bert_mgpu.parallel.cluster import Cluster


def make_strategy(plan, devices=None, timeout_seconds=None):
    """MirroredStrategy over the plan's towers (or `devices`: a GPU plan's objects on CPU devices, as the
    tests and gpu_check build them), reducing with TensorFlow's CollectiveAllReduce: NCCL between distinct
    GPUs, RING where towers share a device (`DevicePlan.collectives`). A collective whose peer failed is
    aborted, so an error on one tower (out of memory first of all) ends the step on every tower instead of
    hanging it; `timeout_seconds` bounds how long a collective waits for a tower that never comes.

    One tower reduces nothing, but still gathers its prediction batches through one-member collectives;
    it gets what TensorFlow picks for its device (NCCL on a GPU, RING on the CPU) and, as every strategy
    made here, collective keys of its own (`_compat.mirrored_with_collectives`).
    """
    devices = list(devices or plan.devices)
    return _compat.mirrored_with_collectives(devices, plan.collectives.upper(), timeout_seconds)


def all_reduce(reduce_op, values, options=None, bytes_per_pack=None):
    """`ReplicaContext.all_reduce` of a list of tensors, from inside a tower, for values never differentiated.

    TensorFlow's own wraps the reduce in `tf.custom_gradient`, whose graph-mode gradient is registered in
    a process-wide registry that is never emptied; its closure keeps the whole traced training step alive
    (measured: ~19 MiB per new model in a notebook). A merge_call to the strategy's batch_reduce_to is the
    same reduction (what the custom-gradient wrapper runs inside) with nothing left behind.

    bytes_per_pack: the values go in packs of about this many bytes, last value first, one reduction per
    pack, so the last layers' pack can cross while backprop still computes the first layers. Each pack
    is reduced one dtype at a time: NCCL and collectives concatenate what they are given into one buffer
    (TensorFlow's `batch_all_reduce`), which cannot mix float16 and float32.
    """
    import tensorflow as tf

    flat = tf.nest.flatten(values)
    packs = [part for pack in gradient_packs([_nbytes(v) for v in flat], bytes_per_pack)
             for part in by_dtype(pack, [v.dtype for v in flat])]

    def reduce(strategy, *flat):
        # Per-tower values go back to their towers; a plain tensor (one tower) stays on its device.
        pairs = [(v, v.device if isinstance(v, tf.Tensor) else v) for v in flat]
        out = [None] * len(flat)
        for pack in packs:
            for i, r in zip(pack, strategy.extended.batch_reduce_to(reduce_op, [pairs[i] for i in pack], options)):
                out[i] = r
        return out

    reduced = tf.distribute.get_replica_context().merge_call(reduce, args=tuple(flat))
    return tf.nest.pack_sequence_as(values, list(reduced))


def by_dtype(pack, dtypes):
    """A pack's indices split into runs of one dtype each, in the pack's order of first appearance."""
    kinds = list(dict.fromkeys(dtypes[i] for i in pack))
    return [[i for i in pack if dtypes[i] == kind] for kind in kinds]


def gradient_packs(sizes, bytes_per_pack=None):
    """Indices of values grouped into packs of about `bytes_per_pack` (a value larger than that is a pack
    of its own), from the last value to the first; one pack of all when bytes_per_pack is None."""
    order = list(range(len(sizes) - 1, -1, -1))
    if not bytes_per_pack:
        return [order] if order else []
    packs, current, filled = [], [], 0
    for i in order:
        if current and filled + sizes[i] > bytes_per_pack:
            packs.append(current)
            current, filled = [], 0
        current.append(i)
        filled += sizes[i]
    return packs + ([current] if current else [])


def _nbytes(value):
    shape = value.shape
    count = shape.num_elements() if shape.is_fully_defined() else None
    return float("inf") if count is None else count * value.dtype.size


def per_tower_seeds(model):
    """Make each tower draw its own random numbers (dropout masks) from `model`'s Keras seed generators.

    Keras keeps a SeedGenerator's state as one copy per replica (aggregation "none"), stepped in lockstep,
    so under MirroredStrategy every tower drew the same dropout masks: N towers of B examples trained with
    the dropout noise of one tower's B. Here each generator's seeds get the replica id added to their
    first word (the second is the counter Keras steps). Replica 0, and calls outside a strategy, draw
    Keras' own seeds, so one tower computes what it did before; the state variables, and with them the
    checkpoints, stay as they are. Safe to call more than once.
    """
    import tensorflow as tf

    def tower_next(keras_next, ordered=True):
        seed = keras_next(ordered)
        context = tf.distribute.get_replica_context()
        replica = 0 if context is None else context.replica_id_in_sync_group
        if isinstance(replica, int) and replica == 0:
            return seed
        return seed + tf.stack([tf.cast(replica, seed.dtype), tf.zeros([], seed.dtype)])

    for generator in _compat.seed_generators(model):
        _compat.wrap_seed_generator(generator, tower_next)
    return model


def distribute_dataset(strategy, dataset, worker_part=False, ahead=2):
    """Global batches of `dataset` split across the towers: an iterable of per-tower values.

    Used instead of `strategy.experimental_distribute_dataset`, whose iterator stalls when it is dropped.
    TensorFlow's MultiDeviceIterator builds one pipeline per tower with default tf.data options, so each
    runs tf.data's autotuning thread, and dropping the iterator waits for that thread's timed sleep, which
    cancellation does not cut short and which grows with the iterator's age (up to a minute measured at
    the end of a 2-tower `make demo`). Here one plain
    host iterator, autotuning off, reads the global batch, and one traced function cuts it into
    contiguous slices, one on each tower's device (sizes differ by at most one row in a partial batch;
    a tower may get none). Under MultiWorkerMirroredStrategy every worker reads the same batches and
    keeps its own towers' slices, as tf.distribute's data sharding does; with `worker_part`, `dataset`
    already holds only this worker's rows of each global batch (`worker_rows`), cut among its towers.

    A thread reads, cuts and places up to `ahead` batches while the caller's step runs: a step's call
    returns only when every tower has finished it (NCCL and collective kernels complete with the GPU), so
    work done between calls would leave the devices idle. `ahead=0` does it all in the caller's thread.

    Example:
        for batch in distribute_dataset(strategy, dataset):   # batch: PerReplica values
            strategy.run(step, args=(batch,))
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return TowerBatches(strategy, dataset.with_options(options), worker_part, ahead)


def worker_rows(dataset, global_batch, strategy):
    """This worker's rows of each global batch of an unbatched `dataset` whose batches start at element
    0 and are all full (training data), so that the costly work after it (parsing, masking) is done once
    in the job, not on every worker. Batch the result by `global_batch // workers` and give it to
    `distribute_dataset(..., worker_part=True)`: the towers get the rows they would have had."""
    index, workers = worker_of(strategy)
    if workers == 1:
        return dataset
    part = global_batch // workers
    return dataset.enumerate().filter(lambda i, _: (i % global_batch) // part == index).map(lambda _, x: x)


class TowerBatches:
    """What `distribute_dataset` returns: iterable, with the `element_spec` to trace a step once."""

    def __init__(self, strategy, dataset, worker_part=False, ahead=2):
        import tensorflow as tf

        self.strategy, self.dataset, self.ahead = strategy, dataset, ahead
        # Global ids of this worker's towers (0..n-1 on one machine), in the order of their devices.
        self._ids = tuple(strategy.experimental_local_results(
            strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)))
        total, self._places = strategy.num_replicas_in_sync, strategy.extended.worker_devices
        cut = tuple(range(len(self._ids))) if worker_part else self._ids  # which slices of a batch are ours
        if worker_part:
            total = len(self._ids)

        def tower_spec(spec):  # a static global batch divisible by the towers stays static per tower
            if not isinstance(spec, tf.TensorSpec) or not spec.shape.rank:
                raise TypeError(f"distribute_dataset splits batched dense tensors, not {spec}")
            rows = spec.shape[0]
            rows = rows // total if rows is not None and rows % total == 0 else None
            return _compat.per_replica_spec(*[tf.TensorSpec([rows] + spec.shape[1:], spec.dtype)] * len(self._ids))

        self.element_spec = tf.nest.map_structure(tower_spec, dataset.element_spec)  # refuses what it cannot cut
        self._split = _splitter(cut, total, dataset.element_spec)

    def __iter__(self):
        return Ahead(self._batches(), self.ahead) if self.ahead else self._batches()

    def _batches(self):
        import tensorflow as tf

        def place(part, device):  # a function's outputs come back on the host; move each to its tower
            if all(t.device == device for t in tf.nest.flatten(part)):  # already there (one CPU tower)
                return part
            with tf.device(device):
                return tf.nest.map_structure(tf.identity, part)

        for batch in self.dataset:
            parts = {i: place(p, d) for i, p, d in zip(self._ids, self._split(batch), self._places)}
            yield self.strategy.experimental_distribute_values_from_function(
                lambda ctx, parts=parts: parts[ctx.replica_id_in_sync_group])


class Ahead:
    """An iterator over `source` that a daemon thread keeps up to `depth` items ahead of; the source's
    errors (StopIteration included) come out of `next` in order. `close()` (or the end of the source, or
    the iterator being dropped) ends the thread."""

    _END = object()

    def __init__(self, source, depth=2):
        import queue
        import threading

        self._queue, self._stop = queue.Queue(maxsize=max(1, depth)), threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(iter(source),), daemon=True,
                                        name="bert_mgpu-batches-ahead")
        self._thread.start()

    def _put(self, item):
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, source):
        try:
            for item in source:
                if not self._put((item, None)):
                    return
            self._put((self._END, None))
        except BaseException as error:  # handed to the consumer, which raises it where it asked
            self._put((None, error))

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        item, error = self._queue.get()
        if error is not None or item is self._END:
            self._done = True
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self):
        """Stop the thread and drop what it prepared (no import here: `__del__` may run at interpreter exit)."""
        self._stop.set()
        while not self._queue.empty():
            self._queue.get_nowait()

    def __del__(self):
        self.close()


def first_tower_only(strategy, batch):
    """A distributed value giving all of `batch` to the first tower and no rows to the others."""
    import tensorflow as tf

    def part(ctx):
        return tf.nest.map_structure(lambda a: tf.constant(a if ctx.replica_id_in_sync_group == 0 else a[:0]),
                                     batch)

    return strategy.experimental_distribute_values_from_function(part)


_SPLITTERS = {}


def _splitter(ids, total, spec):
    """batch -> [slice for tower i in ids]: a traced function, one per towers and input signature.

    Kept across datasets, because a prediction pass makes a new one and tracing per dataset cost 6% of
    a pass. One tower takes the batch as it is.
    """
    import tensorflow as tf

    if total == 1:
        return lambda batch: [batch]
    key = (ids, total, repr(spec))
    if key not in _SPLITTERS:
        def rows(t, i):
            n = tf.shape(t)[0]
            size, extra = n // total, n % total
            start = i * size + tf.minimum(i, extra)
            return t[start:start + size + tf.cast(i < extra, tf.int32)]

        _SPLITTERS[key] = tf.function(lambda batch: [tf.nest.map_structure(lambda t: rows(t, i), batch)  # noqa: B023
                                                     for i in ids], input_signature=[spec], autograph=False)
    return _SPLITTERS[key]


def multi_worker_strategy(plan, cluster, timeout_seconds=None):
    """Across machines: TensorFlow's MultiWorkerMirroredStrategy over `cluster` (a cluster.Cluster), each
    worker's towers the plan's devices. Gradients cross by NCCL when every tower has a GPU of its own (AUTO
    would pick gRPC's ring even between the GPUs of one machine), by the ring otherwise (CPU towers,
    several towers per GPU)."""
    import tensorflow as tf

    kind = getattr(tf.distribute.experimental.CommunicationImplementation, communication(plan))
    comm = tf.distribute.experimental.CommunicationOptions(implementation=kind, timeout_seconds=timeout_seconds)
    with _compat.multi_worker_local_devices(plan.device_type, plan.towers):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster.resolver(),
                                                             communication_options=comm)
    if not _LEAVING:  # a script or a notebook: the process waits for the other workers before it ends
        import atexit

        atexit.register(leave_together)
        _LEAVING.append(True)
    return strategy


_LEAVING = []  # whether leave_together is registered to run at exit (once a process)


def preemption_handler(strategy, watch, save, stop):
    """TensorFlow's PreemptionCheckpointHandler for a multi-worker strategy: once `watch()` is true on any
    worker, every worker calls `save()` after the same step (agreed through TensorFlow's coordination
    service), then `stop()`. The handler's own CheckpointManager holds an empty checkpoint it never
    writes: the run saves through its own code (the chief alone writes, finite weights only)."""
    import uuid

    import tensorflow as tf

    config = tf.distribute.experimental.TerminationConfig(termination_watcher_fn=watch, exit_fn=stop,
                                                          grace_period=0, save_fn=save)
    unused = tf.train.CheckpointManager(tf.train.Checkpoint(), f"ram://bert_mgpu_preemption/{uuid.uuid4().hex}",
                                        max_to_keep=1)
    return _compat.preemption_handler(strategy.cluster_resolver, unused, config)


def communication(plan):
    """How gradients cross between workers' towers: "NCCL" when every tower has a GPU of its own, "RING"
    (gRPC) otherwise; TensorFlow's NCCL collectives cannot serve several towers on one GPU or CPUs."""
    return "NCCL" if plan.device_type == "GPU" and plan.towers_per_device == 1 else "RING"


def worker_of(strategy):
    """(this worker's index, workers in the job), read off the strategy's own cluster resolver (TensorFlow's
    public `Strategy.cluster_resolver`, None on one machine): (0, 1) on one machine. Worker 0 is the chief."""
    resolver = getattr(strategy, "cluster_resolver", None)
    jobs = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not jobs:
        return 0, 1
    job = Cluster(jobs, resolver.task_type, int(resolver.task_id), "the strategy")
    return job.index, job.workers


def is_chief(strategy):
    """Whether this process writes the run's files: always on one machine; the chief of several."""
    return worker_of(strategy)[0] == 0


def leave_together(timeout_seconds=10):
    """Before a worker's process ends (finished or failed), wait up to `timeout_seconds` for the others to
    end too (`multi_worker_strategy` registers it at exit). A collective returns on a worker once it has
    what it receives; its peer may still be reading from it, and a process that exits at once makes that
    peer's collective fail ("Socket closed"): the last step or the same-start check turned into a crash.
    Does nothing on one machine."""
    return _compat.wait_for_workers("bert_mgpu_leave", timeout_seconds)
