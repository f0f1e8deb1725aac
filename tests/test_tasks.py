import json

import pytest
from conftest import write_tsv

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.tasks import get_task


def test_mrpc_cola_sst2_read_the_glue_layouts(tmp_path):
    d = tmp_path
    write_tsv(d / "train.tsv", [("1", "a1", "b1", "The cat sat.", "A cat sat."), ("0", "a2", "b2", "X", "Y")],
              header=("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"))
    mrpc = get_task("mrpc").get_examples(str(d), "train")
    assert [(e.text_a, e.text_b, e.label) for e in mrpc] == [("The cat sat.", "A cat sat.", "1"), ("X", "Y", "0")]
    write_tsv(d / "dev.tsv", [("gj04", "1", "", "Our friends won't buy it."), ("gj04", "0", "*", "They drank.")],
              header=None)
    cola = get_task("cola").get_examples(str(d), "dev")
    assert [(e.text_a, e.label) for e in cola] == [("Our friends won't buy it.", "1"), ("They drank.", "0")]
    write_tsv(d / "test.tsv", [("0", "a sentence"), ("1", "another")], header=("index", "sentence"))
    sst = get_task("sst-2").get_examples(str(d), "test")
    assert [(e.guid, e.text_a, e.label) for e in sst] == [("test-0", "a sentence", None), ("test-1", "another", None)]


def test_generic_tsv_by_column_names_and_labels_from_training_data(tmp_path):
    write_tsv(tmp_path / "train.tsv", [("rotten", "meh", "m1"), ("fresh", "great", "m2"), ("fresh", "ok", "m3")],
              header=("label", "text", "movie"))
    task = get_task("tsv", text_column="text", label_column="label")
    assert task.get_labels(str(tmp_path)) == ["fresh", "rotten"]
    assert [e.text_a for e in task.get_examples(str(tmp_path), "train")] == ["meh", "great", "ok"]


def test_csv_with_quotes_and_pairs(tmp_path):
    (tmp_path / "dev.csv").write_text('q,p,y\n"a, b","c ""d""",yes\nx,y,no\n', encoding="utf-8")
    task = get_task("csv", text_column="q", text_b_column="p", label_column="y", labels=["no", "yes"])
    ex = task.get_examples(str(tmp_path), "dev")
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [("a, b", 'c "d"', "yes"), ("x", "y", "no")]


def test_malformed_row_names_file_and_line(tmp_path):
    write_tsv(tmp_path / "train.tsv", [("1", "a", "b", "s1", "s2"), ("0", "only-two")],
              header=("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"))
    with pytest.raises(UserError, match=r"train.tsv:3: expected at least 4 columns, found 2"):
        get_task("mrpc").get_examples(str(tmp_path), "train")


def test_label_outside_the_label_set(tmp_path):
    write_tsv(tmp_path / "dev.tsv", [("pos", "fine"), ("meh", "hmm")])
    with pytest.raises(UserError, match=r"dev.tsv:3: label 'meh' is not one of neg, pos"):
        get_task("tsv", labels=["neg", "pos"]).get_examples(str(tmp_path), "dev")


def test_missing_file_missing_column_unknown_task(tmp_path):
    with pytest.raises(UserError, match=r"train.tsv: file not found"):
        get_task("sst-2").get_examples(str(tmp_path), "train")
    write_tsv(tmp_path / "train.tsv", [("1", "x")], header=("y", "sentence"))
    with pytest.raises(UserError, match=r"train.tsv:1: no column 'text' in header"):
        get_task("tsv").get_examples(str(tmp_path), "train")
    with pytest.raises(UserError, match="--task_name=qqq is unknown"):
        get_task("qqq")


def test_xnli_filters_language_and_maps_contradictory(tmp_path):
    (tmp_path / "multinli").mkdir()
    write_tsv(tmp_path / "multinli" / "multinli.train.zh.tsv", [("前提", "假设", "contradictory")],
              header=("premise", "hypo", "label"))
    dev = [("zh", "neutral") + ("",) * 4 + ("句子一", "句子二"), ("de", "entailment") + ("",) * 4 + ("a", "b")]
    write_tsv(tmp_path / "xnli.dev.tsv", dev, header=("language", "gold_label") + ("x",) * 4 + ("s1", "s2"))
    task = get_task("xnli")
    assert [e.label for e in task.get_examples(str(tmp_path), "train")] == ["contradiction"]
    assert [(e.text_a, e.label) for e in task.get_examples(str(tmp_path), "dev")] == [("句子一", "neutral")]


