"""The scheduler examples run as their scheduler runs them, on two CPU workers over loopback:
examples/tfjob.yaml's container with the TF_CONFIG Kubeflow's training operator writes, and
examples/slurm.sbatch with stand-ins for srun and scontrol. A signal mid-run ends every worker with 143,
which both read as "start again"; the restarted job resumes and ends as a whole run."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import tensorflow as tf
import yaml
from conftest import ROOT, sentiment_rows, write_tsv
from test_multi_worker import Job, free_ports, wait_for_checkpoint

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

EXAMPLES = os.path.join(ROOT, "examples")
# Small enough for a CPU: 64 rows / (2 workers x 8) = 4 steps an epoch, 5 epochs.
SMALL = ["--n_gpus=0", "--precision=float32", "--max_seq_length=32", "--train_batch_size=8",
         "--eval_batch_size=8", "--num_train_epochs=5", "--learning_rate=1e-3", "--save_checkpoints_steps=2"]
STEPS = 20


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    j.kill()


@pytest.fixture
def shared(tmp_path, google_release):
    """The storage every machine mounts as /shared: the release and the data the examples name."""
    root = tmp_path / "shared"
    shutil.copytree(google_release, root / "uncased_L-12_H-768_A-12")
    (root / "data").mkdir()
    write_tsv(root / "data" / "train.tsv", sentiment_rows(64, seed=1))
    write_tsv(root / "data" / "dev.tsv", sentiment_rows(16, seed=2))
    return root


def operator_tf_config(tfjob, replica, index, namespace="default"):
    """TF_CONFIG as Kubeflow's training operator writes it for one pod: every replica's headless-service
    address, <job>-<type>-<i>.<namespace>.svc:<the tfjob-port port>, and this pod's type and index."""
    cluster = {}
    for kind, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        (port,) = [p["containerPort"] for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow"
                   for p in c["ports"] if p["name"] == "tfjob-port"]
        name = f"{tfjob['metadata']['name']}-{kind.lower()}"
        cluster[kind.lower()] = [f"{name}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": replica.lower(), "index": index}, "environment": "cloud"}


def retried_by_exit_code_policy(code):
    """Kubeflow's restartPolicy ExitCode (IsRetryableExitCode): a pod that failed with 128-255 starts again."""
    return code >= 128


@pytest.mark.process
def test_the_tfjob_manifest_runs_on_two_workers_and_an_evicted_pod_is_restarted_to_the_end(job, shared, tmp_path):
    with open(os.path.join(EXAMPLES, "tfjob.yaml")) as f:
        tfjob = yaml.safe_load(f)
    assert tfjob["apiVersion"] == "kubeflow.org/v1" and tfjob["kind"] == "TFJob"
    workers = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    assert workers["replicas"] == 2 and workers["restartPolicy"] == "ExitCode"
    (container,) = workers["template"]["spec"]["containers"]
    assert container["name"] == "tensorflow" and container["command"][0] == "python"
    assert "--multi_worker" in container["args"]
    config = operator_tf_config(tfjob, "Worker", 1)
    assert config["cluster"]["worker"] == ["bert-classifier-worker-0.default.svc:2222",
                                           "bert-classifier-worker-1.default.svc:2222"]

    # The pods' service names stand for loopback addresses here; /shared is the shared volume.
    loopback = dict(zip(config["cluster"]["worker"], (f"127.0.0.1:{p}" for p in free_ports(2))))
    args = [a.replace("/shared", str(shared)) for a in container["args"]] + SMALL
    script = os.path.join(ROOT, container["command"][1])
    output = shared / "runs" / "bert-classifier"

    def pods(name):
        started = []
        for i in range(2):
            env = operator_tf_config(tfjob, "Worker", i)
            env["cluster"]["worker"] = [loopback[a] for a in env["cluster"]["worker"]]
            started.append(job.start(f"{name}{i}", [script, *args], {"TF_CONFIG": json.dumps(env)}))
        return started

    # Worker 1's pod is evicted (SIGTERM, as the kubelet sends) after the first checkpoint.
    w0, w1 = pods("first")
    wait_for_checkpoint(output, 0, w0)
    w1.send_signal(signal.SIGTERM)
    (rc0, out0, err0), (rc1, out1, err1) = job.wait(w0, w1)
    assert rc0 == rc1 == 143 and retried_by_exit_code_policy(rc0), (err0 + err1)[-3000:]
    stopped = int(tf.train.latest_checkpoint(str(output)).rsplit("-", 1)[1])
    assert 2 <= stopped < STEPS
    assert f"interrupted by SIGTERM at step {stopped}" in out1
    assert f"interrupted by a signal to another worker at step {stopped}" in out0

    # The operator starts both pods again, with the same TF_CONFIG: they resume and finish.
    results = job.wait(*pods("again"))
    assert [rc for rc, _, _ in results] == [0, 0], "".join(err for _, _, err in results)[-3000:]
    assert all(f"resuming from {output}/ckpt-{stopped}" in err for _, _, err in results)
    evaluated = dict(line.split(" = ") for line in (output / "eval_results.txt").read_text().splitlines())
    assert int(evaluated["global_step"]) == STEPS


