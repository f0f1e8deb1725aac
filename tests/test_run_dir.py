"""The run directory: damaged checkpoints are skipped, non-finite weights never saved, paths stay inside,
settings of an earlier run are compared, and an output_dir must be a writable directory."""

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu.core.errors import RunError, UserError
from bert_mgpu.io import output_dir, run_dir


def saved_steps(directory, values):
    v = tf.Variable(0.0, name="w")
    ckpts = run_dir.Checkpoints(tf.train.Checkpoint(v=v), str(directory), [v])
    for step, value in values:
        v.assign(value)
        ckpts.save(step)
    return v, ckpts


def test_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    v, _ = saved_steps(tmp_path, [(1, 1.0), (2, 2.0)])
    data = tmp_path / "ckpt-2.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:10])  # truncated, as by a full disk
    v.assign(-5.0)
    ckpts = run_dir.Checkpoints(tf.train.Checkpoint(v=v), str(tmp_path), [v])
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        assert ckpts.restore().endswith("ckpt-1")
    assert float(v.numpy()) == 1.0
    assert "ckpt-2 is damaged" in caplog.text and "resumed from" in caplog.text


def test_all_checkpoints_damaged_is_an_error_and_none_is_a_fresh_start(tmp_path):
    v, _ = saved_steps(tmp_path / "a", [(1, 1.0)])
    os.remove(tmp_path / "a" / "ckpt-1.index")
    with pytest.raises(RunError, match="no readable checkpoint"):
        run_dir.Checkpoints(tf.train.Checkpoint(v=v), str(tmp_path / "a"), [v]).restore()
    assert run_dir.Checkpoints(tf.train.Checkpoint(v=v), str(tmp_path / "b"), [v]).restore() is None


def test_non_finite_weights_are_never_saved(tmp_path):
    v, ckpts = saved_steps(tmp_path, [(1, 1.0)])
    for bad in (np.nan, np.inf):
        v.assign(bad)
        with pytest.raises(RunError, match=r"step 2: weights are not finite \(w.*\); not saved\. Last good "
                                           r"checkpoint: .*ckpt-1"):
            ckpts.save(2)
    assert not os.path.exists(tmp_path / "ckpt-2.index") and ckpts.latest.endswith("ckpt-1")


def test_checkpoint_file_cannot_point_outside_the_directory(tmp_path):
    outside = tmp_path / "elsewhere"
    saved_steps(outside, [(1, 1.0)])
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint").write_text(f'model_checkpoint_path: "{outside}/ckpt-1"\n'
                                    f'all_model_checkpoint_paths: "../elsewhere/ckpt-1"\n')
    v = tf.Variable(0.0)
    with pytest.raises(UserError, match=r"run/checkpoint: names .*elsewhere/ckpt-1, outside the run directory"):
        run_dir.Checkpoints(tf.train.Checkpoint(v=v), str(run), [v]).restore()
    assert float(v.numpy()) == 0.0


def test_other_settings_are_refused_unless_overwrite(tmp_path):
    saved_steps(tmp_path, [(1, 1.0)])
    (tmp_path / "eval_results.txt").write_text("kept")
    (tmp_path / run_dir.RUN_FILE).write_text(json.dumps({"settings": {"learning_rate": 5e-5, "seed": 1}}))
    run_dir.check_same_run(str(tmp_path), {"learning_rate": 5e-5, "seed": 1})  # same: resume
    with pytest.raises(UserError, match=r"other settings \(--learning_rate=5e-05 -> 0\.001\); .*"
                                        r"--overwrite_output_dir"):
        run_dir.check_same_run(str(tmp_path), {"learning_rate": 1e-3, "seed": 1})
    assert os.path.exists(tmp_path / "ckpt-1.index")
    run_dir.check_same_run(str(tmp_path), {"learning_rate": 1e-3, "seed": 1}, overwrite=True)
    assert not any(name.startswith("ckpt-") or name == "checkpoint" for name in os.listdir(tmp_path))
    assert (tmp_path / "eval_results.txt").read_text() == "kept"


def test_output_dir_must_be_a_writable_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"--output_dir=.*/f is a file, not a directory"):
        output_dir.check_output_dir(str(tmp_path / "f"))
    with pytest.raises(UserError, match=r"--output_dir=/sys/kernel is not writable"):
        output_dir.check_output_dir("/sys/kernel")  # read-only even for root
    assert output_dir.check_output_dir(str(tmp_path / "new" / "dir")) and (tmp_path / "new" / "dir").is_dir()


