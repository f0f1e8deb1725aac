"""Several machines, on loopback: two worker processes x 2 CPU towers against one process with 4 towers.

Each worker is a real process running the script as a user would (--worker_hosts=127.0.0.1:port,...),
with TensorFlow's MultiWorkerMirroredStrategy between them; every run is bounded by a timeout and its
processes are killed when a test ends.
"""

import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    ROOT,
    WORDS,
    sentiment_rows,
    start_python,
    tiny_config,
    write_google_release,
    write_tsv,
    write_vocab,
)
from test_pretraining_records import write_corpus

TIMEOUT = 300

# A stand-in for the loop's clock, so a time budget ends after the same steps in every run: reading n
# gives start + rate * n seconds. argv: start rate script args...
CLOCK = """
import itertools, runpy, sys, types
start, rate = float(sys.argv[1]), float(sys.argv[2])
sys.argv = sys.argv[3:]
sys.path.insert(0, {root!r})
from bert_mgpu.train import loop
ticks = itertools.count()
loop.time = types.SimpleNamespace(monotonic=lambda: start + rate * next(ticks))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Job:
    """Processes started with `start`, their output in files; every one still running is killed on exit."""

    def __init__(self, tmp_path):
        self.tmp, self.procs = tmp_path, []

    def start(self, name, argv, env=None):
        scratch = self.tmp / f"{name}.tmp"  # the worker's TMPDIR: what it leaves behind is seen
        scratch.mkdir(exist_ok=True)
        proc = start_python(argv, self.tmp / f"{name}.out", self.tmp / f"{name}.err",
                            {"TMPDIR": str(scratch), **(env or {})})
        proc.name, proc.scratch = name, scratch
        self.procs.append(proc)
        return proc

    def wait(self, *procs):
        """-> [(exit code, stdout, stderr)]; a process still running after TIMEOUT fails the test."""
        deadline, results = time.monotonic() + TIMEOUT, []
        for proc in procs:
            try:
                proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"{proc.name} still running after {TIMEOUT} s")
            results.append((proc.returncode, (self.tmp / f"{proc.name}.out").read_text(),
                            (self.tmp / f"{proc.name}.err").read_text()))
        return results

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    j.kill()


def workers(job, name, script, args, clocks=None):
    """Start two workers of `script` on free loopback ports -> their processes (worker 0, the chief, first).
    clocks: (start, rate) per worker for the stand-in clock."""
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    procs = []
    for i in range(2):
        argv = [os.path.join(ROOT, script), *args, f"--worker_hosts={hosts}", f"--task_index={i}",
                "--towers_per_gpu=2"]
        if clocks:
            argv = [str(job.tmp / "clock.py"), *map(str, clocks[i]), *argv]
        procs.append(job.start(f"{name}{i}", argv))
    return procs


def one_process(job, name, script, args, clock=None):
    argv = [os.path.join(ROOT, script), *args, "--towers_per_gpu=4"]
    if clock:
        argv = [str(job.tmp / "clock.py"), *map(str, clock), *argv]
    return job.start(name, argv)


def assert_ok(*results):
    for rc, _, err in results:
        assert rc == 0, err[-3000:]


def assert_same_weights(a, b, atol=1e-6):
    """Every variable of two checkpoints (weights, optimizer, step, dropout seeds) but the wall-clock time
    and how many checkpoints were saved (a stopped run saves one more)."""
    ra, rb = tf.train.load_checkpoint(a), tf.train.load_checkpoint(b)
    names = sorted(ra.get_variable_to_shape_map())
    assert names == sorted(rb.get_variable_to_shape_map())
    compared = 0
    for name in names:
        x, y = ra.get_tensor(name), rb.get_tensor(name)
        if name.startswith(("elapsed_seconds", "save_counter")) or isinstance(x, bytes | str) or \
                np.asarray(x).dtype == object:
            continue
        np.testing.assert_allclose(np.asarray(y, np.float64), np.asarray(x, np.float64), atol=atol, err_msg=name)
        compared += 1
    assert compared > 20


def files(directory):
    return sorted(os.listdir(directory))


# ---------------------------------------------------------------------------------------------- classifier
def test_two_workers_fine_tune_evaluate_and_predict_as_one_process_with_all_their_towers(job, tmp_path):
    release, _ = write_google_release(str(tmp_path / "release"))
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(128, seed=1))
    write_tsv(data / "dev.tsv", sentiment_rows(30, seed=2))
    write_tsv(data / "test.tsv", [("", text) for _, text in sentiment_rows(13, seed=3)])  # not a batch multiple
    common = ["--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={release}", "--n_gpus=0",
              "--train_batch_size=4", "--eval_batch_size=4", "--predict_batch_size=4", "--max_seq_length=32",
              "--precision=float32", "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=2",
              "--learning_rate=2e-3", "--save_checkpoints_steps=5", "--log_every_steps=4"]
    single, multi = tmp_path / "single", tmp_path / "multi"
    ref = one_process(job, "single", "run_classifier_mgpu.py", [*common, f"--output_dir={single}"])
    assert_ok(*job.wait(ref))
    w0, w1 = workers(job, "worker", "run_classifier_mgpu.py", [*common, f"--output_dir={multi}"])
    (rc0, out0, err0), (rc1, out1, err1) = job.wait(w0, w1)
    assert_ok((rc0, out0, err0), (rc1, out1, err1))

    assert "cluster (--worker_hosts): 2 workers" in err0 and "this is worker 1" in err1
    assert "global batch = 4 x 2 x 2 workers = 16" in err0
    assert_same_weights(single / "ckpt-16", multi / "ckpt-16")  # 128 examples / 16 x 2 epochs
    assert files(multi) == files(single)  # the chief wrote what one process writes, nothing else
    assert (multi / "eval_results.txt").read_text() == (single / "eval_results.txt").read_text()
    # Prediction: every example once, in input order, written once (by the chief).
    np.testing.assert_allclose(np.loadtxt(multi / "test_results.tsv"), np.loadtxt(single / "test_results.tsv"),
                               atol=1e-6)
    assert (multi / "predict.txt").read_text() == (single / "predict.txt").read_text()
    assert "predict: 13 examples" in out0 and "predict:" not in out1 and "eval:" not in out1
    assert os.listdir(w1.scratch) == []  # its throwaway checkpoints are gone

    # A worker that cannot see the chief's --output_dir (its own local one) is caught before any step.
    lonely = tmp_path / "not_shared"
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    w = [job.start(f"apart{i}", [os.path.join(ROOT, "run_classifier_mgpu.py"), *common, "--towers_per_gpu=2",
                                 f"--output_dir={(multi, lonely)[i]}", f"--worker_hosts={hosts}", f"--task_index={i}"])
         for i in range(2)]
    for i, (rc, _, err) in enumerate(job.wait(*w)):
        assert rc == 1, err[-2000:]
        assert err.strip().splitlines()[-1] == (
            f"run_classifier_mgpu.py: error: the workers found different checkpoints in {(multi, lonely)[i]} "
            "(steps worker 0: 16, worker 1: 0); --output_dir must be storage every worker reads, a shared "
            "file system or gs://")

    # Workers whose plans differ (another --towers_per_gpu, as --n_gpus=-1 gives on a machine that shows 7 of
    # 8 GPUs, and another batch) end with one line naming each difference, before any collective could hang.
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    w = [job.start(f"unlike{i}", [os.path.join(ROOT, "run_classifier_mgpu.py"), *common, f"--output_dir={multi}",
                                  f"--towers_per_gpu={2 - i}", f"--worker_hosts={hosts}", f"--task_index={i}",
                                  *(["--train_batch_size=8"] if i else [])])
         for i in range(2)]
    for rc, _, err in job.wait(*w):
        assert rc == 1, err[-2000:]
        assert err.strip().splitlines()[-1] == (
            "run_classifier_mgpu.py: error: the workers' plans differ (per-tower batch: worker 0: 4, worker 1: 8; "
            "towers per device: worker 0: 2, worker 1: 1; towers per worker: worker 0: 2, worker 1: 1); every "
            "worker must run the same plan: the same count of GPUs and --towers_per_gpu, batch size, --precision "
            "and model")


@pytest.mark.process
def test_workers_with_another_precision_end_in_one_line_once_their_models_are_built(job, tmp_path):
    """What only the built model shows (its precision, its weights) is compared before the first step."""
    release, _ = write_google_release(str(tmp_path / "release"))
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(32, seed=1))
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    w = [job.start(f"w{i}", [os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={data}",
                             f"--init_checkpoint={release}", f"--output_dir={tmp_path / 'out'}", "--n_gpus=0",
                             "--towers_per_gpu=2", "--train_batch_size=4", "--max_seq_length=32", "--do_train",
                             f"--precision={('float32', 'mixed_bfloat16')[i]}", f"--worker_hosts={hosts}",
                             f"--task_index={i}"])
         for i in range(2)]
    for rc, _, err in job.wait(*w):
        assert rc == 1, err[-2000:]
        assert err.strip().splitlines()[-1] == (
            "run_classifier_mgpu.py: error: the workers' plans differ (precision: worker 0: float32, worker 1: "
            "float32+mixed_bfloat16); every worker must run the same plan: the same count of GPUs and "
            "--towers_per_gpu, batch size, --precision and model")
    assert not (tmp_path / "out" / "checkpoint").exists()  # no step ran


# Slow shared storage on the chief (NFS, gs://): renaming a best model into place takes 3 s. argv: script args...
SLOW_RENAME = """
import runpy, sys, time
sys.argv = sys.argv[1:]
sys.path.insert(0, {root!r})
from bert_mgpu.core import storage
from bert_mgpu.train import evaluation
rename = storage.replace_dir
def slow(source, target):
    if target.endswith("best"):
        time.sleep(3)
    return rename(source, target)
