"""Crash and resume as on a shared GPU box: SIGTERM saves and exits 143 (retryable); `kill -9` at a random moment loses
only the steps since the last checkpoint; a damaged newest checkpoint costs one more; with --deterministic
the resumed run ends bit-identical."""

import os
import random
import signal
import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, run_script, sentiment_rows, start_python, write_tsv
from test_pretraining_records import write_corpus

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def latest_step(out):
    latest = tf.train.latest_checkpoint(out)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def newest_on_disk(out):
    """The newest checkpoint with its index on disk, and the one before it. A kill between a save and its
    entry in `checkpoint` leaves a whole one that file does not name yet, and resuming rightly takes it."""
    kept = sorted(int(name.split("-")[1].split(".")[0]) for name in os.listdir(out) if name.endswith(".index"))
    return kept[-1], (kept[-2] if len(kept) > 1 else 0)


def interrupted(script, args, sig, out, after_step, delay=0.0):
    """Start the script, send `sig` once a checkpoint past `after_step` is published (plus `delay` s). Its
    stdout and stderr go to a directory beside `out`, in the test's own temporary directory."""
    logs = tempfile.mkdtemp(prefix="logs-", dir=os.path.dirname(os.path.abspath(out)))
    proc = start_python([os.path.join(ROOT, script), *args], f"{logs}/out", f"{logs}/err")
    deadline = time.time() + 300
    while latest_step(out) <= after_step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    proc.send_signal(sig)
    proc.wait(timeout=300)
    return proc.returncode, open(f"{logs}/out").read(), open(f"{logs}/err").read()


def tensors(out, step):
    reader = tf.train.load_checkpoint(os.path.join(out, f"ckpt-{step}"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "save_counter" not in name and not name.startswith("_CHECKPOINTABLE")
            and not name.startswith("elapsed_seconds")}  # wall-clock time trained: the one thing that differs


def assert_bit_identical(a, b, step):
    ta, tb = tensors(a, step), tensors(b, step)
    assert sorted(ta) == sorted(tb) and len(ta) > 20
    different = [name for name in ta if not np.array_equal(ta[name], tb[name])]
    assert not different, different[:5]


def classifier_run(tmp_path, release, train_rows):
    """A resumable classifier run's data (`train_rows` training sentences, 20 dev) and its flags, a
    checkpoint every 5 steps of 8, deterministic: `args(output_dir)`."""
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(train_rows, seed=1))
    write_tsv(data / "dev.tsv", sentiment_rows(20, seed=2))

    def args(out):
        return ["--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={release}",
                f"--output_dir={out}", "--do_train", "--do_eval", "--n_gpus=0", "--towers_per_gpu=2",
                "--train_batch_size=4", "--max_seq_length=8", "--precision=float32", "--num_train_epochs=1",
                "--save_checkpoints_steps=5", "--deterministic", "--learning_rate=1e-3"]
    return args


