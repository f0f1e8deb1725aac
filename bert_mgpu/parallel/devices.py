"""The device plan: which towers run on which devices, and TensorFlow's devices set up to match.

`plan_devices` is a pure function (visible devices + flags -> towers on devices), so every device
decision is unit-tested without a GPU. `Towers` applies a plan: `configure_devices` makes the logical
devices, and distribute.py makes the strategy over them (one BERT tower per device, in-graph replication,
variables mirrored on every tower, never all parked on GPU0 as in bert-ad).

Example:
    plan = plan_devices(n_gpus=0, towers_per_gpu=2, visible_gpus=[])
    towers = Towers.from_plan(plan)           # 2 logical CPU towers
"""

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Sequence

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.parallel import agree, distribute
from bert_mgpu.parallel.cluster import Cluster, find_cluster


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Which devices carry towers and how many towers each. The batch is a training setting, not the
    plan's: `Towers.batch(per_tower)` gives a global batch."""

    device_type: str  # "GPU" or "CPU"
    physical_ids: tuple  # indices of the used physical devices among those TensorFlow sees
    visible_names: tuple  # their names as CUDA_VISIBLE_DEVICES gives them (for the log)
    towers_per_device: int
    why: str = ""  # why these devices, for the log
    workers: int = 1  # machines in the job, each with these towers (TensorFlow assumes them alike)

    @property
    def towers(self):
        """Towers on this machine."""
        return max(1, len(self.physical_ids)) * self.towers_per_device

    @property
    def job_towers(self):
        """Towers in the whole job: this machine's times the workers."""
        return self.towers * self.workers

    @property
    def devices(self):
        """Logical device names, one per tower, in tower order."""
        kind = self.device_type.lower()
        return tuple(f"/{kind}:{i}" for i in range(self.towers))

    @property
    def collectives(self):
        """The collective implementation the towers' strategy launches with (distribute.make_strategy), as
        TensorFlow's MirroredStrategy itself chooses: 'nccl' on distinct GPUs (one GPU's tower included);
        'ring' where towers share a device (NCCL takes one rank per GPU) and on the CPU."""
        return "nccl" if self.device_type == "GPU" and self.towers_per_device == 1 else "ring"

    @property
    def all_reduce(self):
        """How gradients cross between this machine's towers: `collectives`, or 'none' for one tower."""
        return "none" if self.towers == 1 else self.collectives

    def describe(self, per_tower_batch=None, accumulation=1):
        """The plan for the log; with `per_tower_batch` (and `accumulation` steps), the global batch it makes."""
        batch = (f", global batch = {per_tower_batch} x {self.towers}"
                 + (f" x {self.workers} workers" if self.workers > 1 else "")
                 + (f" x {accumulation:g} accumulation steps" if accumulation != 1 else "")
                 + f" = {round(per_tower_batch * self.job_towers * accumulation)}") if per_tower_batch else ""
        lines = [
            f"device plan: {self.towers} tower(s) on {self.device_type}, "
            f"{self.towers_per_device} per device, all-reduce={self.all_reduce}{batch}"
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


def plan_devices(n_gpus: int, towers_per_gpu: int, visible_gpus: Sequence[str], workers: int = 1) -> DevicePlan:
    """Pure: (flags, visible GPU names in order) -> DevicePlan, or UserError saying what is wrong.

    n_gpus=-1 means every visible GPU, the CPU when none is visible; n_gpus=0 means the CPU;
    towers_per_gpu=K then makes K logical CPU towers. workers: machines in the job, each planned alike.
    """
    return dataclasses.replace(_plan_devices(n_gpus, towers_per_gpu, visible_gpus), workers=int(workers))


def _plan_devices(n_gpus, towers_per_gpu, visible_gpus):
    for name, value, low in (("n_gpus", n_gpus, -1), ("towers_per_gpu", towers_per_gpu, 1)):
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
            return DevicePlan("CPU", (), ("cpu",), towers_per_gpu, "no GPU visible: the CPU")
        n_gpus, why = len(visible_gpus), "every visible GPU"
    else:
        why = "--n_gpus=0: the CPU, GPUs hidden from TensorFlow" if n_gpus == 0 else f"--n_gpus={n_gpus}"
    if n_gpus == 0:
        return DevicePlan("CPU", (), ("cpu",), towers_per_gpu, why)
    return DevicePlan("GPU", tuple(range(n_gpus)), visible_gpus[:n_gpus], towers_per_gpu, why)


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
    first), so CUDA_VISIBLE_DEVICES=1 and `nvidia-smi -i 1` are the same GPU. A user's own order stays.
    Importing bert_mgpu does it; this is for an environment handed to another process."""
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
        return float(out.split()[0])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


@dataclasses.dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as `Towers` found it before TensorFlow took any (nvidia-smi, MiB)."""

    name: str  # as CUDA_VISIBLE_DEVICES names it
    free_mb: float
    total_mb: float
    cc_major: int

    @property
    def tensorflow_cap_mb(self):
        """What TensorFlow's allocator may take of the whole GPU: the memory free when it starts less the
        reserve gpu_device.cc's MinSystemMemory keeps (TF_DEVICE_MIN_SYS_MEMORY_IN_MB overrides it)."""
        if os.environ.get("TF_DEVICE_MIN_SYS_MEMORY_IN_MB"):
            reserve = float(os.environ["TF_DEVICE_MIN_SYS_MEMORY_IN_MB"])
        elif self.free_mb < 2048:
            reserve = 225
        else:
            c = self.cc_major
            reserve = 500 if c <= 6 else 1050 if c <= 7 else 1536 if c <= 8 else 1800
        return max(0.0, self.free_mb - reserve)