SRUN = """#!{python}
# srun's stand-in: every task of the step on this machine, with the variables srun gives each task.
import os, subprocess, sys
argv = sys.argv[1:]
while argv and argv[0].startswith("-"):  # srun's own options
    argv.pop(0)
n = int(os.environ["SLURM_NTASKS"])
step = dict(SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"], SLURM_STEP_NUM_TASKS=str(n),
            SLURM_STEP_TASKS_PER_NODE=str(n), SLURMD_NODENAME=os.environ["SLURM_JOB_NODELIST"])
tasks = [subprocess.Popen(argv, env={{**os.environ, **step, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i),
                                      "SLURM_NODEID": "0"}}) for i in range(n)]
with open(os.environ["TASK_PIDS"], "w") as f:
    f.write(" ".join(str(t.pid) for t in tasks))
codes = [t.wait() for t in tasks]
sys.exit(max(c if c >= 0 else 128 - c for c in codes))  # the highest, as srun's
"""


def consecutive_free_ports(n):
    """A base port with the n-1 ports after it free too (the workers of one node take base, base + 1...)."""
    for _ in range(100):
        base = free_ports(1)[0]
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    pytest.fail("no consecutive free ports")


@pytest.mark.process
def test_the_slurm_script_requeues_after_a_signal_and_the_requeued_job_ends_as_a_whole_run(shared, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN.format(python=sys.executable))
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this venv's
    for name in ("srun", "scontrol", "python"):
        (bin_dir / name).chmod(0o755)
    output = shared / "runs" / "bert-classifier"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": ROOT, "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
           "SLURM_TASKS_PER_NODE": "2", "PORT": str(consecutive_free_ports(2)),
           "RELEASE": str(shared / "uncased_L-12_H-768_A-12"), "DATA": str(shared / "data"), "OUTPUT": str(output),
           "TASK_PIDS": str(tmp_path / "tasks"), "SCONTROL_LOG": str(tmp_path / "scontrol.log")}

    def submit(name):
        with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
            proc = subprocess.Popen(["bash", os.path.join(EXAMPLES, "slurm.sbatch"), *SMALL], cwd=ROOT, env=env,
                                    stdout=out, stderr=err)
        proc.name = name
        return proc

    def finish(proc, name):
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{name}: still running after 300 s")
        return proc.returncode, (tmp_path / f"{name}.out").read_text(), (tmp_path / f"{name}.err").read_text()

    # SLURM's --signal=TERM@300 (or a preemption) signals every task of the step.
    batch = submit("first")
    try:
        wait_for_checkpoint(output, 0, batch)
        for pid in (tmp_path / "tasks").read_text().split():
            os.kill(int(pid), signal.SIGTERM)
        code, out, err = finish(batch, "first")
    finally:
        if batch.poll() is None:
            batch.kill()
    stopped = int(tf.train.latest_checkpoint(str(output)).rsplit("-", 1)[1])
    assert code == 143, err[-3000:]
    assert 2 <= stopped < STEPS
    assert f"bert_mgpu: exit 143 after a checkpoint in {output}; requeueing job 4242" in out
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"

    # The requeued job runs the same script: it resumes, ends, and asks for no requeue.
    code, out, err = finish(submit("again"), "again")
    assert code == 0, err[-3000:]
    assert f"resuming from {output}/ckpt-{stopped}" in err
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    evaluated = dict(line.split(" = ") for line in (output / "eval_results.txt").read_text().splitlines())
    assert int(evaluated["global_step"]) == STEPS


def test_a_run_stopped_by_a_signal_exits_with_the_code_both_schedulers_retry():
    from bert_mgpu.core.errors import Interrupted

    stops = ("SIGTERM", "SIGINT", "a signal to another worker", None)
    codes = {stop: Interrupted("stopped", stop).exit_code for stop in stops}
    assert codes == {"SIGTERM": 143, "SIGINT": 130, "a signal to another worker": 143, None: 143}
    assert all(retried_by_exit_code_policy(c) for c in codes.values())
    script = os.path.join(EXAMPLES, "slurm.sbatch")
    with open(script) as f:
        text = f.read()
    assert '"$code" -ge 128' in text and "#SBATCH --requeue" in text
    assert subprocess.run(["bash", "-n", script]).returncode == 0
