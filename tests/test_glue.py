"""GLUE: every task read from the layouts of GLUE's download, TFDS glue/*, the suite run and its table."""

import json
import os

import numpy as np
import pytest
from conftest import WORDS, run_script, tiny_config, write_google_release

from bert_mgpu.api import glue
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.tasks import get_task

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

GOOD, BAD = ["good", "great", "fun", "brilliant", "love"], ["bad", "awful", "dull", "boring", "hate"]
FILLER = ["the", "movie", "film", "plot", "actor", "story", "was", "very", "it"]
MNLI_HEAD = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]


def pairs(n, seed, labels):
    """(text_a, text_b, label): the label is told by which word list text_a draws from (learnable)."""
    rng = np.random.default_rng(seed)
    words = [GOOD, BAD, ["not", "but", "that", "of", "to"]]
    out = []
    for _ in range(n):
        k = int(rng.integers(len(labels)))
        a = " ".join([*rng.choice(FILLER, rng.integers(2, 6)), rng.choice(words[k])])
        out.append((a, " ".join(rng.choice(FILLER, 3)), labels[k]))
    return out


# GLUE's layouts: (directory, {split: file}, header of train/dev or None, test header, row, test row).
def _mnli_row(i, a, b, label, dev=False):
    return [str(i), "31193", f"{i}n", "government", f"( {a} )", f"( {b} )", f"(ROOT {a})", f"(ROOT {b})", a, b,
            *([label] * (5 if dev else 1)), label]


LAYOUTS = {
    "cola": ("CoLA", None, ["index", "sentence"], lambda i, a, b, y: ["gj04", y, "" if y == "1" else "*", a],
             lambda i, a, b: [str(i), a]),
    "sst-2": ("SST-2", ["sentence", "label"], ["index", "sentence"], lambda i, a, b, y: [a, y],
              lambda i, a, b: [str(i), a]),
    "mrpc": ("MRPC", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
             ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"], lambda i, a, b, y: [y, str(i), str(i + 1), a, b],
             lambda i, a, b: [str(i), str(i), str(i + 1), a, b]),
    "qqp": ("QQP", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"], ["id", "question1", "question2"],
            lambda i, a, b, y: [str(i), str(2 * i), str(2 * i + 1), a, b, y], lambda i, a, b: [str(i), a, b]),
    "mnli": ("MNLI", MNLI_HEAD + ["label1", "gold_label"], MNLI_HEAD, _mnli_row,
             lambda i, a, b: _mnli_row(i, a, b, "")[:10]),
    "qnli": ("QNLI", ["index", "question", "sentence", "label"], ["index", "question", "sentence"],
             lambda i, a, b, y: [str(i), a, b, y], lambda i, a, b: [str(i), a, b]),
    "rte": ("RTE", ["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"],
            lambda i, a, b, y: [str(i), a, b, y], lambda i, a, b: [str(i), a, b]),
    "wnli": ("WNLI", ["index", "sentence1", "sentence2", "label"], ["index", "sentence1", "sentence2"],
             lambda i, a, b, y: [str(i), a, b, y], lambda i, a, b: [str(i), a, b]),
}
LABELS = {"cola": ["0", "1"], "sst-2": ["0", "1"], "mrpc": ["0", "1"], "qqp": ["0", "1"], "wnli": ["0", "1"],
          "mnli": glue.NLI, "qnli": glue.ENTAILMENT, "rte": glue.ENTAILMENT}
SINGLE = ("cola", "sst-2")


def write_lines(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join("\t".join(r) + "\n" for r in rows))


def write_task(root, name, n_train=320, n_dev=48, n_test=13):
    directory, header, test_header, row, test_row = LAYOUTS[name]
    d = os.path.join(root, directory)
    files = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
    if name == "mnli":
        files = {"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"}
    for split, n, seed in (("train", n_train, 1), ("dev", n_dev, 2)):
        rows = [row(i, a, b, y) if name != "mnli" or split == "train" else _mnli_row(i, a, b, y, dev=True)
                for i, (a, b, y) in enumerate(pairs(n, seed, LABELS[name]))]
        head = header if name != "mnli" or split == "train" else MNLI_HEAD + [f"label{k}" for k in range(1, 6)] + [
            "gold_label"]
        write_lines(os.path.join(d, files[split]), ([head] if head else []) + rows)
    write_lines(os.path.join(d, files["test"]),
                [test_header] + [test_row(i, a, b) for i, (a, b, _) in enumerate(pairs(n_test, 3, LABELS[name]))])
    if name == "mnli":
        for split, file in (("dev", "dev_mismatched.tsv"), ("test", "test_mismatched.tsv")):
            source = os.path.join(d, files[split])
            write_lines(os.path.join(d, file), [line.rstrip("\n").split("\t") for line in open(source)])
        write_lines(os.path.join(root, "diagnostic", "diagnostic.tsv"), [["index", "sentence1", "sentence2"]] + [
            [str(i), a, b] for i, (a, b, _) in enumerate(pairs(7, 4, glue.NLI))])
    return d