def gpu_memory(plan):
    """[GpuMemory] of the plan's GPUs, read now: call it before TensorFlow allocates on them (Towers does),
    so that the memory a run's model takes is not counted as gone. A GPU nvidia-smi cannot describe is left
    out (a MIG instance, CUDA numbering GPUs otherwise than nvidia-smi)."""
    found = []
    for name in plan.visible_names if plan.device_type == "GPU" else ():
        free, total, cap = (gpu_memory_mb(name, field) for field in ("memory.free", "memory.total", "compute_cap"))
        if None not in (free, total, cap):
            found.append(GpuMemory(name, free, total, int(cap)))
    return found


def discover_visible_gpus():
    """GPU names as CUDA_VISIBLE_DEVICES gives them, for the GPUs TensorFlow can use."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    smi = nvidia_smi_gpus()
    return visible_gpu_names(len(gpus), os.environ.get("CUDA_VISIBLE_DEVICES"), smi)


def keep_cpu_memory_statistics(environ=None):
    """Before TensorFlow's first op: make its CPU allocator keep memory statistics (--auto_batch_size reads
    them). Where oneDNN is off, TensorFlow's default CPU allocator keeps none; its BFC allocator
    (TF_CPU_ALLOCATOR_USE_BFC) does, capped at the machine's memory instead of its default 64 GiB. Where
    oneDNN is on, its own allocator keeps them. A user's own setting is left alone."""
    env = os.environ if environ is None else environ
    if "TF_CPU_ALLOCATOR_USE_BFC" in env or _compat.onednn_enabled():
        return
    env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    physical_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    env.setdefault("TF_CPU_BFC_MEM_LIMIT_IN_MB", str(physical_mb))


def configure_devices(plan, memory_per_tower_mb=None, gpus=None):
    """Make TensorFlow expose exactly the plan's towers as logical devices (before any op runs).

    Several towers per device are logical devices split from one physical device, as bert-ad's
    "several sub-graphs on one card". In a process that already ran TensorFlow ops (a notebook), the
    existing logical devices are reused when there are enough of them.
    """
    import tensorflow as tf

    keep_cpu_memory_statistics()
    try:
        _apply_plan(tf, plan, memory_per_tower_mb, gpus)
    except RuntimeError:  # the runtime is already initialized: check what it has
        have = len(tf.config.list_logical_devices(plan.device_type))
        if have < plan.towers:
            raise UserError(
                f"TensorFlow already started with {have} logical {plan.device_type} device(s) but the "
                f"plan needs {plan.towers}; create bert_mgpu.Towers before any TensorFlow op "
                "(restart the notebook kernel)"
            ) from None


def _apply_plan(tf, plan, memory_per_tower_mb, gpus=None):
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
    per_tower = tower_memory_limit_mb(plan, memory_per_tower_mb, gpus) if plan.towers_per_device > 1 else None
    for dev in used:
        if per_tower is None:
            tf.config.experimental.set_memory_growth(dev, True)
        else:
            tf.config.set_logical_device_configuration(
                dev, [tf.config.LogicalDeviceConfiguration(memory_limit=per_tower)] * plan.towers_per_device)


def smallest_gpu(plan, gpus=None):
    """The plan's GPU TensorFlow may take least of (`gpu_memory`), or UserError when one cannot be read:
    every tower must fit the batch the smallest one fits."""
    gpus = gpu_memory(plan) if gpus is None else gpus
    missing = sorted(set(plan.visible_names) - {g.name for g in gpus})
    if missing:
        raise UserError(f"cannot read the memory of CUDA device(s) {', '.join(missing)} with nvidia-smi; pass "
                        "--gpu_memory_per_tower_mb (towers sharing a GPU) or --memory_limit_mb (--auto_batch_size)")
    return min(gpus, key=lambda g: g.tensorflow_cap_mb)


def tower_memory_limit_mb(plan, memory_per_tower_mb=None, gpus=None):
    """The memory_limit of each logical device when towers share GPUs: the flag, or what TensorFlow would
    take of the GPU with the least free memory (`GpuMemory.tensorflow_cap_mb`), split among its towers.
    The same on every GPU: every tower runs the same batch."""
    if memory_per_tower_mb:
        return int(memory_per_tower_mb)
    return int(smallest_gpu(plan, gpus).tensorflow_cap_mb / plan.towers_per_device)


