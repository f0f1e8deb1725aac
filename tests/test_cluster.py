"""Finding the job's machines (--worker_hosts, TF_CONFIG, SLURM) and planning towers across them; pure,
no worker started (tests/test_multi_worker.py runs real ones)."""

import json

import pytest

from bert_mgpu.core.errors import UserError
from bert_mgpu.parallel import agree, distribute
from bert_mgpu.parallel.cluster import Cluster, find_cluster
from bert_mgpu.parallel.devices import plan_devices


def test_worker_hosts_and_task_index_name_the_job_and_this_workers_place():
    c = find_cluster("10.0.0.1:2222, 10.0.0.2:2222", 1)
    assert (c.workers, c.index, c.is_chief, c.hosts) == (2, 1, False, ["10.0.0.1:2222", "10.0.0.2:2222"])
    assert c.describe() == ("cluster (--worker_hosts): 2 workers 10.0.0.1:2222, 10.0.0.2:2222; this is worker 1 "
                            "(10.0.0.2:2222), not the chief: writes no run file")
    assert find_cluster("10.0.0.1:2222,10.0.0.2:2222", 0).is_chief
    assert find_cluster(None, None) is None and find_cluster(None, None, multi_worker=False) is None


@pytest.mark.parametrize("hosts, index, message", [
    ("10.0.0.1:2222,10.0.0.2", 0, "--worker_hosts: '10.0.0.2' is not host:port"),
    ("h1:2222,h1:2222", 0, "--worker_hosts lists an address twice (h1:2222,h1:2222)"),
    ("h1:2222,h2:2222", None, "--task_index=None: give this worker's place in --worker_hosts, 0 to 1"),
    ("h1:2222,h2:2222", 2, "--task_index=2: give this worker's place in --worker_hosts, 0 to 1"),
    ("h1:99999", 0, "--worker_hosts: 'h1:99999' is not host:port"),
])
def test_bad_worker_hosts_are_one_clear_error(hosts, index, message):
    with pytest.raises(UserError) as e:
        find_cluster(hosts, index)
    assert str(e.value) == message


def test_tf_config_with_a_chief_puts_the_chief_first():
    config = {"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]},
              "task": {"type": "worker", "index": 1}}
    c = find_cluster(multi_worker=True, environ={"TF_CONFIG": json.dumps(config)})
    assert (c.workers, c.index, c.is_chief, c.hosts, c.source) == (3, 2, False, ["c:1", "w0:1", "w1:1"], "TF_CONFIG")
    chief = {**config, "task": {"type": "chief", "index": 0}}
    assert find_cluster(multi_worker=True, environ={"TF_CONFIG": json.dumps(chief)}).is_chief


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG is not {'cluster': {...}, 'task': {'type': ..., 'index': ...}} (JSONDecodeError"),
    ('{"cluster": {"worker": ["a:1"]}}', "TF_CONFIG is not {'cluster': {...}, 'task'"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}',
     "TF_CONFIG: task worker:3 is not in its cluster ['worker']; bert_mgpu runs chief and worker tasks"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}',
     "TF_CONFIG: task ps:0 is not in its cluster ['worker']"),
])
def test_a_bad_tf_config_is_one_clear_error(text, message):
    with pytest.raises(UserError) as e:
        find_cluster(multi_worker=True, environ={"TF_CONFIG": text})
    assert str(e.value).startswith(message)


def test_multi_worker_without_a_cluster_says_how_to_give_one():
    with pytest.raises(UserError, match="--multi_worker needs the cluster: --worker_hosts=host:port,... with "):
        find_cluster(multi_worker=True, environ={})


def test_slurm_tasks_make_the_cluster(monkeypatch):
    """An srun step of 2 tasks on 2 nodes, as SLURM's variables describe it."""
    env = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "node[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.delenv("SLURM_STEP_RESV_PORTS", raising=False)
    c = find_cluster(multi_worker=True)
    assert (c.workers, c.index, c.source, c.hosts) == (2, 1, "SLURM", ["node1:8888", "node2:8888"])
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node[1-x]")
    with pytest.raises(UserError, match=r"^SLURM: cannot resolve the cluster \(ValueError: Invalid hostlist format"):
        find_cluster(multi_worker=True)


def slurm(procid, node, nodelist="gpu[9-10]", tasks="1(x2)", **more):
    return {"SLURM_PROCID": str(procid), "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURMD_NODENAME": node, **more}


