"""Which machines take part in a job, and which of them this process is: from --worker_hosts and
--task_index, from TF_CONFIG, or from SLURM's environment. Pure: nothing here starts TensorFlow's runtime,
so the device plan can count every worker's towers before the strategy exists.

Example:
    cluster = find_cluster(worker_hosts="10.0.0.1:2222,10.0.0.2:2222", task_index=1)
    cluster.workers, cluster.index, cluster.is_chief     # 2, 1, False
"""

import dataclasses
import json
import os

from bert_mgpu.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A multi-worker job as TensorFlow's cluster resolvers see it.

    Args:
        spec: {"worker": ["host:port", ...]} (and "chief": [...] when the job names one), as in TF_CONFIG.
        task_type: this process's job, "worker" or "chief".
        task_id: its index in that job.
        source: where the cluster came from, for the log.
    """

    spec: dict
    task_type: str
    task_id: int
    source: str

    @property
    def hosts(self):
        """Every worker's address, the chief first: TensorFlow's order of workers (its `id_in_cluster`)."""
        return list(self.spec.get("chief", [])) + list(self.spec.get("worker", []))

    @property
    def workers(self):
        return len(self.hosts)

    @property
    def index(self):
        """This worker's place in `hosts`; 0 is the chief, which alone writes the run's files."""
        return self.task_id + (len(self.spec.get("chief", [])) if self.task_type == "worker" else 0)

    @property
    def is_chief(self):
        return self.index == 0

    def resolver(self):
        """The tf.distribute cluster resolver for MultiWorkerMirroredStrategy."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.spec), task_type=self.task_type, task_id=self.task_id, rpc_layer="grpc")

    def describe(self):
        role = "the chief, which writes the run's files" if self.is_chief else "not the chief: writes no run file"
        return (f"cluster ({self.source}): {self.workers} workers {', '.join(self.hosts)}; this is worker "
                f"{self.index} ({self.hosts[self.index]}), {role}")


def find_cluster(worker_hosts=None, task_index=None, multi_worker=False, environ=None, slurm_port=None):
    """The job's Cluster, or None for one machine.

    worker_hosts/task_index (google-bert's TPU scripts and tf-models name them so) win; else, with
    multi_worker, TF_CONFIG; else SLURM's variables inside an `srun` step of several tasks, the workers'
    ports from `slurm_port` up (`_from_slurm`).
    """
    env = os.environ if environ is None else environ
    if worker_hosts:
        hosts = [h.strip() for h in worker_hosts.split(",") if h.strip()]
        bad = [h for h in hosts if not _is_address(h)]
        if bad:
            raise UserError(f"--worker_hosts: {bad[0]!r} is not host:port")
        if len(set(hosts)) != len(hosts):
            raise UserError(f"--worker_hosts lists an address twice ({worker_hosts})")
        if task_index is None or not 0 <= task_index < len(hosts):
            raise UserError(f"--task_index={task_index}: give this worker's place in --worker_hosts, 0 to "
                            f"{len(hosts) - 1}")
        return Cluster({"worker": hosts}, "worker", int(task_index), "--worker_hosts")
    if not multi_worker:
        return None
    if env.get("TF_CONFIG"):
        return _from_tf_config(env["TF_CONFIG"])
    if int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")) or 1) > 1:
        return _from_slurm(env, slurm_port)
    raise UserError("--multi_worker needs the cluster: --worker_hosts=host:port,... with --task_index, or "
                    "TF_CONFIG, or an srun step of several SLURM tasks")


def _is_address(text):
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _from_tf_config(text):
    try:
        config = json.loads(text)
        spec, task = config["cluster"], config["task"]
        task_type, task_id = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"TF_CONFIG is not {{'cluster': {{...}}, 'task': {{'type': ..., 'index': ...}}}} "
                        f"({type(e).__name__}: {e})") from None
    spec = {k: list(v) for k, v in spec.items() if k in ("chief", "worker")}
    if task_type not in spec or not 0 <= task_id < len(spec[task_type]):
        raise UserError(f"TF_CONFIG: task {task_type}:{task_id} is not in its cluster {sorted(spec)}; "
                        "bert_mgpu runs chief and worker tasks")
    return Cluster(spec, task_type, task_id, "TF_CONFIG")


def _from_slurm(env, port=None):
    """The cluster of an srun step, in SLURM's own order of tasks.

    TensorFlow's SlurmClusterResolver sorts the step's hosts as strings (gpu10 before gpu9) while SLURM
    numbers tasks in the order of its node list (block distribution: node 0's tasks first), so on gpu9 and
    gpu10 task 0 would be told it is gpu10. Here the node list keeps SLURM's order, each node's tasks take
    ports from the base up, and the task's own node is checked against SLURMD_NODENAME. GPUs are SLURM's to
    give (--gpus-per-task sets CUDA_VISIBLE_DEVICES). The port base: `port` (--slurm_port), else the first
    of the step's reserved ports (srun --resv-ports: SLURM_STEP_RESV_PORTS), else 8888 as TensorFlow's.
    """
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
        expand_tasks_per_node,
    )

    try:
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        per_node = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env["SLURM_TASKS_PER_NODE"])
        rank = int(env["SLURM_PROCID"])
    except (ValueError, KeyError) as e:
        raise UserError(f"SLURM: cannot resolve the cluster ({type(e).__name__}: {e})") from None
    if len(per_node) != len(nodes):
        raise UserError(f"SLURM: {len(nodes)} nodes ({', '.join(nodes)}) but tasks per node for "
                        f"{len(per_node)}")
    base = port or _reserved_port(env.get("SLURM_STEP_RESV_PORTS", "")) or 8888
    hosts, node_of = [], []
    for node, count in zip(nodes, per_node):
        hosts += [f"{node}:{base + k}" for k in range(count)]
        node_of += [node] * count
    if not 0 <= rank < len(hosts):
        raise UserError(f"SLURM: task {rank} of a step of {len(hosts)} tasks")
    here = env.get("SLURMD_NODENAME")
    if here and here != node_of[rank]:
        raise UserError(f"SLURM: task {rank} runs on {here}, but in SLURM's block order it belongs on "
                        f"{node_of[rank]}: run srun with --distribution=block (the default), or name the "
                        "workers with --worker_hosts and --task_index")
    return Cluster({"worker": hosts}, "worker", rank, "SLURM")


def _reserved_port(ports):
    """The first port of SLURM_STEP_RESV_PORTS ("12000-12003" or "12000,12001"), or None."""
    first = ports.split(",")[0].split("-")[0].strip()
    return int(first) if first.isdigit() else None
