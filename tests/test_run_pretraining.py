"""The pretraining scripts as a user runs them: text -> TFRecords -> pretraining -> fine-tuning, bad input."""

import glob
import json
import os
import re
import struct

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_script, sentiment_rows, tiny_config, write_tsv, write_vocab
from test_pretraining_records import write_corpus

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """What a from-scratch user starts with: text, a vocab.txt and a bert_config.json."""
    d = tmp_path_factory.mktemp("scratch")
    tokens = write_vocab(str(d / "vocab.txt"))
    tiny_config(len(tokens)).to_json_file(str(d / "bert_config.json"))
    write_corpus(str(d / "corpus.txt"))
    return str(d)


@pytest.fixture(scope="module")
def pretrained(release):
    d = release
    shards = os.path.join(d, "pretrain.tfrecord")
    proc = run_script("create_pretraining_data.py", f"--input_file={d}/corpus.txt", f"--output_file={shards}",
                  f"--vocab_file={d}/vocab.txt", "--max_seq_length=32", "--max_predictions_per_seq=5",
                  "--dupe_factor=2", "--num_output_shards=3")
    assert "instances from 20 documents" in proc.stdout
    out = os.path.join(d, "out")
    args = [f"--input_file={shards}-*", f"--bert_config_file={d}/bert_config.json", f"--vocab_file={d}/vocab.txt",
            f"--output_dir={out}", "--do_train=true", "--do_eval=true", "--do_validation=true",
            "--validation_steps=10", "--towers_per_gpu=2", "--train_batch_size=16",
            "--train_micro_batch_size_per_gpu=4", "--max_seq_length=32", "--max_predictions_per_seq=5",
            "--num_train_steps=20", "--learning_rate=1e-3", "--finetune_time_markers=0.5,1.0",
            "--encoder_ln_mode=pre-ln", "--optimizer=lamb", "--precision=float32", "--log_every_steps=5",
            "--do_export", "--report_to=tensorboard,mlflow"]
    proc = run_script("run_pretraining_mgpu.py", *args)
    return d, out, args, proc


def test_text_to_pretraining_to_fine_tuning(pretrained, tmp_path):
    d, out, args, proc = pretrained
    assert "pretraining stopped at step 20: reached 20 steps" in proc.stdout
    results = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    assert int(results["global_step"]) == 20
    assert 0.0 <= float(results["masked_lm_accuracy"]) <= 1.0 and float(results["masked_lm_loss"]) > 0
    assert 0.3 <= float(results["next_sentence_accuracy"]) <= 1.0
    assert sorted(os.listdir(os.path.join(out, "finetune_checkpoints"))) == ["at_0.5", "at_1"]
    assert os.path.exists(os.path.join(out, "train"))  # TensorBoard
    block = proc.stdout[proc.stdout.index("== run_pretraining_mgpu.py =="):].splitlines()
    facts = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in block[1:-1])
    assert facts["trained"] == "20 steps (reached 20 steps)" and facts["towers"] == "2 on CPU"
    assert float(facts["masked_lm_accuracy"]) == pytest.approx(float(results["masked_lm_accuracy"]), abs=5e-4)
    assert float(facts["sequences/s"].split()[0]) > 0 and float(facts["tokens/s"].split()[0]) > 0
    assert "compiling included)" in facts["sequences/s"] and "compiling included)" in facts["tokens/s"]
    assert re.fullmatch(r"cpu \d+%, resident \d+\.\d\d GiB", facts["system peak"]), facts["system peak"]
    assert block[-1].startswith(f"  outputs in {out}: ckpt-20 (latest checkpoint), bert_config.json, ")
    assert ("eval_results.txt, export/, finetune_checkpoints/, hparams/, learning_curves.png, mlruns/, "
            "reporting.json, train/, vocab.txt") in block[-1]
    # --report_to: MLflow's file store holds each record and the evaluation after training.
    from test_reporting import mlflow_metric

    run = json.loads(open(os.path.join(out, "reporting.json")).read())["mlflow"]
    run_dir, = glob.glob(os.path.join(out, "mlruns", "*", run))
    assert sorted(mlflow_metric(run_dir, "mlm_loss")) == [5, 10, 15, 20]
    assert mlflow_metric(run_dir, "eval_masked_lm_accuracy") == {20: pytest.approx(
        float(results["masked_lm_accuracy"]))}
    assert sorted(mlflow_metric(run_dir, "eval_mlm_loss")) == [10, 20]  # validation while training
    # Its curves: the masked-LM loss and accuracy, validation, learning rate and sequences/s it logged.
    import matplotlib.image

    from bert_mgpu.io import plot

    assert matplotlib.image.imread(os.path.join(out, "learning_curves.png")).shape == (800, 1200, 4)
    series = plot.learning_curves(out, path=os.path.join(out, "again.png"))[1]
    assert {"train/mlm_loss", "train/mlm_accuracy", "train/eval_mlm_loss", "train/learning_rate",
            "train/examples_per_second"} <= set(series)
    assert list(series["train/eval_mlm_loss"][0]) == [10, 20]  # --validation_steps=10
    # The fine-tune checkpoint goes straight into the classifier script.
    data = tmp_path / "task"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(640, seed=1))
    write_tsv(data / "dev.tsv", sentiment_rows(40, seed=2))
    proc = run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={data}",
                  f"--init_checkpoint={out}/finetune_checkpoints/at_1", f"--output_dir={tmp_path / 'clf'}",
                  "--do_train=true", "--do_eval=true", "--towers_per_gpu=2", "--train_batch_size=8",
                  "--max_seq_length=32", "--num_train_epochs=4", "--learning_rate=2e-3", "--precision=float32")
    accuracy = float(proc.stdout.split("eval: accuracy ")[1].split()[0])
    assert accuracy >= 0.8, proc.stdout


