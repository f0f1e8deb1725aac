"""Device plan and tf.distribute strategy: the only module that knows about devices.

`plan_devices` is a pure function (visible devices + flags -> towers and global batch), so every device
decision is unit-tested without a GPU. `Towers` (or `configure_devices` and `make_strategy`) applies a plan:
one BERT tower per device (in-graph replication with `tf.distribute.MirroredStrategy`), variables mirrored
on every tower, never all parked on GPU0 as in bert-ad.

Example:
    plan = plan_devices(n_gpus=0, towers_per_gpu=2, per_tower_batch=16, visible_gpus=[])
    strategy = make_strategy(plan)          # 2 logical CPU towers, global batch 32
"""

import dataclasses
import itertools
import os
import shutil
import subprocess
import weakref

from bert_mgpu import _compat
from bert_mgpu.errors import UserError


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Which devices carry towers, how many towers each, and the resulting global batch."""

    device_type: str  # "GPU" or "CPU"
    physical_ids: tuple  # indices of the used physical devices among those TensorFlow sees
    visible_names: tuple  # their names as CUDA_VISIBLE_DEVICES gives them (for the log)
    towers_per_device: int
    per_tower_batch: int
    why: str = ""  # why these devices, for the log

    @property
    def towers(self):
        return max(1, len(self.physical_ids)) * self.towers_per_device

    @property
    def global_batch(self):
        return self.per_tower_batch * self.towers

    @property
    def devices(self):
        """Logical device names, one per tower, in tower order."""
        kind = self.device_type.lower()
        return tuple(f"/{kind}:{i}" for i in range(self.towers))

    @property
    def all_reduce(self):
        """'nccl' between distinct physical GPUs; 'hierarchical' for several towers on each of several GPUs
        (each GPU's towers summed on it, then NCCL between GPUs); 'one_device' where all towers share one."""
        if self.towers == 1:
            return "none"
        if self.device_type == "GPU" and self.towers_per_device == 1:
            return "nccl"
        if self.device_type == "GPU" and len(self.physical_ids) > 1:
            return "hierarchical"
        return "one_device"

    @property
    def tower_groups(self):
        """Tower indices per physical device (TensorFlow numbers a device's logical devices consecutively)."""
        k = self.towers_per_device
        return [list(range(i, i + k)) for i in range(0, self.towers, k)]

    def describe(self):
        lines = [
            f"device plan: {self.towers} tower(s) on {self.device_type}, "
            f"{self.towers_per_device} per device, all-reduce={self.all_reduce}, "
            f"global batch = {self.per_tower_batch} x {self.towers} = {self.global_batch}"
            + (f" ({self.why})" if self.why else "")
        ]
        for t, dev in enumerate(self.devices):
            if self.device_type == "GPU":
                phys = t // self.towers_per_device
                where = f"CUDA device {self.visible_names[phys]}"
            else:
                where = "host CPU"
            lines.append(f"  tower {t}: {dev} ({where})")
        return "\n".join(lines)


def visible_gpu_names(num_visible, cuda_visible_devices, smi_gpus=None):
    """Names of the GPUs TensorFlow sees, in its order (which is CUDA_VISIBLE_DEVICES order).

    smi_gpus: nvidia-smi's [(index, uuid, name, compute capability)], to name the GPUs TensorFlow skipped.
    """
    if cuda_visible_devices is None:
        listed = tuple(str(i) for i in range(len(smi_gpus))) if smi_gpus else ()
    else:
        listed = tuple(x.strip() for x in cuda_visible_devices.split(",") if x.strip())
    mig = [x for x in listed if x.startswith("MIG-")]
    if mig and len(listed) > 1:
        raise UserError(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices} lists {len(listed)} devices, of them "
                        f"{len(mig)} MIG instance(s); CUDA gives one process at most one MIG instance: list one")
    if len(listed) > num_visible:
        known = {key: (name, cap) for index, uuid, name, cap in (smi_gpus or ()) for key in (index, uuid)}
        named = ", ".join(f"{x} ({known[x][0]}, compute capability {known[x][1]})" if x in known else x
                          for x in listed)
        where = f"CUDA_VISIBLE_DEVICES={cuda_visible_devices}" if cuda_visible_devices is not None else "nvidia-smi"
        raise UserError(
            f"{where} lists {len(listed)} device(s) but TensorFlow sees only {num_visible} ({named}); it skips "
            "GPUs its build does not support (too old a compute capability) and devices CUDA cannot open: "
            "choose others with CUDA_VISIBLE_DEVICES (`nvidia-smi -L` shows the devices this machine has)"
        )
    return listed[:num_visible] if cuda_visible_devices is not None else tuple(str(i) for i in range(num_visible))