def test_tfds_never_downloads(tmp_path):
    with pytest.raises(UserError, match="is not prepared in .*never downloads"):
        get_task("tfds", tfds_name="imdb_reviews", tfds_data_dir=str(tmp_path)).get_examples(str(tmp_path), "train")


def test_tfds_dataset_by_name_from_local_data(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=7):
        task = get_task("tfds", tfds_name="imdb_reviews", tfds_data_dir=str(tmp_path),
                        tfds_splits=("train", "test", "test"))
        assert task.get_labels() == ["neg", "pos"]
        examples = task.get_examples(None, "dev")  # dev is read from the split named for it
    assert len(examples) == 7
    assert all(isinstance(e.text_a, str) and e.label in ("neg", "pos") for e in examples)


def test_invalid_utf8_replaced_and_counted_by_flag(tmp_path, caplog):
    import logging

    (tmp_path / "train.tsv").write_bytes(b"label\ttext\npos\tgood \xff film\nneg\tbad\npos\tfine \xc3(\n")
    with pytest.raises(UserError, match=r"train.tsv:2: invalid UTF-8 at byte 10 of the line"):
        get_task("tsv").get_examples(str(tmp_path), "train")
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        examples = get_task("tsv", invalid_utf8="replace").get_examples(str(tmp_path), "train")
    assert [e.text_a for e in examples] == ["good \ufffd film", "bad", "fine \ufffd("]
    assert "invalid UTF-8 replaced by U+FFFD on 2 line(s), the first at line 2" in caplog.text


def test_nul_quote_and_empty_text_name_the_line(tmp_path):
    cases = {"nul": (b"label\ttext\npos\tok\nneg\tb\x00d\n", "tsv", r"train.tsv:3: NUL byte at column 6"),
             "quote": (b'label,text\npos,"never closed\nneg,bad\n', "csv",
                       r"train.csv:2: a quote opened on this line never closes"),
             "empty": (b"label\ttext\npos\t\n", "tsv", r"train.tsv:2: empty text in column 2")}
    for name, (data, kind, message) in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / f"train.{kind}").write_bytes(data)
        with pytest.raises(UserError, match=message):
            get_task(kind).get_examples(str(d), "train")