def test_slurm_keeps_its_own_order_of_nodes_where_strings_sort_otherwise():
    """gpu9 before gpu10, as SLURM numbers the tasks (TensorFlow's resolver sorts them as strings and made task
    0, on gpu9, worker 0 at gpu10:8888): each task is the worker at its own address."""
    for rank, node in enumerate(["gpu9", "gpu10"]):
        c = find_cluster(multi_worker=True, environ=slurm(rank, node))
        assert c.hosts == ["gpu9:8888", "gpu10:8888"] and c.hosts[c.index] == f"{node}:8888"
        assert c.is_chief == (rank == 0)
    # Two tasks a node on three nodes: a node's tasks take consecutive ports, nodes in the list's order.
    env = slurm(3, "n9", nodelist="n[8-10]", tasks="2(x3)", SLURM_STEP_NUM_TASKS="6")
    c = find_cluster(multi_worker=True, environ=env)
    assert c.hosts == ["n8:8888", "n8:8889", "n9:8888", "n9:8889", "n10:8888", "n10:8889"]
    assert c.hosts[c.index] == "n9:8889"  # block distribution: tasks 2 and 3 on the second node
    with pytest.raises(UserError, match=r"^SLURM: task 3 runs on n10, but in SLURM's block order it belongs on n9"):
        find_cluster(multi_worker=True, environ={**env, "SLURMD_NODENAME": "n10"})


def test_the_slurm_port_comes_from_the_flag_else_the_steps_reserved_ports_else_8888():
    env = slurm(1, "gpu10", SLURM_STEP_RESV_PORTS="12000-12003")
    assert find_cluster(multi_worker=True, environ=env).hosts == ["gpu9:12000", "gpu10:12000"]
    assert find_cluster(multi_worker=True, environ=env, slurm_port=2222).hosts == ["gpu9:2222", "gpu10:2222"]
    assert find_cluster(multi_worker=True, environ=slurm(1, "gpu10")).hosts == ["gpu9:8888", "gpu10:8888"]


def test_the_plan_counts_every_workers_towers_in_the_global_batch():
    plan = plan_devices(-1, 1, ["0", "1", "2", "3", "4", "5", "6", "7"], workers=2)
    assert (plan.towers, plan.job_towers) == (8, 16)
    assert "global batch = 32 x 8 x 2 workers = 512" in plan.describe(32)
    assert "global batch = 8 x 2 x 2 workers = 32" in plan_devices(0, 2, [], workers=2).describe(8)
    assert "workers" not in plan_devices(0, 2, []).describe(8)


@pytest.mark.parametrize("n_gpus, towers_per_gpu, visible, kind", [
    (2, 1, ["0", "1"], "NCCL"),  # a GPU per tower: NCCL, within and across machines
    (1, 1, ["0"], "NCCL"),
    (2, 2, ["0", "1"], "RING"),  # two towers on one GPU: NCCL cannot serve them
    (0, 2, [], "RING"),
])
def test_workers_cross_by_nccl_when_every_tower_has_a_gpu(n_gpus, towers_per_gpu, visible, kind):
    assert distribute.communication(plan_devices(n_gpus, towers_per_gpu, visible, workers=2)) == kind


def test_on_one_machine_the_chief_decides_what_it_already_has():
    class OneMachine:  # any strategy multi_worker_strategy did not make
        pass

    decide = agree.ChiefDecides(OneMachine())
    assert (decide.index, decide.workers) == (0, 1)
    assert decide([12.5, 1.0], any_of=(1,)) == [12.5, 1.0]
    assert distribute.is_chief(OneMachine())


def test_auto_batch_size_on_cpu_workers_is_refused_before_any_trial():
    """On CPUs a trial is a real step of every tower, with collectives: workers whose trials differ
    would wait on each other forever, so several CPU workers are refused at once."""
    import types

    from bert_mgpu.train import memory

    # Worker 1 of 2 as a multi-worker strategy tells it: TensorFlow's public Strategy.cluster_resolver.
    job = Cluster({"worker": ["h1:2222", "h2:2222"]}, "worker", 1, "test")
    strategy = types.SimpleNamespace(cluster_resolver=job.resolver())
    assert distribute.worker_of(strategy) == (1, 2) and not distribute.is_chief(strategy)
    trainer = types.SimpleNamespace(strategy=strategy, learning_rate=0.0)
    with pytest.raises(UserError, match="^--auto_batch_size with several workers needs GPUs"):
        memory.find_batch_size(trainer, None, plan_devices(0, 2, [], workers=2), 1000)
    one_machine = types.SimpleNamespace(cluster_resolver=None)  # MirroredStrategy's
    assert agree.ChiefDecides(one_machine).every(7) == [7.0]  # one machine: its own value