def plan_devices(n_gpus, towers_per_gpu, per_tower_batch, visible_gpus):
    """Pure: (flags, visible GPU names in order) -> DevicePlan, or UserError saying what is wrong.

    n_gpus=-1 means every visible GPU, the CPU when none is visible; n_gpus=0 means the CPU;
    towers_per_gpu=K then makes K logical CPU towers.
    """
    for name, value, low in (("n_gpus", n_gpus, -1), ("towers_per_gpu", towers_per_gpu, 1),
                             ("train_batch_size", per_tower_batch, 1)):
        if not isinstance(value, int) or value < low:
            raise UserError(f"--{name}={value} is invalid; it must be an integer >= {low}")
    visible_gpus = tuple(visible_gpus)
    if n_gpus > len(visible_gpus):
        seen = ",".join(visible_gpus) if visible_gpus else "none"
        raise UserError(
            f"--n_gpus={n_gpus} but only {len(visible_gpus)} GPU(s) are visible (CUDA devices: {seen}); "
            "use --n_gpus=0 for the CPU"
        )
    if n_gpus == -1:
        if not visible_gpus:
            return DevicePlan("CPU", (), ("cpu",), towers_per_gpu, per_tower_batch, "no GPU visible: the CPU")
        n_gpus, why = len(visible_gpus), "every visible GPU"
    else:
        why = "--n_gpus=0: the CPU, GPUs hidden from TensorFlow" if n_gpus == 0 else f"--n_gpus={n_gpus}"
    if n_gpus == 0:
        return DevicePlan("CPU", (), ("cpu",), towers_per_gpu, per_tower_batch, why)
    return DevicePlan("GPU", tuple(range(n_gpus)), visible_gpus[:n_gpus], towers_per_gpu, per_tower_batch, why)


def nvidia_smi_gpus():
    """[(index, uuid, name, compute capability)] from nvidia-smi, in its (PCI bus) order; [] without it."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [tuple(x.strip() for x in line.split(",")) for line in out.splitlines() if line.count(",") == 3]


def number_gpus_as_nvidia_smi(environ=None):
    """Before CUDA starts: number GPUs in PCI bus order, as nvidia-smi does (CUDA's default puts the fastest
    first), so CUDA_VISIBLE_DEVICES=1 and `nvidia-smi -i 1` are the same GPU. A user's own order stays."""
    env = os.environ if environ is None else environ
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def gpu_memory_mb(cuda_name, field="memory.total"):
    """One CUDA device's memory (`memory.total` or `memory.free`, MiB) from nvidia-smi, or None (also for a
    MIG instance, whose memory nvidia-smi's GPU query does not give, and when CUDA numbers GPUs otherwise)."""
    if not shutil.which("nvidia-smi") or cuda_name.startswith("MIG-"):
        return None
    if cuda_name.isdigit() and os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID":
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", cuda_name],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
        return int(out.split()[0])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def discover_visible_gpus():
    """GPU names as CUDA_VISIBLE_DEVICES gives them, for the GPUs TensorFlow can use."""
    number_gpus_as_nvidia_smi()
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    smi = nvidia_smi_gpus()
    return visible_gpu_names(len(gpus), os.environ.get("CUDA_VISIBLE_DEVICES"), smi)


def keep_cpu_memory_statistics(environ=None):
    """Before TensorFlow's first op: make its CPU allocator keep memory statistics (--auto_batch_size reads
    them). Where oneDNN is off, TensorFlow's default CPU allocator keeps none; its BFC allocator
    (TF_CPU_ALLOCATOR_USE_BFC) does, capped at the machine's memory instead of its default 64 GiB. Where
    oneDNN is on, its own allocator keeps them. A user's own setting is left alone."""
    from bert_mgpu import _compat

    env = os.environ if environ is None else environ
    if "TF_CPU_ALLOCATOR_USE_BFC" in env or _compat.onednn_enabled():
        return
    env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    physical_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    env.setdefault("TF_CPU_BFC_MEM_LIMIT_IN_MB", str(physical_mb))


