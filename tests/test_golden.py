"""Run directories written by an earlier commit (tests/golden, made by tests/golden/make_golden.py) still
evaluate, predict, export and resume with the numbers they were written with: the safety net under the
package's redesign (issue 34). Tolerances cover CPUs of other kinds (float32 sums in another order)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from bert_mgpu.io import checkpoints

GOLDEN = os.path.join(ROOT, "tests", "golden")


def copy_of(kind, tmp_path):
    target = tmp_path / kind
    shutil.copytree(os.path.join(GOLDEN, kind), target)
    return target, json.load(open(target / "expected.json"))


def run(directory, script, *args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def results(path):
    return {k: float(v) for k, v in (line.split(" = ") for line in open(path).read().splitlines())}


def drop_newest(out):
    for name in os.listdir(out):
        if name.startswith("ckpt-8."):
            os.remove(out / name)


def test_a_classifier_run_directory_evaluates_predicts_and_exports_as_it_was_written(tmp_path):
    d, expected = copy_of("classifier", tmp_path)
    written = np.loadtxt(d / "out" / "test_results.tsv")
    flags = [f for f in expected["flags"] if not f.startswith("--init_checkpoint")]  # the run directory's model
    proc = run(d, "run_classifier_mgpu.py", *flags, "--do_eval", "--do_predict", "--do_export",
               "--export_format=google")
    got = results(d / "out" / "eval_results.txt")
    assert got.keys() == expected["eval"].keys()
    for key, want in expected["eval"].items():
        assert got[key] == pytest.approx(want, abs=1e-5), key
    np.testing.assert_allclose(np.loadtxt(d / "out" / "test_results.tsv"), written, atol=1e-5)
    assert "export: google -> " in proc.stdout
    exported = checkpoints.read_tf_checkpoint(str(d / "out" / "export" / "google" / "bert_model.ckpt"))
    own = checkpoints.load_pretrained(str(d / "out")).weights
    for name, value in own.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)


def test_a_classifier_run_directory_resumes_to_the_same_end(tmp_path):
    d, expected = copy_of("classifier", tmp_path)
    drop_newest(d / "out")
    proc = run(d, "run_classifier_mgpu.py", *expected["flags"], "--do_train", "--do_eval")
    assert "resuming from " in proc.stderr and "ckpt-4 at step 4" in proc.stderr, proc.stderr[-2000:]
    got = results(d / "out" / "eval_results.txt")
    for key, want in expected["eval"].items():
        assert got[key] == pytest.approx(want, abs=1e-4), key
    # The resumed run keeps its TrainConfig beside the settings it compared, as it ran: the flags' values.
    written = json.load(open(d / "out" / "bert_mgpu.json"))
    config = written["train_config"]
    assert (config["epochs"], config["learning_rate"], config["train_batch_size"], config["seed"]) == (
        written["settings"]["num_train_epochs"], written["settings"]["learning_rate"],
        written["settings"]["per_tower_batch"], written["settings"]["seed"])


def test_a_pretraining_run_directory_evaluates_and_resumes_as_it_was_written(tmp_path):
    d, expected = copy_of("pretraining", tmp_path)
    run(d, "run_pretraining_mgpu.py", *expected["flags"], "--do_eval", "--max_eval_steps=4")
    got = results(d / "out" / "eval_results.txt")
    assert got.keys() == expected["eval"].keys()
    for key, want in expected["eval"].items():
        assert got[key] == pytest.approx(want, abs=1e-5), key
    drop_newest(d / "out")
    proc = run(d, "run_pretraining_mgpu.py", *expected["flags"], "--do_train", "--do_eval", "--max_eval_steps=4")
    assert "ckpt-4" in proc.stderr and "resum" in proc.stderr, proc.stderr[-2000:]
    got = results(d / "out" / "eval_results.txt")
    for key, want in expected["eval"].items():
        assert got[key] == pytest.approx(want, abs=1e-4), key
