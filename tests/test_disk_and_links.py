"""Where a run writes (issue 33, items 2, 3 and 10): a full disk ends the run in one line with nothing lost and
the rerun resumes; a read-only --export_dir is refused before training; a symbolic link inside the output
directory is refused before anything is written through it. The disks are real small tmpfs mounts."""

import contextlib
import os
import subprocess

import pytest
from conftest import run_script

from bert_mgpu.core import errors


@pytest.fixture(scope="module")
def data(sentiment_data):
    return sentiment_data


@contextlib.contextmanager
def small_disk(path, size, read_only=False):
    """A tmpfs of `size` mounted at `path` (this needs root, as CI and the development machines run)."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def classify(data, release, out, *extra, check=True):
    return run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={data}",
                      f"--init_checkpoint={release}", f"--output_dir={out}", "--do_train", "--n_gpus=0",
                      "--train_batch_size=8", "--max_seq_length=16", "--precision=float32", "--num_train_epochs=3",
                      "--save_checkpoints_steps=4", *extra, check=check)


def one_line(proc):
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, \
        proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_a_full_disk_ends_in_one_line_and_the_rerun_resumes_from_the_last_checkpoint(data, google_release, tmp_path):
    disk = tmp_path / "disk"
    with small_disk(disk, "400k"):  # a tiny run's checkpoint takes ~290 KiB: the second one does not fit
        out = disk / "out"
        last = one_line(classify(data, google_release, out, check=False))
        assert "no space left on device writing " + str(out / "ckpt-8") in last, last
        assert "a checkpoint here takes 28" in last and "rerun the same command" in last, last
        assert sorted(n for n in os.listdir(out) if n.startswith("ckpt")) == ["ckpt-4.data-00000-of-00001",
                                                                             "ckpt-4.index"]
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        proc = classify(data, google_release, out)
        assert "from step 4" in proc.stderr, proc.stderr[-2000:]
        assert sorted(n for n in os.listdir(out) if n.endswith(".index")) == ["ckpt-20.index", "ckpt-24.index"]
        # --save_total_limit's default: the newest checkpoint and the one before it


def test_disk_full_recognises_python_and_tensorflow_errors_and_nothing_else(tmp_path):
    import errno

    import tensorflow as tf

    line = errors.disk_full(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "eval_results.txt")))
    assert line.startswith(f"no space left on device writing {tmp_path}/eval_results.txt (")
    (tmp_path / "ckpt-3_temp").mkdir()
    tf_error = tf.errors.ResourceExhaustedError(
        None, None, f"{{{{node SaveV2}}}} {tmp_path}/ckpt-3_temp/part-00000.tempstate1; No space left on device")
    assert errors.disk_full(tf_error).startswith(f"no space left on device writing {tmp_path}/ckpt-3 (")
    assert not (tmp_path / "ckpt-3_temp").exists()  # TensorFlow's half-written save, removed
    assert errors.disk_full(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")) is None
    assert errors.disk_full(OSError(errno.EACCES, "Permission denied")) is None


def test_an_export_dir_on_a_read_only_disk_is_refused_before_training(data, google_release, tmp_path):
    with small_disk(tmp_path / "ro", "1m", read_only=True) as ro:
        out = tmp_path / "out"
        last = one_line(classify(data, google_release, out, "--do_export", f"--export_dir={ro}/exports", check=False))
        assert last.endswith(f"--export_dir={ro}/exports is not writable (Read-only file system)"), last
        assert not out.exists() or not [n for n in os.listdir(out) if n.startswith("ckpt")]


@pytest.mark.parametrize("linked", ["ckpt-4.index", "checkpoint", "export"])
def test_a_symbolic_link_in_the_output_directory_is_refused_and_its_target_untouched(data, google_release, tmp_path,
                                                                                     linked):
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside"
    if linked == "export":
        outside.mkdir()
    else:
        outside.write_bytes(b"someone else's file")
    os.symlink(outside, out / linked)
    last = one_line(classify(data, google_release, out, "--do_export", check=False))
    assert last.endswith(f"{out}/{linked} is a symbolic link; bert_mgpu writes only real files inside its output "
                         f"directory and would write through it (to {outside}): remove the link"), last
    assert (os.listdir(outside) == [] if linked == "export" else outside.read_bytes() == b"someone else's file")
    assert not [n for n in os.listdir(out) if n.startswith("ckpt") and n != linked]


def test_extract_features_refuses_an_output_on_a_read_only_disk_before_reading_the_model(google_release, tmp_path):
    (tmp_path / "in.txt").write_text("hello world\n")
    with small_disk(tmp_path / "ro", "1m", read_only=True) as ro:
        proc = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}", f"--output_npy={ro}/e.npy",
                          f"--init_checkpoint={google_release}", check=False)
        assert one_line(proc) == f"extract_features.py: error: --output_npy={ro}/e.npy: {ro} is not writable " \
                                 "(Read-only file system)"