def write_stsb(root, n_train=320, n_dev=48, n_test=13):
    from test_regression import scored_rows
    from test_regression import write_stsb as write

    d = os.path.join(root, "STS-B")
    os.makedirs(d, exist_ok=True)
    for split, n, seed in (("train", n_train, 1), ("dev", n_dev, 2), ("test", n_test, 3)):
        write(__import__("pathlib").Path(d), scored_rows(n, seed), split)
    return d


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_glue_task_reads_its_own_layout(tmp_path, name):
    d = write_task(str(tmp_path), name, n_train=20, n_dev=6, n_test=5)
    task = get_task(name)
    train, dev, test = (task.get_examples(d, s) for s in ("train", "dev", "test"))
    assert [(e.text_a, e.text_b if name not in SINGLE else None, e.label) for e in train] == [
        (a, None if name in SINGLE else b, y) for a, b, y in pairs(20, 1, LABELS[name])]
    assert len(dev) == 6 and all(e.label in LABELS[name] for e in dev)
    assert [e.text_a for e in test] == [a for a, _, _ in pairs(5, 3, LABELS[name])]
    assert all(e.label is None for e in test) and task.get_labels(d, train) == LABELS[name]


def test_mnli_mismatched_and_the_diagnostic_set(tmp_path):
    d = write_task(str(tmp_path), "mnli", n_train=10, n_dev=6, n_test=5)
    assert len(get_task("mnli-mm").get_examples(d, "dev")) == 6
    assert len(get_task("mnli-mm").get_examples(d, "test")) == 5
    ax = get_task("ax").get_examples(str(tmp_path / "diagnostic"), "test")
    assert len(ax) == 7 and ax[0].text_b and ax[0].label is None
    with pytest.raises(UserError, match=r"--task_name=ax has no train set, only test \(diagnostic.tsv\)"):
        get_task("ax").get_examples(str(tmp_path / "diagnostic"), "train")


def test_tfds_glue_reads_glues_columns_and_scores(tmp_path):
    """TFDS glue/mrpc and glue/stsb through TFDS's mock data (nothing downloaded)."""
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=9):
        mrpc = get_task("tfds", tfds_name="glue/mrpc", tfds_data_dir=str(tmp_path))
        train = mrpc.get_examples(str(tmp_path), "train")
        assert len(train) == 9 and all(e.text_b for e in train)
        assert mrpc.get_labels() == ["not_equivalent", "equivalent"] and {e.label for e in train} <= set(
            mrpc.get_labels())
        stsb = get_task("tfds", tfds_name="glue/stsb", tfds_data_dir=str(tmp_path))
        assert stsb.task_type == "regression" and stsb.get_labels() == []
        scores = [float(e.label) for e in stsb.get_examples(str(tmp_path), "dev")]
        assert len(scores) == 9 and len(set(scores)) > 1
        mnli = get_task("tfds", tfds_name="glue/mnli", tfds_data_dir=str(tmp_path))
        assert mnli.splits["dev"] == "validation_matched" and mnli.get_labels() == [
            "entailment", "neutral", "contradiction"]


def test_the_glue_table_and_leaderboard_files():
    results = {"cola": {"eval_mcc": 0.5}, "mrpc": {"eval_f1": 0.9, "eval_accuracy": 0.8},
               "mnli": {"eval_accuracy": 0.84}, "mnli-mm": {"eval_accuracy": 0.82}}
    assert glue.table(results).splitlines() == [
        "| CoLA | MRPC | MNLI-m/mm | Average |", "|---|---|---|---|", "| 50.0 | 90.0/80.0 | 84.0/82.0 | 72.7 |"]
    probabilities = np.array([[0.2, 0.7, 0.1], [0.9, 0.05, 0.05]])
    assert glue.submission("mnli", probabilities, glue.NLI) == "index\tprediction\n0\tentailment\n1\tcontradiction\n"
    assert glue.submission("sts-b", np.array([5.7, 2.25, -0.1]), []) == (
        "index\tprediction\n0\t5.000\n1\t2.250\n2\t0.000\n")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    glue_dir = str(root / "glue_data")
    for name in ("mrpc", "mnli"):
        write_task(glue_dir, name, n_train=640)
    write_stsb(glue_dir, n_train=640)
    release, _ = write_google_release(str(root / "release"), tiny_config(len(WORDS) + 10))
    out = root / "out"
    proc = run_script("run_glue_mgpu.py", f"--glue_dir={glue_dir}", f"--init_checkpoint={release}",
                      f"--output_dir={out}", "--tasks=mrpc,sts-b,mnli", "--n_gpus=0", "--towers_per_gpu=2",
                      "--train_batch_size=8", "--max_seq_length=32", "--precision=float32", "--learning_rate=2e-3",
                      "--num_train_epochs=6", "--truncation=head+tail", "--recompute",
                      "--sweep_member")  # as each run of a --seeds/--grid sweep: it writes sweep_run.json
    return out, proc


