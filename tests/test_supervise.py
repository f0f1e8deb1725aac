"""Under a memory limit a script runs in a child process, so that a native crash at the limit (oneDNN's
kernels segfault or abort instead of raising) still ends in one line (issue 33, item 11), while signals and
exit codes behave as with one process."""

import os
import re
import resource
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import ROOT, sentiment_rows, write_tsv

from bert_mgpu.core import supervise

CRASH = """
import ctypes, sys
from absl import app
from bert_mgpu import cli
app.run(cli.main_wrapper(lambda: {body}))
"""


def limited(gib):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (int(gib * 2**30), resource.RLIM_INFINITY))


def start(argv, gib, **kwargs):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": ROOT}
    return subprocess.Popen([sys.executable, *argv], env=env, preexec_fn=limited(gib), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_the_memory_limit_is_read_from_ulimit():
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1, initializer=limited(32)) as pool:
        assert pool.apply(supervise.memory_limit) == (32 * 2**30, "ulimit -v")


def test_a_native_crash_under_a_limit_ends_in_one_line_and_other_endings_pass_through(tmp_path):
    for body, code in (("ctypes.string_at(0)", 1), ("ctypes.CDLL(None).abort()", 1), ("sys.exit(3)", 3)):
        proc = start(["-c", CRASH.format(body=body), "--"], gib=32)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err[-2000:]
        if code == 1:
            last = err.strip().splitlines()[-1]
            assert last.startswith("-c: error: the run died of SIG") and "memory limited to 32.0 GiB (ulimit -v): " \
                "out of memory inside TensorFlow's CPU kernels" in last, err[-2000:]
            assert "Fatal Python error" not in err and "Traceback" not in err


@pytest.mark.process
def test_a_run_out_of_memory_at_the_limit_ends_in_one_line(minilm_dir, tmp_path):
    """At 8 GiB of address space this step does not fit; oneDNN CPUs die of a signal, others raise: one line
    either way."""
    rows = [(label, " ".join([text] * 40)) for label, text in sentiment_rows(512, seed=1)]
    write_tsv(tmp_path / "train.tsv", rows)
    proc = start([os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={tmp_path}",
                  f"--init_checkpoint={minilm_dir}", f"--output_dir={tmp_path / 'out'}", "--do_train", "--n_gpus=0",
                  "--train_batch_size=256", "--max_seq_length=256", "--num_train_epochs=1"], gib=7.5)
    out, err = proc.communicate(timeout=600)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    raised = re.fullmatch(r"run_classifier_mgpu\.py: error: out of memory on (tower 0|a tower) at per-tower batch 256 "
                          r"x sequence length 256; try --train_batch_size=128 per tower .*", last)
    died = re.fullmatch(r"run_classifier_mgpu\.py: error: the run died of SIG[A-Z]+ with its memory limited to 7\.5 "
                        r"GiB \(ulimit -v\): .*; checkpoints written before are complete\. .*", last)
    assert raised or died, last  # the step's size (raised) or the limit (a native crash), in numbers
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith("ckpt-")]  # no step was taken


@pytest.mark.process
def test_a_signal_to_the_parent_stops_the_supervised_run_as_it_would_stop_one_process(google_release, tmp_path):
    """SIGTERM to the parent, once the child has logged its third step: the child saves where it stopped and
    exits 143 (128 + SIGTERM) as one process would, and the checkpoint it names holds that step."""
    write_tsv(tmp_path / "train.tsv", sentiment_rows(64, seed=1))
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    argv = [os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={tmp_path}",
            f"--init_checkpoint={google_release}", f"--output_dir={tmp_path / 'out'}", "--do_train", "--n_gpus=0",
            "--train_batch_size=8", "--max_seq_length=16", "--precision=float32", "--num_train_epochs=10000",
            "--log_every_steps=1"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": ROOT}
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, *argv], env=env, preexec_fn=limited(32), stdout=stdout,
                                stderr=stderr)
    deadline = time.monotonic() + 300
    while "] step 3: loss " not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, err.read_text()[-3000:]
    shown = out.read_text()
    assert "interrupted by SIGTERM at step " in shown, shown
    step = int(shown.split("interrupted by SIGTERM at step ")[1].split(";")[0])
    logged = [int(line.split("] step ")[1].split(":")[0]) for line in err.read_text().splitlines()
              if "] step " in line]
    assert step >= 3 and logged == list(range(1, step + 1)), (step, logged)  # stopped after the step it logged
    assert tf.train.latest_checkpoint(str(tmp_path / "out")).endswith(f"ckpt-{step}")
    reader = tf.train.load_checkpoint(str(tmp_path / "out" / f"ckpt-{step}"))
    counters = ("step", "optimizer/inner_optimizer/_iterations")  # the run's step and the optimizer's updates
    assert [int(reader.get_tensor(f"{k}/.ATTRIBUTES/VARIABLE_VALUE")) for k in counters] == [step, step]