evaluation.storage = type(storage)("slow_storage")
evaluation.storage.__dict__.update({{**storage.__dict__, "replace_dir": slow}})
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.process
def test_every_worker_loads_the_best_model_the_chief_kept_on_slow_storage(job, tmp_path):
    """--load_best_model_at_end: each worker reads best/ only once the chief's (slow) rename has landed, and
    every worker holds the same model: their evaluations after loading it agree."""
    (tmp_path / "slow.py").write_text(SLOW_RENAME.format(root=ROOT))
    release, _ = write_google_release(str(tmp_path / "release"))
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(64, seed=1))
    write_tsv(data / "dev.tsv", sentiment_rows(16, seed=2))
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    w = [job.start(f"w{i}", [*([str(tmp_path / "slow.py")] if i == 0 else []),
                             os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={data}",
                             f"--init_checkpoint={release}", f"--output_dir={tmp_path / 'out'}", "--n_gpus=0",
                             "--towers_per_gpu=2", "--train_batch_size=4", "--eval_batch_size=4", "--max_seq_length=32",
                             "--precision=float32", "--do_train", "--do_eval", "--num_train_epochs=2",
                             "--learning_rate=2e-3", "--eval_every_steps=8", "--load_best_model_at_end",
                             f"--worker_hosts={hosts}", f"--task_index={i}"])
         for i in range(2)]
    (rc0, _, err0), (rc1, _, err1) = job.wait(*w)
    assert rc0 == 0 and rc1 == 0, (err0 + err1)[-3000:]
    def logged_at(err, text):  # the time of absl's log line holding `text`, seconds in the day
        (line,) = [line for line in err.splitlines() if text in line]
        hours, minutes, seconds = line.split()[1].split(":")
        return 3600 * int(hours) + 60 * int(minutes) + float(seconds)

    renamed = logged_at(err0, "new best eval_accuracy")  # the chief's, once best/ is in place
    for err in (err0, err1):  # 64 rows / 16 a step x 2 epochs = 8 steps, one evaluation, at step 8
        assert re.search(r"loaded the best model \(eval_accuracy [0-9.]+ at step 8\)", err), err[-2000:]
        assert logged_at(err, "loaded the best model") > renamed  # worker 1 read best/ after it was there
    results = dict(line.split(" = ") for line in (tmp_path / "out" / "eval_results.txt").read_text().splitlines())
    assert int(results["global_step"]) == 8