def test_rerun_resumes_and_finds_the_budget_spent(pretrained, tmp_path):
    """The same command again (on a copy of the run): it resumes at step 20, trains no step, writes no
    checkpoint, and evaluates the same weights to the same numbers."""
    import hashlib
    import shutil

    d, out, args, _ = pretrained
    copy = str(tmp_path / "out")
    shutil.copytree(out, copy)
    digest = lambda: {f: hashlib.sha256(open(os.path.join(copy, f), "rb").read()).hexdigest()  # noqa: E731
                      for f in os.listdir(copy) if f.startswith("ckpt-")}
    before = digest()
    first = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    again = [f"--output_dir={copy}" if a.startswith("--output_dir=") else a for a in args
             if not a.startswith(("--encoder_ln_mode", "--do_export"))]
    proc = run_script("run_pretraining_mgpu.py", *again)
    assert "pretraining stopped at step 20: reached 20 steps" in proc.stdout
    assert not re.findall(r"\] step \d+:", proc.stderr), proc.stderr[-2000:]  # no step trained, none logged
    assert digest() == before and tf.train.latest_checkpoint(copy).endswith("ckpt-20")
    results = dict(line.split(" = ") for line in open(os.path.join(copy, "eval_results.txt")).read().splitlines())
    assert int(results["global_step"]) == 20
    for key in ("masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy"):
        assert float(results[key]) == pytest.approx(float(first[key]), abs=1e-6), key


def test_the_pretrained_encoder_is_served_from_raw_text(pretrained):
    """--do_export after pretraining: a SavedModel giving the encoder's outputs (pre-LN, which only a
    SavedModel can carry); Hugging Face's BERT has no pre-LN, so that export is refused in one line."""
    import tensorflow_text  # noqa: F401

    from bert_mgpu import BertPretrainer, Towers

    d, out, args, proc = pretrained
    path = os.path.join(out, "export", "saved_model")
    assert f"export: saved_model -> {path}" in proc.stdout
    served = tf.saved_model.load(path)
    ids = tf.constant([[2, 15, 16, 17, 3, 0], [2, 18, 3, 0, 0, 0]], tf.int32)
    got = served.signatures["serving_ids"](token_ids=ids, segment_ids=tf.zeros_like(ids))
    pre = BertPretrainer.from_pretrained(out, towers=Towers(n_gpus=0), precision="float32", fused_encoder=False)
    ours = pre.model.backbone({"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": ids != 0})
    assert np.abs(got["pooled_output"].numpy() - ours["pooled_output"].numpy()).max() <= 1e-5
    text = served.signatures["serving_default"](text=tf.constant(["the movie", "it"]))
    assert text["sequence_output"].shape[0] == 2 and text["mean_pooled"].shape == (2, 32)
    proc = run_script("run_pretraining_mgpu.py", f"--output_dir={out}", "--do_export", "--export_format=hf",
                      check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        "run_pretraining_mgpu.py: error: --export_format=hf: this model's encoder is pre-LN, which hf cannot "
        "express (its BERT is post-LN); export it as saved_model or onnx")
    assert not os.path.exists(os.path.join(out, "export", "hf"))


