"""Under a memory limit a script runs in a child process, so that a native crash at the limit (oneDNN's
kernels segfault or abort instead of raising) still ends in one line (issue 33, item 11), while signals and
exit codes behave as with one process."""

import os
import resource
import signal
import subprocess
import sys
import time

import pytest
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


@pytest.mark.slow
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
    assert last.startswith("run_classifier_mgpu.py: error: ") and ("out of memory" in last), last


@pytest.mark.slow
def test_a_signal_to_the_parent_stops_the_supervised_run_as_it_would_stop_one_process(google_release, tmp_path):
    write_tsv(tmp_path / "train.tsv", sentiment_rows(64, seed=1))
    proc = start([os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={tmp_path}",
                  f"--init_checkpoint={google_release}", f"--output_dir={tmp_path / 'out'}", "--do_train",
                  "--n_gpus=0", "--train_batch_size=8", "--max_seq_length=16", "--precision=float32",
                  "--num_train_epochs=10000", "--log_every_steps=1"], gib=32)
    deadline = time.monotonic() + 300
    while not (tmp_path / "out" / "train").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # a few steps in
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted by SIGTERM at step " in out, out
    step = int(out.split("interrupted by SIGTERM at step ")[1].split(";")[0])
    assert os.path.exists(tmp_path / "out" / f"ckpt-{step}.index")