# ---------------------------------------------------------------------------------------------- pretraining
@pytest.fixture
def scratch(tmp_path):
    tokens = write_vocab(str(tmp_path / "vocab.txt"))
    tiny_config(len(tokens)).to_json_file(str(tmp_path / "bert_config.json"))
    write_corpus(str(tmp_path / "corpus.txt"))
    (tmp_path / "clock.py").write_text(CLOCK.format(root=ROOT))
    return ["--input_format=text", f"--input_file={tmp_path}/corpus.txt", "--nsp=false",
            f"--bert_config_file={tmp_path}/bert_config.json", f"--vocab_file={tmp_path}/vocab.txt",
            "--do_train=true", "--n_gpus=0", "--train_batch_size=16", "--max_seq_length=32",
            "--max_predictions_per_seq=5", "--learning_rate=1e-3", "--precision=float32", "--log_every_steps=5",
            "--save_checkpoints_steps=10"]


@pytest.mark.process
def test_a_time_budget_follows_the_chiefs_clock_whatever_the_others_read(job, tmp_path, scratch):
    """Worker 1's clock starts 10 minutes on and runs 7x fast: the chief's clock alone decides the
    learning rate, validation, the fine-tune markers and the stop, so the run equals one process's. The
    micro-batch is left to its default: the global batch 16 over all 4 towers."""
    budget = ["--lr_schedule=time", "--total_training_time=0.01", "--do_validation=true", "--validation_steps=6",
              f"--validation_input_file={tmp_path}/corpus.txt", "--finetune_time_markers=0.5,1.0"]
    single, multi = tmp_path / "single", tmp_path / "multi"
    ref = one_process(job, "single", "run_pretraining_mgpu.py", [*scratch, *budget, f"--output_dir={single}"],
                      clock=(0, 1))
    (rc, out, err), = job.wait(ref)
    assert_ok((rc, out, err))
    w = workers(job, "worker", "run_pretraining_mgpu.py", [*scratch, *budget, f"--output_dir={multi}"],
                clocks=[(0, 1), (600, 7)])
    (rc0, out0, err0), (rc1, out1, err1) = job.wait(*w)
    assert_ok((rc0, out0, err0), (rc1, out1, err1))

    # 2 clock readings a step, 1 s each: the 36 s budget ends after 18 steps, on every worker.
    for text in (out, out0, out1):
        assert "pretraining stopped at step 18: time budget of 0.01 h spent" in text
    assert "4 towers x 4 x 1 accumulation steps" in err0
    assert_same_weights(single / "ckpt-18", multi / "ckpt-18")
    assert files(multi) == files(single)
    assert files(multi / "finetune_checkpoints") == ["at_0.5", "at_1"]
    assert_same_weights(single / "finetune_checkpoints" / "at_1" / "ckpt-18",
                        multi / "finetune_checkpoints" / "at_1" / "ckpt-18")
    evals = lambda err: [line.split("step ")[1] for line in err.splitlines() if "eval_loss" in line]  # noqa: E731
    assert evals(err0) == evals(err1) == evals(err) and len(evals(err)) >= 3