def test_reference_encoder_evaluates_the_same(pretrained, tmp_path):
    """--fused_encoder=false (keras-hub's BertBackbone as it is) on the same weights: the same eval numbers."""
    d, out, args, _ = pretrained
    keep = ("--input_file", "--vocab_file", "--max_seq_length", "--max_predictions_per_seq", "--towers_per_gpu",
            "--precision")
    base = [a for a in args if a.split("=")[0] in keep] + [f"--init_checkpoint={out}", "--do_eval=true"]
    results = []
    for fused in ("true", "false"):
        o = tmp_path / fused
        run_script("run_pretraining_mgpu.py", *base, f"--output_dir={o}", f"--fused_encoder={fused}")
        results.append(dict(line.split(" = ") for line in open(o / "eval_results.txt").read().splitlines()))
    assert float(results[0]["masked_lm_loss"]) > 0
    for key in ("masked_lm_loss", "masked_lm_accuracy", "next_sentence_loss", "next_sentence_accuracy"):
        assert abs(float(results[0][key]) - float(results[1][key])) < 1e-5, (key, results)


@pytest.mark.parametrize("extra, message", [
    (["--input_file=/nonexistent/*.tfrecord"], "/nonexistent/*.tfrecord: no such input file"),
    (["--max_seq_length=64"], "records have input_ids of length 32 but --max_seq_length=64"),
    (["--bert_config_file="], "from scratch needs --bert_config_file and --vocab_file"),
    (["--lr_schedule=time"], "--lr_schedule=time needs --total_training_time"),
    (["--train_batch_size=10"], "--train_batch_size=10 is not a multiple of micro-batch x towers = 4 x 2"),
    (["--input_format=text"], "raw text input trains masked LM only (--nsp=false)"),
])
def test_bad_input_is_one_line(pretrained, tmp_path, extra, message):
    d, _, args, _ = pretrained
    base = [a for a in args if not a.startswith("--output_dir")] + [f"--output_dir={tmp_path / 'o'}"]
    names = {e.split("=")[0] for e in extra}
    proc = run_script("run_pretraining_mgpu.py", *[a for a in base if a.split("=")[0] not in names], *extra,
                  check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run_pretraining_mgpu.py: error: ") and message in last, last
    assert "Traceback" not in proc.stderr



@pytest.mark.parametrize("inside", ["data", "header"])
def test_a_record_file_cut_short_is_named_with_the_record(pretrained, tmp_path, inside):
    """A TFRecord cut mid-record (a copy that stopped): one line naming the file and the record, not
    TensorFlow's DataLossError, which names neither; a cut inside the last record's 12-byte header, which
    TensorFlow reads as the end of the file, is found by walking the record lengths before training."""
    d, _, args, _ = pretrained
    shards = sorted(f for f in os.listdir(d) if f.startswith("pretrain.tfrecord-"))
    whole = open(os.path.join(d, shards[1]), "rb").read()
    cut = tmp_path / "cut.tfrecord"
    start = 0  # a record past the middle of the file
    while start < len(whole) // 2:
        start += 16 + struct.unpack("<Q", whole[start:start + 8])[0]
    length = struct.unpack("<Q", whole[start:start + 8])[0]
    cut.write_bytes(whole[: start + (12 + length // 2 if inside == "data" else 5)])
    base = [a for a in args if not a.startswith(("--input_file", "--output_dir", "--do_validation", "--do_eval",
                                                 "--validation_steps"))]
    proc = run_script("run_pretraining_mgpu.py", *base, f"--input_file={cut}",
                      f"--output_dir={tmp_path / 'o'}", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    readable = sum(1 for _ in tf.data.TFRecordDataset(str(cut)).apply(tf.data.experimental.ignore_errors()))
    line = proc.stderr.strip().splitlines()[-1]
    where = f" \\(inside its header, which starts at byte {start}\\)" if inside == "header" else ""
    assert re.fullmatch(re.escape(f"run_pretraining_mgpu.py: error: {cut}: record {readable + 1} is truncated at byte ")
                        + r"\d+" + where + r"; a file cut short while it was copied\? Write or copy it again, or leave "
                        r"it out of --input_file", line), line
    assert not os.path.exists(tmp_path / "o") or not [n for n in os.listdir(tmp_path / "o") if n.startswith("ckpt")]