class Towers:
    """A device plan applied: the strategy to build models under, and the job's workers.

    Create it before any TensorFlow op: it splits devices into logical towers and picks the CPU
    allocator, which TensorFlow fixes when it starts.

    Args:
        n_gpus: GPUs to use in CUDA_VISIBLE_DEVICES order; -1 every visible GPU (the CPU when none is
            visible); 0 the CPU.
        towers_per_gpu: towers per GPU, or logical CPU towers with n_gpus=0.
        train_batch_size: the per-tower training batch a model built on these towers starts with
            (google-bert's and bert-ad's name). A model's `fit` and `auto_batch_size` change the model's
            batch, never the towers'.
        per_tower_batch: the same, named for what it is (wins when given).
        gpu_memory_per_tower_mb: each tower's memory when a GPU carries several (default: what TensorFlow's
            allocator may take of the GPU with the least free memory, split among its towers).
        multi_worker: several machines, the cluster from TF_CONFIG or SLURM (`cluster.find_cluster`).
        worker_hosts, task_index: several machines, named here ("h1:2222,h2:2222") and this one's place.
        collective_timeout_seconds: for debugging a hang: a collective (gradients, a step's scalars) that
            waits longer for a tower or worker raises DeadlineExceededError; None: no limit. TensorFlow
            holds a thread for each collective that long, so keep it off for long runs.

    Example:
        towers = Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)   # 2 CPU towers, batch 32
        towers = Towers(n_gpus=4, train_batch_size=32)                     # 4 GPUs, NCCL, batch 128
        towers = Towers(n_gpus=8, train_batch_size=32, worker_hosts="h1:2222,h2:2222", task_index=0)
    """

    def __init__(self, n_gpus: int = -1, towers_per_gpu: int = 1, train_batch_size: int = 32,
                 gpu_memory_per_tower_mb: int | None = None, multi_worker: bool = False,
                 worker_hosts: str | None = None, task_index: int | None = None, per_tower_batch: int | None = None,
                 collective_timeout_seconds: float | None = None):
        job = find_cluster(worker_hosts, task_index, multi_worker)
        visible = discover_visible_gpus() if n_gpus else ()
        per_tower = per_tower_batch if per_tower_batch is not None else train_batch_size
        plan = plan_devices(n_gpus, towers_per_gpu, visible, job.workers if job else 1)
        self._apply(plan, gpu_memory_per_tower_mb, job, collective_timeout_seconds, per_tower)

    @classmethod
    def from_plan(cls, plan: DevicePlan, gpu_memory_per_tower_mb: int | None = None,
                  cluster: Cluster | None = None, collective_timeout_seconds: float | None = None,
                  train_batch_size: int = 32) -> "Towers":
        """Towers for a plan already made (`plan_devices`) and its cluster: the script's, found once."""
        self = cls.__new__(cls)
        self._apply(plan, gpu_memory_per_tower_mb, cluster, collective_timeout_seconds, train_batch_size)
        return self

    def _apply(self, plan, gpu_memory_per_tower_mb, cluster, timeout, train_batch_size):
        if cluster is not None and cluster.workers != plan.workers:
            raise ValueError(f"the plan is for {plan.workers} worker(s), the cluster has {cluster.workers}")
        if not isinstance(train_batch_size, int) or train_batch_size < 1:
            raise UserError(f"--train_batch_size={train_batch_size} is invalid; it must be an integer >= 1")
        self.plan, self.cluster, self.train_batch_size = plan, cluster, train_batch_size
        self.gpus = gpu_memory(plan)  # before TensorFlow allocates on them
        configure_devices(plan, gpu_memory_per_tower_mb, self.gpus)
        self.strategy = (distribute.multi_worker_strategy(plan, cluster, timeout) if cluster
                         else distribute.make_strategy(plan, timeout_seconds=timeout))
        if cluster:  # before any collective: a worker with other towers would hang the first one
            agree.check_same_plan(self.strategy, {"towers per worker": plan.towers, "devices": plan.device_type,
                                                       "towers per device": plan.towers_per_device,
                                                       "per-tower batch": train_batch_size})

    @property
    def count(self):
        """Towers in the whole job (all workers')."""
        return self.strategy.num_replicas_in_sync

    @property
    def is_chief(self):
        """Whether this process writes the run's files (always, on one machine)."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def per_tower_batch(self):
        """`train_batch_size`, named for what it is."""
        return self.train_batch_size

    @property
    def global_batch(self):
        """A step's examples at `train_batch_size` (before gradient accumulation): per-tower x every tower."""
        return self.batch(self.train_batch_size)

    def batch(self, per_tower: int) -> int:
        """The global batch of `per_tower` examples on each tower."""
        return per_tower * self.count