def test_the_suite_trains_every_task_and_prints_the_glue_table(suite):
    out, proc = suite
    values = {}
    for line in (out / "glue_results.tsv").read_text().splitlines()[1:]:
        task, metric, value = line.split("\t")
        values[(task, metric)] = float(value)
    assert values[("MRPC", "eval_accuracy")] > 0.8 and values[("MRPC", "eval_f1")] > 0.8
    assert values[("MNLI-m", "eval_accuracy")] > 0.6 and values[("MNLI-mm", "eval_accuracy")] > 0.6  # 3 classes
    assert values[("STS-B", "eval_pearson")] > 0.7
    table = (out / "glue_results.md").read_text().splitlines()
    assert table[0] == "| MRPC | STS-B | MNLI-m/mm | Average |" and table[2] in proc.stdout
    cells = table[2].strip("| ").split(" | ")
    assert cells[0] == f"{100 * values[('MRPC', 'eval_f1')]:.1f}/{100 * values[('MRPC', 'eval_accuracy')]:.1f}"
    scores = [(values[("MRPC", "eval_f1")] + values[("MRPC", "eval_accuracy")]) / 2,
              (values[("STS-B", "eval_pearson")] + values[("STS-B", "eval_spearman")]) / 2,
              (values[("MNLI-m", "eval_accuracy")] + values[("MNLI-mm", "eval_accuracy")]) / 2]
    assert cells[-1] == f"{100 * np.mean(scores):.1f}"
    member = json.loads((out / "sweep_run.json").read_text())  # what a sweep's table is made of
    assert member["measures"] == pytest.approx({"MRPC": 100 * scores[0], "STS-B": 100 * scores[1],
                                                "MNLI-m": 100 * scores[2], "Average": 100 * np.mean(scores)})
    assert member["main"] == ["MRPC", "STS-B", "MNLI-m", "Average"]
    for name, count in (("MRPC", 13), ("STS-B", 13), ("MNLI-m", 13), ("MNLI-mm", 13), ("AX", 7)):
        lines = (out / "submission" / f"{name}.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == count + 1
        assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(count)]
    assert {line.split("\t")[1] for line in (out / "submission" / "AX.tsv").read_text().splitlines()[1:]} <= set(
        glue.NLI)
    assert os.path.exists(out / "mnli" / "bert_mgpu.json")  # each task a run directory, resumable
    assert json.loads((out / "mrpc" / "bert_mgpu.json").read_text())["truncation"] == "head+tail"


def test_an_unknown_glue_task_is_one_line(tmp_path):
    proc = run_script("run_glue_mgpu.py", f"--glue_dir={tmp_path}", f"--init_checkpoint={tmp_path}",
                      f"--output_dir={tmp_path / 'o'}", "--tasks=mrpc,squad", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("run_glue_mgpu.py: error: --tasks: unknown squad")


@pytest.mark.parametrize("name", ["cola", "mrpc"])
def test_a_tab_inside_a_glue_text_is_refused_naming_the_line(tmp_path, name):
    """GLUE's readers take columns by position: a tab inside a text would cut it there, without a word."""
    d = write_task(str(tmp_path), name, n_train=20, n_dev=6, n_test=5)
    path = os.path.join(d, "train.tsv")
    lines = open(path, encoding="utf-8").read().splitlines(keepends=True)
    lines[4] = lines[4].rstrip("\n") + "\tcut here\n"
    open(path, "w", encoding="utf-8").writelines(lines)
    with pytest.raises(UserError, match=r"train.tsv:5: \d+ cells but the first row has \d+; a tab inside a text"):
        get_task(name).get_examples(d, "train")