def test_tfds_task_reads_nothing_before_the_towers_are_set_up(tmp_path):
    """tfds builds tf.data, which starts TensorFlow with one CPU device; the script sets up its 2 logical
    CPU towers first, so the run gets as far as the (unprepared) dataset and says that in one line."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "run_classifier_mgpu.py"), "--task_name=tfds", "--tfds_name=imdb_reviews",
         f"--tfds_data_dir={tmp_path}", f"--data_dir={tmp_path}", f"--output_dir={tmp_path / 'out'}", "--do_train",
         "--n_gpus=0", "--towers_per_gpu=2", "--init_checkpoint=none"],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 1, proc.stderr[-1500:]
    lines = proc.stderr.strip().splitlines()
    plan = next(i for i, line in enumerate(lines) if "device plan: 2 tower(s) on CPU" in line)
    assert lines[plan + 1:plan + 3] == ["  tower 0: /cpu:0 (host CPU)", "  tower 1: /cpu:1 (host CPU)"]
    first_tfds = next(i for i, line in enumerate(lines) if "imdb_reviews" in line)
    assert plan < first_tfds  # tfds (and the TensorFlow it starts) came after the two towers were set up
    assert lines[-1].startswith(
        f"run_classifier_mgpu.py: error: tfds dataset 'imdb_reviews' is not prepared in {tmp_path} "), lines[-1]
    assert lines[-1].endswith("bert_mgpu never downloads: prepare it with `tfds build` first")
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing downloaded or prepared beside the run's directory


def test_notebook_inputs_become_examples():
    import pandas as pd

    from bert_mgpu.data.examples import Example, as_examples

    assert as_examples("great film") == [Example("0", "great film")]
    assert as_examples(["great film", ("A man eats.", "Someone eats.")]) == [
        Example("0", "great film"), Example("1", "A man eats.", "Someone eats.")]
    kept = Example("x", "dull", label="neg")
    assert as_examples([kept]) == [kept]
    frame = pd.DataFrame({"sentence": ["great film", "dull plot"], "label": ["pos", "neg"]}, index=[10, 11])
    assert as_examples(frame) == [Example("10", "great film", label="pos"), Example("11", "dull plot", label="neg")]
    pairs = pd.DataFrame({"q": ["a?"], "p": ["b."]})
    assert as_examples(pairs, text_column="q", text_b_column="p") == [Example("0", "a?", "b.")]
    with pytest.raises(UserError, match=r"^input 1: expected an Example, a string or a \(text_a, text_b\) pair "
                                        r"of strings, not int$"):
        as_examples(["fine", 3])
    with pytest.raises(UserError, match=r"^the DataFrame has no text column text, text_a or sentence \(its "
                                        r"columns: q, p\)$"):
        as_examples(pairs)
    # pandas' missing values: a text is refused naming its row (it would be predicted as "nan"); a label
    # left out means an unlabelled row
    holes = pd.DataFrame({"text": ["fine", None, float("nan")], "label": ["pos", float("nan"), None]}, index=[7, 8, 9])
    with pytest.raises(UserError, match=r"^DataFrame row 8: no text in column 'text' \(None or NaN\)$"):
        as_examples(holes)
    assert as_examples(holes.iloc[:1]) == [Example("7", "fine", label="pos")]
    assert as_examples(pd.DataFrame({"text": ["a"], "label": [float("nan")]}))[0].label is None


def test_headerless_tsv_by_column_number(tmp_path):
    """bert-ad's `label<TAB>text` files: columns by number (0 = first), no header row."""
    (tmp_path / "train.tsv").write_text("体育\t姚明加盟火箭\n财经\t股市大涨\n")
    (tmp_path / "test.tsv").write_text("今天下雨\n")
    task = get_task("tsv", text_column="1", label_column="0")
    train = task.get_examples(str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in train] == [("姚明加盟火箭", "体育"), ("股市大涨", "财经")]
    test = get_task("tsv", text_column="0", label_column="1").get_examples(str(tmp_path), "test")
    assert [(e.text_a, e.label) for e in test] == [("今天下雨", None)]  # a test file without the label column
    (tmp_path / "dev.tsv").write_text("体育\t姚明\n财经\n")
    with pytest.raises(UserError, match=r"dev.tsv:2: expected at least 2 columns, found 1"):
        task.get_examples(str(tmp_path), "dev")
    with pytest.raises(UserError, match=r"all names \(a header row\) or all numbers \(no header\), not both"):
        get_task("tsv", text_column="1", label_column="label")


def test_json_lines_as_clue_writes_them(tmp_path):
    rows = [{"sentence1": "花呗如何还款", "sentence2": "花呗怎么还钱", "label": "1"},
            {"sentence1": "借呗额度", "sentence2": "今天天气", "label": 0}]
    (tmp_path / "train.json").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    task = get_task("jsonl", text_column="sentence1", text_b_column="sentence2")
    train = task.get_examples(str(tmp_path), "train")
    assert [(e.text_a, e.text_b, e.label) for e in train] == [("花呗如何还款", "花呗怎么还钱", "1"),
                                                              ("借呗额度", "今天天气", "0")]
    (tmp_path / "test.jsonl").write_text('{"id": 0, "sentence": "好看"}\n')
    assert get_task("jsonl").get_examples(str(tmp_path), "test")[0].text_a == "好看"  # CLUE's key by default
    (tmp_path / "dev.jsonl").write_text('{"sentence1": "a", "sentence2": "b", "label": "1"}\n{"sentence1": "a",\n')
    with pytest.raises(UserError, match=r"dev.jsonl:2: not a JSON object \(Expecting property name enclosed in "
                                        r"double quotes at column 19\)"):
        task.get_examples(str(tmp_path), "dev")
    (tmp_path / "dev.jsonl").write_text('{"sentence1": "a", "label": "1"}\n')
    with pytest.raises(UserError, match=r"dev.jsonl:1: no key 'sentence2' \(its keys: sentence1, label\)"):
        task.get_examples(str(tmp_path), "dev")