@pytest.mark.process
def test_with_a_file_per_worker_each_reads_its_own(job, tmp_path, scratch):
    """Two corpus files for two workers: each reads, tokenizes and masks one (--input_sharding=auto). The
    second file holds every other word of the vocabulary only: the rows of worker 1's part of the input
    (what the run's dataset reads for it) hold none of the other words but the masking's random ones, and
    worker 0's hold them in about half their tokens."""
    from bert_mgpu.data.pretraining_input import PretrainingData
    from bert_mgpu.data.tokenization import FullTokenizer

    rng = np.random.default_rng(5)
    kept = sorted(set(WORDS[::2]) - set(WORDS[1::2]))
    with open(tmp_path / "more.txt", "w") as f:
        for _ in range(20):
            f.write("".join(" ".join(rng.choice(kept, rng.integers(4, 12))) + " .\n" for _ in range(24)) + "\n")
    args = [*scratch, f"--input_file={tmp_path}/corpus.txt,{tmp_path}/more.txt", "--num_train_steps=6"]
    results = job.wait(*workers(job, "files", "run_pretraining_mgpu.py", [*args, f"--output_dir={tmp_path}/out"]))
    assert_ok(*results)
    for (_, out, err), name in zip(results, ("corpus.txt", "more.txt")):  # every workers-th file from its index
        assert f"input sharded by file: this worker reads 1 of 2 files: {tmp_path / name}\n" in err, err[-2000:]
        assert "pretraining stopped at step 6: reached 6 steps" in out
    assert tf.train.latest_checkpoint(str(tmp_path / "out")).endswith("ckpt-6")
    tokenizer = FullTokenizer(str(tmp_path / "vocab.txt"))
    data = PretrainingData("text", [str(tmp_path / "corpus.txt"), str(tmp_path / "more.txt")], tokenizer,
                           max_seq_length=32, max_predictions_per_seq=5)
    assert data.by_files(2)
    others = set(tokenizer.convert_tokens_to_ids(sorted(set(WORDS) - set(kept))))
    share = []
    for index in (0, 1):
        features, _ = next(iter(data.dataset(64, True, 0, part=(index, 2))))
        ids = features["token_ids"].numpy()
        real = ids[ids >= 10]  # words: no [PAD], [UNK], [CLS], [SEP], [MASK] or punctuation (write_vocab)
        share.append(np.isin(real, list(others)).mean())
    assert share[0] > 0.3 and share[1] < 0.03, share


