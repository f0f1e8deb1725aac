"""Multi-label classification: sets of labels, sigmoid outputs, binary cross-entropy, micro and macro F1."""

import numpy as np
import pytest
from conftest import run_script

from bert_mgpu.core import metrics

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

GOOD, BAD = ["good", "great", "fun", "brilliant", "love"], ["bad", "awful", "dull", "boring", "hate"]
FILLER = ["the", "movie", "film", "actor", "story", "was", "very", "it"]


def tagged_rows(n, seed):
    """Labels told by the words: 'praise' for a good word, 'blame' for a bad one, 'plot' for the word plot;
    any number of them, none included."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        words = list(rng.choice(FILLER, rng.integers(2, 6)))
        tags = []
        for tag, pool in (("praise", GOOD), ("blame", BAD), ("plot", ["plot"])):
            if rng.random() < 0.4:
                words.append(str(rng.choice(pool)))
                tags.append(tag)
        rng.shuffle(words)
        rows.append(("|".join(tags), " ".join(words)))
    return rows


def write(path, rows):
    path.write_text("label\ttext\n" + "".join(f"{a}\t{b}\n" for a, b in rows))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from conftest import learning_release

    release = learning_release(str(tmp_path_factory.mktemp("release")))  # no dropout: learns in 640 steps
    data = tmp_path_factory.mktemp("tags")
    write(data / "train.tsv", tagged_rows(1280, 1))
    write(data / "dev.tsv", tagged_rows(64, 2))
    write(data / "test.tsv", [("", text) for _, text in tagged_rows(9, 3)])
    out = tmp_path_factory.mktemp("out")
    args = ["--task_name=tsv", "--task_type=multi_label", "--label_separator=|", f"--data_dir={data}",
            f"--init_checkpoint={release}", f"--output_dir={out}", "--n_gpus=0", "--towers_per_gpu=2",
            "--train_batch_size=16", "--max_seq_length=32", "--precision=float32", "--learning_rate=1e-3",
            "--num_train_epochs=16", "--log_every_steps=100"]  # F1 1.0 for seeds 0-17 (NOTES 67)
    proc = run_script("run_classifier_mgpu.py", *args, "--do_train", "--do_eval", "--do_predict")
    return data, out, args, proc


def test_sets_of_labels_are_learned_and_predicted(run):
    data, out, _, proc = run
    r = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert float(r["eval_f1_micro"]) > 0.85 and float(r["eval_f1_macro"]) > 0.85, r  # measured 1.0, 1.0
    assert float(r["eval_accuracy"]) > 0.7  # every label of a row right (measured 1.0)
    dev = tagged_rows(64, 2)
    for tag in ("praise", "blame", "plot"):
        assert int(r[f"report_{tag}_support"]) == sum(tag in labels.split("|") for labels, _ in dev)
    assert f"eval: f1_micro {float(r['eval_f1_micro']):.4f} on 64 examples" in proc.stdout
    probabilities = np.loadtxt(out / "test_results.tsv")
    assert probabilities.shape == (9, 3) and ((probabilities > 0) & (probabilities < 1)).all()
    predicted = (out / "predict.txt").read_text().split("\n")[:-1]
    labels = ["blame", "plot", "praise"]  # sorted, as read from the training data
    assert predicted == ["|".join(t for t, p in zip(labels, row) if p > 0.5) for row in probabilities]
    truth = ["|".join(sorted(t.split("|"))) if t else "" for t, _ in tagged_rows(9, 3)]
    assert sum(p == t for p, t in zip(predicted, truth)) >= 7


def test_a_label_outside_the_set_is_one_line(run, tmp_path):
    data, _, args, _ = run
    (tmp_path / "train.tsv").write_text((data / "train.tsv").read_text())
    write(tmp_path / "dev.tsv", [("praise|joy", "good film")])
    keep = [a for a in args if not a.startswith(("--data_dir", "--output_dir"))]
    proc = run_script("run_classifier_mgpu.py", *keep, f"--data_dir={tmp_path}", f"--output_dir={tmp_path / 'o'}",
                      "--do_eval", "--do_train", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith("dev.tsv:2: label 'joy' is not one of blame, plot, praise")


def test_multi_label_f1_equals_scikit_learns():
    import sklearn.metrics

    rng = np.random.default_rng(0)
    y, p = rng.random((200, 5)) < 0.3, rng.random((200, 5)) < 0.35
    p[:, 4] = False  # a label never predicted
    ours = metrics.multi_label(y, p)
    for average in ("micro", "macro"):
        assert ours[f"eval_f1_{average}"] == pytest.approx(
            sklearn.metrics.f1_score(y, p, average=average, zero_division=0), abs=1e-12)
    assert ours["eval_accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(y, p))
    precision, recall, f1, support = metrics.per_label(y, p)
    ref = sklearn.metrics.precision_recall_fscore_support(y, p, zero_division=0)
    for a, b in zip((precision, recall, f1, support), ref):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_predicting_from_the_run_directory_keeps_its_separator_and_threshold(run, tmp_path):
    data, out, _, _ = run
    again = tmp_path / "again"
    run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={out}",
               f"--output_dir={again}", "--do_predict", "--n_gpus=0", "--max_seq_length=32", "--precision=float32")
    assert (again / "predict.txt").read_text() == (out / "predict.txt").read_text()  # '|', as the run was told
    assert "|" in (again / "predict.txt").read_text()
