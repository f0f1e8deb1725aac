"""report_to: the loop's records and the run's settings reach W&B (offline) and MLflow (a file store), and
TensorBoard's HParams dashboard gets the settings and the final dev results; the files hold the values."""

import glob
import json
import os
import struct

import numpy as np
import pytest
from conftest import sentiment_rows

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.train import reporting

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def wandb_records(path):
    """The protobuf Records of a W&B offline run file (.wandb): its header (":W&B", 0xBEE1, version 0),
    then LevelDB-log blocks of 32 KiB holding chunks (crc32, length, type: 1 full, 2 first, 3 middle,
    4 last). A reader of our own: wandb 0.31 ships none in Python."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, block, pending, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length, kind) == (0, 0):  # the rest of the block is padding
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(path):
    return [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]


def mlflow_metric(run_dir, key):
    """{step: value} of a metric in MLflow's file store (a line "timestamp value step" each)."""
    lines = open(os.path.join(run_dir, "metrics", key)).read().split("\n")
    return {int(step): float(value) for _, value, step in (line.split() for line in lines if line)}


def test_report_to_names_are_checked_in_one_line(monkeypatch):
    assert reporting.parse_report_to(["none"]) == () and reporting.parse_report_to([]) == ()
    assert reporting.parse_report_to("all") == ("tensorboard", "wandb", "mlflow")
    with pytest.raises(UserError, match="^--report_to: comet unknown; known: tensorboard, wandb, mlflow, all, none$"):
        reporting.parse_report_to(["tensorboard", "comet"])
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "mlflow" else real(name, *a, **k))
    with pytest.raises(UserError, match=r"^--report_to=mlflow: mlflow is not installed \(pip install mlflow-skinny"):
        bert_mgpu.TrainConfig(report_to=("mlflow",)).check()


def test_a_run_reports_its_records_settings_and_final_results_to_wandb_mlflow_and_hparams(
        google_release, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the test extra has wandb")
    pytest.importorskip("mlflow", reason="the test extra has mlflow-skinny")
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_CACHE_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    train = [bert_mgpu.Example(str(i), t, label=y) for i, (y, t) in enumerate(sentiment_rows(64, seed=1))]
    dev = [bert_mgpu.Example(str(i), t, label=y) for i, (y, t) in enumerate(sentiment_rows(16, seed=2))]
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=4)
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                   max_seq_length=16)
    out = str(tmp_path / "run")
    kinds = ("tensorboard", "wandb", "mlflow")
    history = clf.fit(train, out, epochs=1, learning_rate=2e-3, verbose=False, log_every=2, dev=dev,
                      eval_every_steps=4, eval_batch_size=4, report_to=kinds)
    assert os.environ["WANDB_MODE"] == "offline"
    assert glob.glob(os.path.join(out, "wandb", "cache", "wandb", "logs", "core-debug-*.log"))  # not ~/.cache
    results = clf.evaluate(dev, 4)
    reporting.report_results(kinds, out, results, results["global_step"])  # as the scripts do: the same runs
    ids = json.loads(open(os.path.join(out, "reporting.json")).read())
    assert ids["settings"]["learning_rate"] == 2e-3 and ids["settings"]["labels"] == '["neg", "pos"]'

    steps, losses = history["step"], history["loss"]
    assert steps == [2, 4, 6, 8] and history["eval_step"] == [4, 8]
    # MLflow: every logged value at its step, the settings as params, the final result.
    run_dir, = glob.glob(os.path.join(out, "mlruns", "*", ids["mlflow"]))
    logged = mlflow_metric(run_dir, "loss")
    assert sorted(logged) == steps
    np.testing.assert_allclose([logged[s] for s in steps], losses, rtol=1e-6)
    assert mlflow_metric(run_dir, "eval_accuracy") == pytest.approx(
        {**dict(zip(history["eval_step"], history["eval_accuracy"])), 8: results["eval_accuracy"]})
    assert os.path.exists(os.path.join(run_dir, "metrics", "system", "cpu_percent"))
    assert open(os.path.join(run_dir, "params", "learning_rate")).read() == "0.002"
    # W&B offline: two run files of one id (training, then the evaluation after it).
    files = sorted(glob.glob(os.path.join(out, "wandb", f"offline-run-*-{ids['wandb']}", "*.wandb")))
    assert len(files) == 2
    rows = [r for r in wandb_history(files[0]) if "loss" in r]
    assert [r["_step"] for r in rows] == steps
    np.testing.assert_allclose([r["loss"] for r in rows], losses, rtol=1e-6)
    assert [r["eval_accuracy"] for r in wandb_history(files[0]) if "eval_accuracy" in r] == pytest.approx(
        history["eval_accuracy"])
    summary = [u for r in wandb_records(files[1]) if r.WhichOneof("record_type") == "summary"
               for u in r.summary.update if u.key == "eval_accuracy"]
    assert summary and json.loads(summary[-1].value_json) == pytest.approx(results["eval_accuracy"])
    config = [r.run.config for r in wandb_records(files[0]) if r.WhichOneof("record_type") == "run"][0]
    assert {u.key: json.loads(u.value_json) for u in config.update}["learning_rate"] == 2e-3
    # TensorBoard HParams: a session with the settings, and the final metrics beside it.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(os.path.join(out, "hparams"), size_guidance={"tensors": 0}).Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(next(iter(content.values()))).session_start_info
    assert start.hparams["learning_rate"].number_value == 2e-3 and start.hparams["seed"].number_value == 12345
    accuracy, = events.Tensors("eval_accuracy")
    import tensorflow as tf

    assert accuracy.step == 8 and float(tf.make_ndarray(accuracy.tensor_proto)) == pytest.approx(
        results["eval_accuracy"])


def test_the_evaluation_after_training_reopens_the_mlflow_run_in_a_process_of_its_own(tmp_path):
    """As `--do_eval` alone on a run directory: a new process, the file store and the run found from
    reporting.json (MLflow 3 refuses a file store unless told it is wanted)."""
    pytest.importorskip("mlflow", reason="the test extra has mlflow-skinny")
    from conftest import run_python

    out = str(tmp_path / "run")
    code = ("from bert_mgpu.train.reporting import Reporters\n"
            "with Reporters(['mlflow'], {out!r}, {settings}) as r:\n"
            "    {action}\n")
    env = {"MLFLOW_ALLOW_FILE_STORE": None, "MLFLOW_TRACKING_URI": None}
    run_python(code.format(out=out, settings="{'learning_rate': 1e-4}", action="r.log({'step': 3, 'loss': 0.5})"),
               env=env)
    run_python(code.format(out=out, settings="None", action="r.final({'eval_accuracy': 0.75}, 3)"), env=env)
    ids = json.loads(open(os.path.join(out, "reporting.json")).read())
    run_dir, = glob.glob(os.path.join(out, "mlruns", "*", ids["mlflow"]))
    assert mlflow_metric(run_dir, "loss") == {3: 0.5} and mlflow_metric(run_dir, "eval_accuracy") == {3: 0.75}
    assert open(os.path.join(run_dir, "params", "learning_rate")).read() == "0.0001"