def configure_devices(plan, memory_per_tower_mb=None):
    """Make TensorFlow expose exactly the plan's towers as logical devices (before any op runs).

    Several towers per device are logical devices split from one physical device, as bert-ad's
    "several sub-graphs on one card". In a process that already ran TensorFlow ops (a notebook), the
    existing logical devices are reused when there are enough of them.
    """
    import tensorflow as tf

    keep_cpu_memory_statistics()
    try:
        _apply_plan(tf, plan, memory_per_tower_mb)
    except RuntimeError:  # the runtime is already initialized: check what it has
        have = len(tf.config.list_logical_devices(plan.device_type))
        if have < plan.towers:
            raise UserError(
                f"TensorFlow already started with {have} logical {plan.device_type} device(s) but the "
                f"plan needs {plan.towers}; create bert_mgpu.Towers before any TensorFlow op "
                "(restart the notebook kernel)"
            ) from None


def _apply_plan(tf, plan, memory_per_tower_mb):
    physical = tf.config.list_physical_devices(plan.device_type)
    if plan.device_type == "CPU":
        tf.config.set_visible_devices([], "GPU")  # else TensorFlow maps every GPU and puts unscoped ops there
        current = tf.config.get_logical_device_configuration(physical[0]) or [None]
        if plan.towers > len(current):
            tf.config.set_logical_device_configuration(
                physical[0], [tf.config.LogicalDeviceConfiguration()] * plan.towers
            )
        return
    used = [physical[i] for i in plan.physical_ids]
    tf.config.set_visible_devices(used, "GPU")
    for dev, name in zip(used, plan.visible_names):
        if plan.towers_per_device == 1:
            tf.config.experimental.set_memory_growth(dev, True)
            continue
        per_tower = tower_memory_limit_mb(plan, name, memory_per_tower_mb)
        tf.config.set_logical_device_configuration(
            dev, [tf.config.LogicalDeviceConfiguration(memory_limit=per_tower)] * plan.towers_per_device
        )


def tower_memory_limit_mb(plan, cuda_name, memory_per_tower_mb=None):
    """The memory_limit of each logical device when towers share a GPU: the flag, or 92% of the GPU split."""
    if memory_per_tower_mb:
        return int(memory_per_tower_mb)
    total = gpu_memory_mb(cuda_name)
    if total is None:
        raise UserError(f"cannot read the memory of CUDA device {cuda_name}; pass --gpu_memory_per_tower_mb "
                        "to split it into towers")
    return int(total * 0.92 / plan.towers_per_device)


def make_strategy(plan):
    """MirroredStrategy over the plan's towers with the all-reduce that suits them."""
    import tensorflow as tf

    cross = {
        "nccl": lambda: tf.distribute.NcclAllReduce(),
        "one_device": lambda: tf.distribute.ReductionToOneDevice(reduce_to_device=plan.devices[0]),
        "hierarchical": lambda: tf.distribute.ReductionToOneDevice(reduce_to_device=plan.devices[0]),
        "none": lambda: None,
    }[plan.all_reduce]()
    strategy = tf.distribute.MirroredStrategy(devices=list(plan.devices), cross_device_ops=cross)
    if plan.all_reduce == "hierarchical":  # gradients; the few scalars of a step still go to tower 0
        reduce_in_groups(strategy, plan.tower_groups)
    return strategy


_GROUPS = weakref.WeakKeyDictionary()


def reduce_in_groups(strategy, groups, nccl=True):
    """Make `all_reduce` under `strategy` sum each group's towers on the group's first device, then sum those
    across groups with NCCL (nccl=False: on the first group's device, so it runs on CPUs for tests), and give
    every tower the result: for several towers on each GPU, instead of funnelling all through one GPU."""
    _GROUPS[strategy] = ([list(g) for g in groups], nccl)
    return strategy