@pytest.mark.process
def test_classifier_sigterm_then_kill_9_resumes_bit_identical(tmp_path, google_release):
    args = classifier_run(tmp_path, google_release, 320)

    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run_script("run_classifier_mgpu.py", *args(whole))  # dropout 0.1: the generator state must resume too
    assert latest_step(whole) == 40

    code, stdout, stderr = interrupted("run_classifier_mgpu.py", args(parts), signal.SIGTERM, parts, 5)
    assert code == 143, stderr[-2000:]  # 128 + SIGTERM: a scheduler reads it as "start me again"
    stopped = int(stdout.split("interrupted by SIGTERM at step ")[1].split(";")[0])
    assert 5 < stopped < 40 and latest_step(parts) == stopped  # saved where it stopped
    assert not os.path.exists(os.path.join(parts, "eval_results.txt"))  # exit quickly: no evaluation

    code, _, stderr = interrupted("run_classifier_mgpu.py", args(parts), signal.SIGKILL, parts, stopped,
                                  delay=random.uniform(0.0, 0.3))
    killed_at, previous = newest_on_disk(parts)
    assert code == -signal.SIGKILL and f"at step {stopped}" in stderr and killed_at < 40, (code, killed_at)
    assert latest_step(parts) in (killed_at, previous), (latest_step(parts), killed_at, previous)

    # A disk that lost the end of the newest checkpoint: reported, the one before it used, still identical.
    with open(os.path.join(parts, f"ckpt-{killed_at}.data-00000-of-00001"), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    proc = run_script("run_classifier_mgpu.py", *args(parts))
    assert f"checkpoint {parts}/ckpt-{killed_at} is damaged" in proc.stderr, proc.stderr[-2000:]
    assert f"resuming from {parts}/ckpt-{previous} at step {previous}" in proc.stderr, proc.stderr[-2000:]
    assert_bit_identical(whole, parts, 40)
    results = [open(os.path.join(d, "eval_results.txt")).read() for d in (whole, parts)]
    assert results[0] == results[1]


@pytest.mark.process
def test_a_run_with_moving_averages_resumes_them_bit_identical(tmp_path, google_release):
    """--ema_decay: the averages travel in each checkpoint, so a run stopped by SIGTERM and rerun ends with the
    weights, moments and averages of the run never stopped, and evaluates the same."""
    args = classifier_run(tmp_path, google_release, 320)
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run_script("run_classifier_mgpu.py", *args(whole), "--ema_decay=0.9")
    code, stdout, stderr = interrupted("run_classifier_mgpu.py", [*args(parts), "--ema_decay=0.9"], signal.SIGTERM,
                                       parts, 5)
    stopped = int(stdout.split("interrupted by SIGTERM at step ")[1].split(";")[0])
    assert code == 143 and 5 < stopped < 40, stderr[-2000:]
    proc = run_script("run_classifier_mgpu.py", *args(parts), "--ema_decay=0.9")
    assert f"resuming from {parts}/ckpt-{stopped} at step {stopped}" in proc.stderr, proc.stderr[-2000:]
    assert_bit_identical(whole, parts, 40)
    results = [open(os.path.join(d, "eval_results.txt")).read() for d in (whole, parts)]
    assert results[0] == results[1]


@pytest.mark.process
def test_a_run_with_lora_adapters_resumes_them_bit_identical(tmp_path, google_release):
    """--lora_rank: the adapters travel in each checkpoint beside the frozen encoder, so a run stopped by SIGTERM
    and rerun ends with the run never stopped's weights, adapters (added in at its end) and evaluation."""
    args = classifier_run(tmp_path, google_release, 320)
    lora = ["--lora_rank=2", "--lora_targets=query,value,intermediate", "--learning_rate=1e-2"]
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run_script("run_classifier_mgpu.py", *args(whole), *lora)
    code, stdout, stderr = interrupted("run_classifier_mgpu.py", [*args(parts), *lora], signal.SIGTERM, parts, 5)
    stopped = int(stdout.split("interrupted by SIGTERM at step ")[1].split(";")[0])
    assert code == 143 and 5 < stopped < 40, stderr[-2000:]
    middle = tensors(parts, stopped)
    assert any("lora_b" in name and middle[name].any() for name in middle)  # not yet added in
    proc = run_script("run_classifier_mgpu.py", *args(parts), *lora)
    assert f"resuming from {parts}/ckpt-{stopped} at step {stopped}" in proc.stderr, proc.stderr[-2000:]
    assert_bit_identical(whole, parts, 40)
    results = [open(os.path.join(d, "eval_results.txt")).read() for d in (whole, parts)]
    assert results[0] == results[1]


@pytest.mark.process
def test_pretraining_kill_9_resumes_bit_identical(tmp_path):
    from conftest import tiny_config, write_vocab

    tokens = write_vocab(str(tmp_path / "vocab.txt"))
    tiny_config(len(tokens)).to_json_file(str(tmp_path / "bert_config.json"))
    write_corpus(str(tmp_path / "corpus.txt"))

    def args(out):
        return [f"--input_file={tmp_path}/corpus.txt", "--input_format=text", "--nsp=false",
                f"--bert_config_file={tmp_path}/bert_config.json", f"--vocab_file={tmp_path}/vocab.txt",
                f"--output_dir={out}", "--do_train", "--towers_per_gpu=2", "--train_batch_size=8",
                "--max_seq_length=32", "--max_predictions_per_seq=5", "--num_train_steps=40",
                "--save_checkpoints_steps=5", "--learning_rate=1e-3", "--precision=float32", "--deterministic"]

    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run_script("run_pretraining_mgpu.py", *args(whole))
    code, _, _ = interrupted("run_pretraining_mgpu.py", args(parts), signal.SIGKILL, parts, 5,
                             delay=random.uniform(0.0, 0.3))
    killed_at, previous = newest_on_disk(parts)
    assert code == -signal.SIGKILL and 5 < killed_at < 40 and latest_step(parts) in (killed_at, previous)
    proc = run_script("run_pretraining_mgpu.py", *args(parts))
    if f"checkpoint {parts}/ckpt-{killed_at} is damaged" in proc.stderr:  # killed while its index was written
        killed_at = previous
    assert f"resuming from {parts}/ckpt-{killed_at} at step {killed_at}" in proc.stderr, proc.stderr[-2000:]
    assert "pretraining stopped at step 40" in proc.stdout
    assert_bit_identical(whole, parts, 40)


@pytest.mark.parametrize("script", ["run_classifier_mgpu.py", "run_pretraining_mgpu.py"])
def test_a_run_with_other_flags_is_refused_and_nothing_is_lost(tmp_path, script, google_release):
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')
    (out / "bert_mgpu.json").write_text('{"settings": {"learning_rate": 0.1}}')
    (out / "eval_results.txt").write_text("earlier results")
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(40))
    write_corpus(str(data / "corpus.txt"))
    common = [f"--output_dir={out}", "--do_train", "--precision=float32", "--max_seq_length=32"]
    if script.startswith("run_classifier"):
        extra = ["--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={google_release}"]
    else:
        extra = [f"--input_file={data}/corpus.txt", "--input_format=text", "--nsp=false", "--num_train_steps=5",
                 f"--init_checkpoint={google_release}"]
    proc = run_script(script, *common, *extra, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert f"{out} holds a run with other settings (" in last and "--learning_rate=0.1 -> " in last, last
    assert "--overwrite_output_dir" in last
    assert (out / "eval_results.txt").read_text() == "earlier results"
    assert (out / "checkpoint").exists()


def killed_then_resumed(script, args, tmp_path, run):
    """`script` with `args(out)` run whole, then killed with -9 after its first checkpoint and rerun: the
    rerun resumes and ends bit-identical, with the same eval_results.txt. `run(*argv)` runs the script."""
    import random
    import signal

    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run(*args(whole))
    last = latest_step(whole)
    assert last > 12
    code, _, stderr = interrupted(script, args(parts), signal.SIGKILL, parts, 4, delay=random.uniform(0.0, 0.3))
    assert code == -signal.SIGKILL and 4 < latest_step(parts) < last, (code, latest_step(parts), stderr[-2000:])
    proc = run(*args(parts))
    assert f"resuming from {parts}/ckpt-" in proc.stderr
    assert_bit_identical(whole, parts, last)
    assert open(os.path.join(whole, "eval_results.txt")).read() == open(os.path.join(parts,
                                                                                    "eval_results.txt")).read()
