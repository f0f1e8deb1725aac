"""Scores as labels (STS-B, --task_type=regression): one output, mean squared error, Pearson and Spearman."""

import os
import re

import numpy as np
import pytest
from conftest import run_script

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

GOOD, BAD = ["good", "great", "fun", "brilliant", "love"], ["bad", "awful", "dull", "boring", "hate"]
FILLER = ["the", "movie", "film", "plot", "actor", "story", "was", "very", "it"]
HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"


def scored_rows(n, seed):
    """A learnable score from 0 to 5: 2.5 plus 1.25 per 'good' word, minus 1.25 per 'bad' word."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        g, b = rng.integers(0, 3), rng.integers(0, 3)
        words = [*rng.choice(FILLER, rng.integers(2, 6)), *rng.choice(GOOD, g), *rng.choice(BAD, b)]
        rng.shuffle(words)
        rows.append((2.5 + 1.25 * (g - b), " ".join(words), " ".join(rng.choice(FILLER, 3))))
    return rows


def write_stsb(directory, rows, split):
    """GLUE's STS-B layout: ten tab-separated columns, the score last (none in test.tsv)."""
    lines = [HEADER + ("" if split == "test" else "\tscore")]
    for i, (score, a, b) in enumerate(rows):
        cells = [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b]
        lines.append("\t".join(cells + ([] if split == "test" else [f"{score:.3f}"])))
    (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def stsb(tmp_path_factory, google_release):
    data = tmp_path_factory.mktemp("stsb")
    for split, n, seed in (("train", 640, 1), ("dev", 64, 2), ("test", 13, 3)):
        write_stsb(data, scored_rows(n, seed), split)
    out = tmp_path_factory.mktemp("out")
    args = ["--task_name=sts-b", f"--data_dir={data}", f"--init_checkpoint={google_release}", f"--output_dir={out}",
            "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8", "--eval_batch_size=8",
            "--max_seq_length=32", "--precision=float32", "--learning_rate=5e-3", "--num_train_epochs=8",
            "--log_every_steps=40"]
    proc = run_script("run_classifier_mgpu.py", *args, "--do_train", "--do_eval", "--do_predict")
    return data, out, args, proc


def results(path):
    return {k: float(v) for k, v in (line.split(" = ") for line in open(path).read().splitlines())}


def test_sts_b_learns_scores_and_predicts_numbers(stsb):
    data, out, _, proc = stsb
    r = results(out / "eval_results.txt")
    assert set(r) == {"eval_loss", "eval_pearson", "eval_spearman", "eval_examples", "global_step", "loss"}
    assert r["eval_examples"] == 64 and r["global_step"] == 320
    assert r["eval_pearson"] > 0.8 and r["eval_spearman"] > 0.7, r  # 0.98-0.996 for seeds 0-15 (NOTES 67)
    variance = np.var([score for score, _, _ in scored_rows(64, 2)])  # the loss of always saying the mean
    assert r["eval_loss"] < 0.5 * variance, (r, variance)  # measured 0.02-0.11 against 2.1
    assert f"eval: pearson {r['eval_pearson']:.4f} on 64 examples" in proc.stdout
    scores = np.loadtxt(out / "test_results.tsv")
    assert scores.shape == (13,) and np.isfinite(scores).all() and scores.std() > 0.5
    table = (out / "predictions.tsv").read_text().splitlines()
    assert table[0] == "id\tscore" and len(table) == 14
    np.testing.assert_allclose([float(row.split("\t")[1]) for row in table[1:]], scores, atol=1e-6)
    assert not (out / "confusion_matrix.tsv").exists()


def test_a_regression_run_predicts_from_its_directory_as_a_regression(stsb, tmp_path):
    data, out, _, _ = stsb
    again = tmp_path / "again"
    run_script("run_classifier_mgpu.py", "--task_name=sts-b", f"--data_dir={data}", f"--init_checkpoint={out}",
               f"--output_dir={again}", "--n_gpus=0", "--max_seq_length=32", "--precision=float32", "--do_predict",
               "--predict_batch_size=5")
    np.testing.assert_allclose(np.loadtxt(again / "test_results.tsv"), np.loadtxt(out / "test_results.tsv"),
                               atol=1e-5)


@pytest.mark.parametrize("case, expected", [
    ("score_as_class", r"train.tsv:3: label '3.75' is a score, not a class; pass --task_type=regression"),
    ("word_as_score", r"train.tsv:3: label 'high' is not a finite number \(--task_type=regression\)"),
    ("regression_of_a_class_task", r"--task_type=regression: mrpc is a classification task"),
])
def test_labels_that_do_not_fit_the_task_type_are_one_line(stsb, tmp_path, case, expected):
    _, _, args, _ = stsb
    d = tmp_path / "d"
    d.mkdir()
    rows = "label\ttext\n1\tgood film\n3.75\tgreat fun film\n"
    extra = ["--task_name=tsv"]
    if case == "word_as_score":
        rows = "label\ttext\n2.5\tgood film\nhigh\tgreat fun film\n"
        extra = ["--task_name=tsv", "--task_type=regression"]
    elif case == "regression_of_a_class_task":
        extra = ["--task_name=mrpc", "--task_type=regression"]
    (d / "train.tsv").write_text(rows)
    keep = [a for a in args if not a.startswith(("--task_name", "--data_dir", "--output_dir"))]
    proc = run_script("run_classifier_mgpu.py", *keep, *extra, f"--data_dir={d}", f"--output_dir={tmp_path / 'o'}",
                      "--do_train", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.search(expected, last) and last.startswith("run_classifier_mgpu.py: error: "), last
    assert not os.path.exists(tmp_path / "o" / "bert_mgpu.json")


def test_a_regression_exports_scores_of_sentence_pairs(reference, stsb, tmp_path):
    """The SavedModel takes text_a and text_b and returns scores; Hugging Face's config says regression."""
    import tensorflow as tf
    import torch
    import transformers

    import bert_mgpu

    data, out, _, _ = stsb
    pairs = [("the movie was good", "the plot"), ("awful dull film", "it was"), ("great fun", "")]
    clf = bert_mgpu.BertClassifier.from_pretrained(str(out), towers=bert_mgpu.Towers(n_gpus=0), precision="float32",
                                                   max_seq_length=32)
    ours = clf.predict(pairs)
    assert clf.pairs and ours.shape == (3,) and np.ptp(ours) > 0.5
    bert_mgpu.export_model(str(out), str(tmp_path / "sm"), "saved_model")
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    got = served(text_a=tf.constant([a for a, _ in pairs]), text_b=tf.constant([b for _, b in pairs]))
    assert list(got) == ["scores"] and np.abs(got["scores"].numpy() - ours).max() <= 1e-5
    bert_mgpu.export_model(str(out), str(tmp_path / "hf"), "hf")
    model = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
    assert model.config.problem_type == "regression" and model.config.num_labels == 1
    tok = transformers.BertTokenizer.from_pretrained(str(tmp_path / "hf"))
    batch = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits.numpy()[:, 0]
    assert np.abs(logits - ours).max() <= 1e-4
    back = bert_mgpu.BertClassifier.from_pretrained(str(tmp_path / "hf"), towers=bert_mgpu.Towers(n_gpus=0),
                                                    precision="float32", max_seq_length=32)
    assert back.task_type == "regression" and np.abs(back.predict(pairs) - ours).max() <= 1e-6