def all_reduce(reduce_op, values, options=None, bytes_per_pack=None):
    """`ReplicaContext.all_reduce` of a list of tensors, from inside a tower, for values never differentiated.

    TensorFlow's own wraps the reduce in `tf.custom_gradient`, whose graph-mode gradient is registered in
    a process-wide registry that is never emptied; its closure keeps the whole traced training step alive
    (measured: ~19 MiB per new model in a notebook). A merge_call to the strategy's batch_reduce_to is the
    same reduction (what the custom-gradient wrapper runs inside) with nothing left behind.

    bytes_per_pack: the values go in packs of about this many bytes, last value first, one reduction per
    pack. TensorFlow's NCCL reduction on one machine ignores CommunicationOptions and concatenates all it
    is given into one buffer, which waits for the last gradient; a pack here depends only on its own
    values, so for gradients listed in layer order, the last layers' pack can cross while backprop
    still computes the first layers.
    """
    import tensorflow as tf

    flat = tf.nest.flatten(values)
    packs = gradient_packs([_nbytes(v) for v in flat], bytes_per_pack)

    def reduce(strategy, *flat):
        if strategy in _GROUPS:
            return _reduce_in_groups(strategy, reduce_op, flat, packs, *_GROUPS[strategy])
        # Per-tower values go back to their towers; a plain tensor (one tower) stays on its device.
        pairs = [(v, v.device if isinstance(v, tf.Tensor) else v) for v in flat]
        out = [None] * len(flat)
        for pack in packs:
            for i, r in zip(pack, strategy.extended.batch_reduce_to(reduce_op, [pairs[i] for i in pack], options)):
                out[i] = r
        return out

    reduced = tf.distribute.get_replica_context().merge_call(reduce, args=tuple(flat))
    return tf.nest.pack_sequence_as(values, list(reduced))


_PACK_IDS = itertools.count()


def _reduce_in_groups(strategy, reduce_op, flat, packs, groups, nccl):
    """`all_reduce`'s merge step for towers in groups (see `reduce_in_groups`): one buffer per pack, dtype
    and tower; summed within each group on its first device; NCCL between those; split back per tower."""
    import tensorflow as tf

    places = strategy.extended.worker_devices
    towers = sum(len(g) for g in groups)
    parts = [strategy.experimental_local_results(v) for v in flat]  # [value][tower]
    out = [[None] * towers for _ in flat]
    for pack in packs:
        for dtype in sorted({parts[i][0].dtype for i in pack}, key=lambda d: d.name):
            members = [i for i in pack if parts[i][0].dtype == dtype]
            sums = []
            for group in groups:
                with tf.device(places[group[0]]):
                    sums.append(tf.add_n([tf.concat([tf.reshape(parts[i][t], [-1]) for i in members], 0)
                                          for t in group]))
            if nccl:
                name, totals = f"bert_mgpu_pack_{next(_PACK_IDS)}", []
                for group, partial in zip(groups, sums):
                    with tf.device(places[group[0]]):
                        totals.append(tf.raw_ops.NcclAllReduce(input=partial, reduction="sum",
                                                               num_devices=len(groups), shared_name=name))
            else:
                with tf.device(places[groups[0][0]]):
                    totals = [tf.add_n(sums)] * len(groups)
            for group, total in zip(groups, totals):
                if reduce_op == tf.distribute.ReduceOp.MEAN:
                    total = total / tf.cast(towers, total.dtype)
                for t in group:
                    with tf.device(places[t]):
                        pieces = tf.split(tf.identity(total), [parts[i][t].shape.num_elements() for i in members])
                        for i, piece in zip(members, pieces):
                            out[i][t] = tf.reshape(piece, tf.shape(parts[i][t]))
    return [strategy.experimental_distribute_values_from_function(lambda ctx, o=o: o[ctx.replica_id_in_sync_group])
            for o in out]


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

    for layer in _compat.sublayers(model):
        for generator in _compat.seed_generators(layer):
            _compat.wrap_seed_generator(generator, tower_next)
    return model