def wait_for_checkpoint(directory, after, proc):
    """Until `directory`'s newest checkpoint is past step `after` -> its step."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        latest = tf.train.latest_checkpoint(str(directory))
        if latest and int(latest.rsplit("-", 1)[1]) > after:
            return int(latest.rsplit("-", 1)[1])
        time.sleep(0.05)
    pytest.fail(f"no checkpoint after step {after} in {directory} ({proc.name} exit {proc.poll()})")


@pytest.mark.process
def test_sigterm_and_kill_of_one_worker_then_reruns_end_as_an_uninterrupted_run(job, tmp_path, scratch):
    args = [*scratch, "--num_train_steps=60", "--deterministic"]
    single, multi = tmp_path / "single", tmp_path / "multi"
    assert_ok(*job.wait(one_process(job, "single", "run_pretraining_mgpu.py", [*args, f"--output_dir={single}"])))

    # SIGTERM to worker 1 alone: TensorFlow's PreemptionCheckpointHandler has both save after the same
    # step, and both exit 143, the code a scheduler retries (TFJob's restartPolicy ExitCode: 128-255).
    w0, w1 = workers(job, "first", "run_pretraining_mgpu.py", [*args, f"--output_dir={multi}"])
    wait_for_checkpoint(multi, 0, w0)
    w1.send_signal(signal.SIGTERM)
    (rc0, out0, err0), (rc1, out1, err1) = job.wait(w0, w1)
    assert rc0 == rc1 == 143, (err0 + err1)[-3000:]
    handler = "every worker saves after this step and stops (TensorFlow's PreemptionCheckpointHandler)"
    assert f"a signal to another worker: {handler}" in err0 and f"SIGTERM: {handler}" in err1
    assert "deprecated" not in err0 + err1
    stopped = tf.train.latest_checkpoint(str(multi))
    step = int(stopped.rsplit("-", 1)[1])
    assert 10 <= step < 60
    assert f"stopped at step {step}: interrupted by a signal to another worker" in out0
    assert f"stopped at step {step}: interrupted by SIGTERM" in out1

    # kill -9 of worker 1 after the next checkpoint: the chief's collective fails, and it says what to do.
    w0, w1 = workers(job, "second", "run_pretraining_mgpu.py", [*args, f"--output_dir={multi}"])
    saved = wait_for_checkpoint(multi, step, w0)
    w1.kill()
    (rc0, _, err0), _ = job.wait(w0, w1)
    assert rc0 == 1
    last = err0.strip().splitlines()[-1]
    # TensorFlow's error names the lost worker in some of its forms, not in all.
    assert re.match(r"run_pretraining_mgpu.py: error: (worker 1|another worker) stopped or cannot be reached", last)
    assert last.endswith(f"rerun the same command on every worker: the job resumes from {multi}/ckpt-{saved}")

    w = workers(job, "third", "run_pretraining_mgpu.py", [*args, f"--output_dir={multi}"])
    results = job.wait(*w)
    assert_ok(*results)
    assert all("pretraining stopped at step 60: reached 60 steps" in out for _, out, _ in results)
    assert all(f"resuming from {multi}/ckpt-" in err for _, _, err in results)
    assert_same_weights(single / "ckpt-60", multi / "ckpt-60")


@pytest.mark.process
@pytest.mark.parametrize("gone", [1, 0], ids=["a_worker", "the_chief"])
def test_a_worker_whose_machine_vanishes_ends_the_others_through_the_heartbeat(job, tmp_path, scratch, gone):
    """SIGSTOP: a worker alive to the kernel, its sockets open, silent, as a machine that lost power or a
    peer hung in NCCL. No socket closes, so no collective fails by itself: TensorFlow's coordination
    service misses its heartbeats (10 s; the chief runs the service, the others heartbeat to it) and calls
    BaseCollectiveExecutor::StartAbort on the survivors, the call that on GPUs also aborts NCCL's
    communicators (NcclCommunicator::StartAbort -> ncclCommAbort). The survivor ends in one line, the
    checkpoint it names whole."""
    output = tmp_path / "out"
    w = workers(job, "run", "run_pretraining_mgpu.py", [*scratch, "--num_train_steps=400", f"--output_dir={output}"])
    wait_for_checkpoint(output, 0, w[0])
    os.kill(w[gone].pid, signal.SIGSTOP)
    stopped, survivor = time.monotonic(), w[1 - gone]
    try:
        while survivor.poll() is None and time.monotonic() - stopped < 90:
            time.sleep(0.2)
        waited = time.monotonic() - stopped
    finally:
        w[gone].kill()
    (rc, _, err), _ = job.wait(survivor, w[gone])
    assert rc == 1 and waited < 90, (waited, err[-3000:])  # the heartbeat's 10 s and leave_together's 10 s
    assert "BaseCollectiveExecutor::StartAbort" in err
    last = err.strip().splitlines()[-1]
    assert re.match(r"run_pretraining_mgpu.py: error: (worker \d|another worker) stopped or cannot be reached", last)
    named = last.rsplit("the job resumes from ", 1)[1]
    assert named == tf.train.latest_checkpoint(str(output))
    reader = tf.train.load_checkpoint(named)  # whole: every tensor reads
    assert all(reader.get_tensor(name) is not None for name in reader.get_variable_to_shape_map())


AGREE = """
import sys
sys.path.insert(0, {root!r})
from bert_mgpu.parallel import agree, cluster, devices, distribute
job = cluster.find_cluster(sys.argv[1], int(sys.argv[2]))
plan = devices.plan_devices(0, 2, (), workers=job.workers)
devices.configure_devices(plan)
decide = agree.ChiefDecides(distribute.multi_worker_strategy(plan, job))
print("chief's", decide([100.0 + job.index, float(job.index == 1)], any_of=(1,)))
print("every", decide.every(8 - 3 * job.index))
strategy = decide.strategy
agree.check_same_plan(strategy, {{"precision": "float32", "global batch": 16}})
try:
    agree.check_same_plan(strategy, {{"precision": ("float32", "mixed_float16")[job.index], "XLA": True}})
except agree.RunError as e:
    print("differ", e)
"""


def test_workers_take_the_chiefs_values_any_workers_flag_and_each_others_values(job, tmp_path):
    (tmp_path / "agree.py").write_text(AGREE.format(root=ROOT))
    hosts = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    procs = [job.start(f"agree{i}", [str(tmp_path / "agree.py"), hosts, str(i)]) for i in range(2)]
    for rc, out, err in job.wait(*procs):
        assert rc == 0, err[-2000:]
        # The chief's clock (100), a flag only worker 1 raised, and the auto batch sizes 8 and 5.
        assert out.splitlines() == [
            "chief's [100.0, 1.0]", "every [8.0, 5.0]",
            "differ the workers' plans differ (precision: worker 0: float32, worker 1: mixed_float16); every worker "
            "must run the same plan: the same count of GPUs and --towers_per_gpu, batch size, --precision and model"]