def test_csv_with_quoted_fields_and_newlines_inside(tmp_path):
    (tmp_path / "train.csv").write_text('text,label\n"a film, long\nand dull",neg\n"say ""yes""",pos\nfun,pos\n')
    train = get_task("csv").get_examples(str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in train] == [("a film, long\nand dull", "neg"), ('say "yes"', "pos"),
                                                    ("fun", "pos")]
    (tmp_path / "dev.csv").write_text('text,label\n"ok",pos\n"never closed,neg\n')
    with pytest.raises(UserError, match=r"dev.csv:3: a quote opened on this line never closes"):
        get_task("csv").get_examples(str(tmp_path), "dev")


def test_predict_txt_holds_labels_or_their_index(tmp_path):
    import numpy as np

    from bert_mgpu.model.objectives import objective

    p = np.array([[0.1, 0.9], [0.8, 0.2]])
    reader = objective("classification").read_as(label_names=["neg", "pos"])
    files = reader.prediction_files(p, ["a", "b"])  # the rows' ids stand for the rows
    assert files["predict.txt"] == "pos\nneg\n"
    assert files["predictions.tsv"] == "id\tlabel\tp_neg\tp_pos\na\tpos\t0.10000000\t0.90000000\n" \
        "b\tneg\t0.80000000\t0.20000000\n"
    files = reader.read_as(predict_format="index").prediction_files(p, ["a", "b"])
    assert files["predict.txt"] == "1\n0\n"


def test_labels_are_taken_as_meant_not_verbatim(tmp_path):
    """Issue 33, item 8: `fresh ` is `fresh`; an empty label cell, a label listed twice in --labels, a text
    column that is the label column, and a header row under numbered columns are refused in one line."""
    rows = [("fresh ", "a fine film"), ("rotten", "a dull plot"), ("fresh", "great fun")]
    (tmp_path / "train.tsv").write_text("label\ttext\n" + "".join(f"{y}\t{t}\n" for y, t in rows))
    task = get_task("tsv")
    assert [e.label for e in task.get_examples(str(tmp_path), "train")] == ["fresh", "rotten", "fresh"]
    assert task.get_labels(str(tmp_path)) == ["fresh", "rotten"]
    (tmp_path / "dev.tsv").write_text("label\ttext\nfresh\tok\n\tno label here\n")
    with pytest.raises(UserError, match=r"dev.tsv:3: empty label in column 1$"):
        get_task("tsv").get_examples(str(tmp_path), "dev")
    with pytest.raises(UserError, match=r"^--labels=fresh,fresh ,rotten: 'fresh' is listed twice$"):
        get_task("tsv", labels=["fresh", "fresh ", "rotten"])
    assert get_task("tsv", labels=[" fresh", "rotten"]).get_labels() == ["fresh", "rotten"]
    with pytest.raises(UserError, match=r"^--label_column=label is also a text column"):
        get_task("tsv", text_column="label", label_column="label")
    # columns by number mean no header: a first row whose label no other row has is one
    numbered = tmp_path / "numbered"
    numbered.mkdir()
    (numbered / "train.tsv").write_text("label\ttext\n" + "".join(f"{'pos' if i % 2 else 'neg'}\ttext {i}\n"
                                                                   for i in range(12)))
    with pytest.raises(UserError, match=r"train.tsv:1: looks like a header row \(label 'label' is in no other row\)"):
        get_task("tsv", text_column="1", label_column="0").get_examples(str(numbered), "train")
    (numbered / "train.tsv").write_text("".join(f"{'pos' if i % 2 else 'neg'}\ttext {i}\n" for i in range(12)))
    assert len(get_task("tsv", text_column="1", label_column="0").get_examples(str(numbered), "train")) == 12


def test_a_document_longer_than_csvs_field_limit_is_read(tmp_path):
    """csv's default field limit is 128 KiB; a long document (a manual page of 200,000 characters) is a row."""
    long = "word " * 40000
    (tmp_path / "train.tsv").write_text(f"label\ttext\n3\t{long}\n2\tshort\n")
    train = get_task("tsv").get_examples(str(tmp_path), "train")
    assert [(len(e.text_a), e.label) for e in train] == [(len(long), "3"), (5, "2")]