def distribute_dataset(strategy, dataset):
    """Global batches of `dataset` split across the towers: an iterable of per-tower values.

    Used instead of `strategy.experimental_distribute_dataset`, whose iterator stalls when it is dropped.
    TensorFlow's MultiDeviceIterator builds one pipeline per tower with default tf.data options, so each
    runs tf.data's autotuning thread, and dropping the iterator waits for that thread's timed sleep, which
    cancellation does not cut short and which grows with the iterator's age (up to a minute measured at
    the end of a 2-tower `make demo`). Here one plain
    host iterator, autotuning off, reads the global batch, and one traced function cuts it into
    contiguous slices, one on each tower's device (sizes differ by at most one row in a partial batch;
    a tower may get none). Under MultiWorkerMirroredStrategy every worker reads the same batches and
    keeps its own towers' slices, as tf.distribute's data sharding does.

    Example:
        for batch in distribute_dataset(strategy, dataset):   # batch: PerReplica values
            strategy.run(step, args=(batch,))
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return TowerBatches(strategy, dataset.with_options(options))


class TowerBatches:
    """What `distribute_dataset` returns: iterable, with the `element_spec` to trace a step once."""

    def __init__(self, strategy, dataset):
        import tensorflow as tf

        self.strategy, self.dataset = strategy, dataset
        # Global ids of this worker's towers (0..n-1 on one machine), in the order of their devices.
        self._ids = tuple(strategy.experimental_local_results(
            strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)))
        total, self._places = strategy.num_replicas_in_sync, strategy.extended.worker_devices

        def tower_spec(spec):  # a static global batch divisible by the towers stays static per tower
            if not isinstance(spec, tf.TensorSpec) or not spec.shape.rank:
                raise TypeError(f"distribute_dataset splits batched dense tensors, not {spec}")
            rows = spec.shape[0]
            rows = rows // total if rows is not None and rows % total == 0 else None
            return _compat.per_replica_spec(*[tf.TensorSpec([rows] + spec.shape[1:], spec.dtype)] * len(self._ids))

        self.element_spec = tf.nest.map_structure(tower_spec, dataset.element_spec)  # refuses what it cannot cut
        self._split = _splitter(self._ids, total, dataset.element_spec)

    def __iter__(self):
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
                                                     for i in ids], input_signature=[spec])
    return _SPLITTERS[key]


def multi_worker_strategy():
    """Across machines: TensorFlow's MultiWorkerMirroredStrategy, cluster taken from TF_CONFIG."""
    import tensorflow as tf

    if "TF_CONFIG" not in os.environ:
        raise UserError("--multi_worker needs the TF_CONFIG environment variable (cluster and task)")
    comm = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)


class Towers:
    """A device plan applied: the strategy to build models under and the global batch.

    Create it before any TensorFlow op: it splits devices into logical towers and picks the CPU
    allocator, which TensorFlow fixes when it starts.

    Args:
        n_gpus: GPUs to use in CUDA_VISIBLE_DEVICES order; -1 every visible GPU (the CPU when none is
            visible); 0 the CPU.
        towers_per_gpu: towers per GPU, or logical CPU towers with n_gpus=0.
        train_batch_size: the per-tower training batch.
        gpu_memory_per_tower_mb: each tower's memory when a GPU carries several (default 92% split).
        multi_worker: MultiWorkerMirroredStrategy over the cluster in TF_CONFIG.

    Example:
        towers = Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)   # 2 CPU towers, batch 32
        towers = Towers(n_gpus=4, train_batch_size=32)                     # 4 GPUs, NCCL, batch 128
    """

    def __init__(self, n_gpus=-1, towers_per_gpu=1, train_batch_size=32, gpu_memory_per_tower_mb=None,
                 multi_worker=False):
        visible = discover_visible_gpus() if n_gpus else ()
        self._apply(plan_devices(n_gpus, towers_per_gpu, train_batch_size, visible), gpu_memory_per_tower_mb,
                    multi_worker)

    @classmethod
    def from_plan(cls, plan, gpu_memory_per_tower_mb=None, multi_worker=False):
        """Towers for a plan already made (`plan_devices`): the script's plan, computed once."""
        self = cls.__new__(cls)
        self._apply(plan, gpu_memory_per_tower_mb, multi_worker)
        return self

    def _apply(self, plan, gpu_memory_per_tower_mb, multi_worker):
        self.plan = plan
        configure_devices(plan, gpu_memory_per_tower_mb)
        self.strategy = multi_worker_strategy() if multi_worker else make_strategy(plan)

    @property
    def count(self):
        """Towers in the whole job (across workers under --multi_worker)."""
        return self.strategy.num_replicas_in_sync

    def batch(self, per_tower):
        return per_tower * self.count

    def set_batch(self, per_tower):
        """Another per-tower training batch (found by --auto_batch_size) on the same devices."""
        self.plan = dataclasses.replace(self.plan, per_tower_batch=int(per_tower))