def test_run_restores_saves_with_run_files_and_refuses_other_settings(tmp_path):
    from bert_mgpu.io.run_dir import Run

    written = []

    def write_files(directory, step):  # what BertClassifier._write_run does: the settings beside the checkpoint
        written.append((directory, step))
        (tmp_path / run_dir.RUN_FILE).write_text(json.dumps({"settings": {"lr": 1}, "global_step": step}))

    step, w = tf.Variable(0, dtype=tf.int64), tf.Variable([1.0, 2.0])
    run = Run(str(tmp_path), {"lr": 1}, write_files=write_files)
    assert run.restore(tf.train.Checkpoint(step=step, w=w), [w]) is None  # a new run
    step.assign(3)
    w.assign([5.0, 6.0])
    run.save(3)
    with run.writer.as_default(step=3):
        tf.summary.scalar("loss", 0.5)
    run.close()
    assert written == [(str(tmp_path), 3)] and os.path.isdir(tmp_path / "train")
    again_step, again_w = tf.Variable(0, dtype=tf.int64), tf.Variable([0.0, 0.0])
    again = Run(str(tmp_path), {"lr": 1})
    assert again.restore(tf.train.Checkpoint(step=again_step, w=again_w), [again_w]).endswith("ckpt-3")
    assert int(again_step.numpy()) == 3 and again_w.numpy().tolist() == [5.0, 6.0]
    with pytest.raises(UserError, match=r"other settings \(--lr=1 -> 2\)"):
        Run(str(tmp_path), {"lr": 2})


HOLD_THE_DIRECTORY = """
import sys, time
from bert_mgpu.io import run_dir
run = run_dir.Run(sys.argv[1], {"seed": 1})
print("holding", flush=True)
time.sleep(600)
"""


def test_a_second_run_on_a_directory_in_use_is_refused_at_once_and_a_killed_holder_leaves_no_lock(tmp_path):
    """Two training runs on one --output_dir would interleave checkpoints and results: the second is
    refused in one line naming the holder. The lock is the kernel's: a kill -9 of the holder frees it."""
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_DIRECTORY, str(out)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": ROOT, "CUDA_VISIBLE_DEVICES": ""})
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(UserError, match=rf"--output_dir={out} is in use by another run \(pid {holder.pid}\)"):
            run_dir.Run(str(out), {"seed": 1})
        assert not [n for n in os.listdir(out) if n.startswith("ckpt")]
        assert not [n for n in os.listdir(out) if "lock" in n]  # the directory itself is locked
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    run = run_dir.Run(str(out), {"seed": 1})  # the holder's lock went with it
    again = run_dir.Run(str(out), {"seed": 1})  # the process that holds it may open the run again
    again.close()
    run.close()
    assert output_dir.lock_output_dir(str(out)) is True  # released by close
    output_dir.unlock_output_dir(str(out))


def test_a_checkpoint_file_naming_a_missing_checkpoint_is_repaired_and_the_newest_on_disk_resumed(tmp_path, caplog):
    saved_steps(tmp_path, [(4, 4.0), (8, 8.0)])
    state = tmp_path / "checkpoint"
    state.write_text(state.read_text().replace("ckpt-8", "ckpt-99"))  # a hand edit, or a copy without ckpt-99
    v = tf.Variable(0.0, name="w")
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        restored = run_dir.Run(str(tmp_path), {}).restore(tf.train.Checkpoint(v=v), [v])
    assert restored.endswith("ckpt-8") and float(v.numpy()) == 8.0
    assert f"{state} named ckpt-99, whose files are not there; it now names ckpt-4, ckpt-8" in caplog.text
    assert "damaged" not in caplog.text
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-8")


def test_overwrite_starts_over_where_no_checkpoint_is_readable(tmp_path, caplog):
    saved_steps(tmp_path, [(1, 1.0)])
    os.remove(tmp_path / "ckpt-1.index")  # its data file is left: damaged, not missing
    v = tf.Variable(0.0, name="w")
    with pytest.raises(RunError, match="move them away, or pass --overwrite_output_dir, to start over"):
        run_dir.Run(str(tmp_path), {}).restore(tf.train.Checkpoint(v=v), [v])
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        assert run_dir.Run(str(tmp_path), {}, overwrite=True).restore(tf.train.Checkpoint(v=v), [v]) is None
    assert "no checkpoint in" in caplog.text and not [n for n in os.listdir(tmp_path) if n.startswith("ckpt")]


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_run_keeps_save_total_limit_checkpoints(tmp_path, keep):
    v = tf.Variable(0.0, name="w")
    run = run_dir.Run(str(tmp_path), {}, keep=keep)
    run.restore(tf.train.Checkpoint(v=v), [v])
    for step in range(1, 6):
        run.save(step)
    run.close()
    kept = sorted(int(n[len("ckpt-"):-len(".index")]) for n in os.listdir(tmp_path) if n.endswith(".index"))
    assert kept == list(range(6 - keep, 6))
