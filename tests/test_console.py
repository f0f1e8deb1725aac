"""What a user sees while training: bert_mgpu's lines in a plain Python script (no logging set up), and a
progress bar over the steps in a terminal, with TensorFlow's start-up lines held back in both."""

import os
import pty
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, run_python, sentiment_rows, write_tsv

FIT = """
import bert_mgpu
towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)
clf = bert_mgpu.BertClassifier.from_pretrained({release!r}, labels=["neg", "pos"], towers=towers, max_seq_length=16,
                                               precision="float32")
examples = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate({rows!r})]
clf.fit(examples, {out!r}, epochs=1, log_every=2)
"""


@pytest.mark.process
def test_fit_in_a_plain_script_logs_its_steps_without_tensorflows_start_up_lines(google_release, tmp_path):
    code = FIT.format(release=str(google_release), rows=sentiment_rows(32, seed=1), out=str(tmp_path / "out"))
    proc = run_python(code, env={"TF_CPP_MIN_LOG_LEVEL": None}, fresh=True)
    lines = proc.stderr.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 2", "step 4"], proc.stderr
    assert "loss " in steps[0] and "trained to step 4 (reached 4 steps)" in proc.stderr
    assert not [line for line in lines if "cpu_feature_guard" in line or "absl::InitializeLog" in line], proc.stderr
    # oneDNN's graph pass calls an integer Transpose unsupported "on platforms without AVX-512", AVX-512 or not
    # (input_pipeline.combine builds the inputs without one).
    assert not [line for line in lines if "oneDNN supports" in line], proc.stderr


@pytest.mark.process
def test_the_script_draws_a_progress_bar_over_the_steps_in_a_terminal(google_release, tmp_path):
    write_tsv(tmp_path / "train.tsv", sentiment_rows(64, seed=1))
    main, child = pty.openpty()
    argv = [sys.executable, os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={tmp_path}",
            f"--init_checkpoint={google_release}", f"--output_dir={tmp_path / 'out'}", "--do_train", "--n_gpus=0",
            "--train_batch_size=8", "--max_seq_length=16", "--precision=float32", "--num_train_epochs=1"]
    proc = subprocess.Popen(argv, stdout=child, stderr=subprocess.PIPE, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    os.close(child)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    proc.wait(timeout=300)
    os.close(main)
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
    text = shown.decode()
    assert "\r" in text and "8/8" in text and "loss:" in text, text  # redrawn in place, to the last step


def test_a_log_file_gets_no_progress_bar(google_release, tmp_path):
    """stdout to a file: the run's summary block is all it holds (no bar, no carriage return), and the steps
    are logged as lines on stderr, every --log_every_steps."""
    from conftest import run_script

    write_tsv(tmp_path / "train.tsv", sentiment_rows(64, seed=1))
    proc = run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={tmp_path}",
                      f"--init_checkpoint={google_release}", f"--output_dir={tmp_path / 'out'}", "--do_train",
                      "--n_gpus=0", "--train_batch_size=8", "--max_seq_length=16", "--precision=float32",
                      "--num_train_epochs=1", "--log_every_steps=4")
    shown = proc.stdout.splitlines()
    assert "\r" not in proc.stdout and shown[0] == "== run_classifier_mgpu.py ==", proc.stdout
    assert shown[4] == "  trained      8 steps (reached 8 steps)" and len(shown) == 9, proc.stdout
    steps = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if "] step " in line]
    assert [step.split(":")[0] for step in steps] == ["step 4", "step 8"], proc.stderr
    assert all(" loss 0." in step for step in steps), steps
    assert "Sharding callback duration" not in proc.stderr  # TensorFlow's line at every checkpoint save


def test_a_prediction_draws_its_bar_only_where_it_redraws_in_place(google_release, capsys):
    """1,000 texts predicted with stdout captured (a pipe, not a terminal): "auto" draws no bar, so no
    carriage return or colour code lands in a log; verbose=True still draws it."""
    import bert_mgpu

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1)
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, labels=["neg", "pos"], towers=towers,
                                                   max_seq_length=8, precision="float32")
    texts = [text for _, text in sentiment_rows(1000, seed=3)]
    quiet = clf.predict(texts, batch_size=64)
    assert capsys.readouterr().out == ""
    shown = clf.predict(texts, batch_size=64, verbose=True)
    out = capsys.readouterr().out
    assert "1000/1000" in out and "\x1b[" in out and np.array_equal(quiet, shown)


def test_the_summarys_rate_leaves_out_the_first_records_compiling():
    """Issue 66: the summary's examples/s was the last record's, the first steps' compile included in a short
    run. The rate over the records after the first (their steps, each at its record's rate), the first beside."""
    from bert_mgpu.cli import rate_fact

    history = [{"step": 100, "examples_per_second": 200.0, "loss": 1.0}, {"step": 100, "eval_loss": 0.5},
               {"step": 200, "examples_per_second": 800.0}, {"step": 250, "examples_per_second": 400.0}]
    # 150 steps in 100 / 800 + 50 / 400 = 0.25 step-seconds per example: 600 examples/s.
    assert rate_fact(history) == "600 (from step 100 on; 200 up to it, compiling included)"
    assert rate_fact(history[:2]) == "200 (up to step 100, compiling included)"
    assert rate_fact(history[1:2]) is None and rate_fact(history, "tokens_per_second") is None


CHILD_STARTS = """
import os, subprocess, sys
from bert_mgpu.core import quiet
quiet.start_tensorflow_quietly()
code = ("from bert_mgpu.core import quiet; quiet.start_tensorflow_quietly(); import tensorflow as tf; "
        "tf.config.list_physical_devices(); print('child started')")
child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
print(os.environ["TF_CPP_MIN_LOG_LEVEL"], child.stdout.strip())
sys.stderr.write(child.stderr)
"""


@pytest.mark.process
def test_a_child_of_a_quiet_process_starts_tensorflow_quietly_too():
    """Issue 66: a sweep's runs printed TensorFlow's start-up lines: each child took the TF_CPP_MIN_LOG_LEVEL its
    parent had set for the user's own and let them through. The parent now names the value it set."""
    from bert_mgpu.core import quiet

    proc = run_python(CHILD_STARTS, env={"TF_CPP_MIN_LOG_LEVEL": None, quiet.SET_BY_US: None}, fresh=True)
    assert proc.stdout.split() == ["2", "child", "started"], proc.stdout
    noise = [line for line in proc.stderr.splitlines() if any(n in line for n in quiet.START_NOISE)]
    assert noise == [], proc.stderr[-2000:]
    # The user's own level is still the user's: their child prints what TensorFlow prints at that level.
    proc = run_python(CHILD_STARTS, env={"TF_CPP_MIN_LOG_LEVEL": "0", quiet.SET_BY_US: None}, fresh=True)
    assert proc.stdout.split()[0] == "0" and "All log messages before absl::InitializeLog()" in proc.stderr, proc.stderr
