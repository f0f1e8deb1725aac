"""run_ner_mgpu.py end to end, as a user runs it: train with evaluation and the best model, evaluate,
predict the files people read, export and load back, and bad input in one line."""

import json
import os

import numpy as np
import pytest
from conftest import NER_TAGS, ROOT, learning_release, ner_sentences, run_script

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def run(*args, check=True):
    return run_script("run_ner_mgpu.py", *args, check=check)


def write_conll(path, sentences, tagged=True):
    """CoNLL-2003's layout: a -DOCSTART- line, a token a line with a POS column, a blank line between."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("-DOCSTART- -X- O\n\n")
        for s in sentences:
            for token, tag in zip(s.tokens, s.tags):
                f.write(f"{token} NN {tag}\n" if tagged else f"{token}\n")
            f.write("\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("ner")
    write_conll(d / "train.txt", ner_sentences(512, 3, 30))
    write_conll(d / "dev.txt", ner_sentences(40, 3, 14, seed=1, split="dev"))
    write_conll(d / "test.txt", ner_sentences(13, 15, 40, seed=2, split="test"), tagged=False)
    return str(d)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return learning_release(str(tmp_path_factory.mktemp("release")))


def common(data, release, out, *extra):
    return [f"--data_dir={data}", f"--init_checkpoint={release}", f"--output_dir={out}", "--n_gpus=0",
            "--towers_per_gpu=2", "--train_batch_size=16", "--eval_batch_size=4", "--predict_batch_size=4",
            "--max_seq_length=16", "--doc_stride=6", "--precision=float32", *extra]


@pytest.fixture(scope="module")
def trained(data, release, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("out"))
    args = common(data, release, out, "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=30",
                  "--learning_rate=5e-3", "--warmup_proportion=0.05", "--eval_every_steps=200",
                  "--load_best_model_at_end", "--do_export", "--export_format=hf,google,saved_model,onnx")
    return out, args, run(*args)


def test_predict_exported_writes_the_runs_files_from_its_onnx_export(trained, data, tmp_path):
    """predict_exported.py on the run's test.txt (sentences of 15-40 words in windows of 14 pieces, 6 apart)
    with the run's ONNX export, in a process that never loads TensorFlow: the run's own predict.txt and
    predictions.jsonl, byte for byte."""
    import subprocess
    import sys

    out, _, _ = trained
    done = subprocess.run([sys.executable, os.path.join(ROOT, "predict_exported.py"),
                           f"--model_dir={os.path.join(out, 'export', 'onnx')}",
                           f"--input_file={os.path.join(data, 'test.txt')}", f"--output_dir={tmp_path}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "predicted 13 sentences with" in done.stdout
    assert sorted(os.listdir(tmp_path)) == ["predict.txt", "predictions.jsonl"]  # the test file has no tags
    for name in ("predict.txt", "predictions.jsonl"):
        assert (tmp_path / name).read_text() == open(os.path.join(out, name)).read(), name


def test_train_evaluate_predict_and_export_write_what_people_read(trained, data):
    out, _, proc = trained
    results = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    assert float(results["eval_f1"]) > 0.95 and int(results["eval_examples"]) == 40, results
    assert float(results["report_PER_support"]) > 5 and 0 <= float(results["report_LOC_f1"]) <= 1
    history = open(os.path.join(out, "eval_history.tsv")).read().splitlines()
    assert history[0].split("\t")[:4] == ["step", "loss", "accuracy", "f1"] and len(history) >= 4
    assert os.path.exists(os.path.join(out, "best", "bert_mgpu.json"))
    assert "eval: entity f1" in proc.stdout and "predict: 13 sentences" in proc.stdout

    test_tokens = [line.split() for line in open(os.path.join(data, "test.txt")).read().split("\n\n")[1:]
                   if line.strip()]
    columns = open(os.path.join(out, "predict.txt")).read().split("\n\n")
    rows = [[line.split() for line in block.splitlines()] for block in columns if block.strip()]
    assert [[r[0] for r in row] for row in rows] == [[t for t in block] for block in test_tokens]
    assert all(len(r) == 2 and r[1] in NER_TAGS for row in rows for r in row)  # token, predicted tag
    found = [json.loads(line) for line in open(os.path.join(out, "predictions.jsonl"))]
    assert [f["id"] for f in found] == [f"test-{i}" for i in range(13)]
    from bert_mgpu.core.entities import entities

    for f, row in zip(found, rows):  # the predicted column's chunks, with their words and characters
        assert f["text"] == " ".join(r[0] for r in row)
        assert [(e["type"], e["token_start"], e["token_end"]) for e in f["entities"]] == entities([r[1] for r in row])
        for e in f["entities"]:
            assert e["text"] == " ".join(r[0] for r in row[e["token_start"]:e["token_end"]])
            assert f["text"][e["start"]:e["end"]] == e["text"]
    assert sum(len(f["entities"]) for f in found) > 13

    import bert_mgpu
    from bert_mgpu.data.tagged import read_tagged

    dev = read_tagged(os.path.join(data, "dev.txt"))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    for fmt in ("hf", "google", "saved_model"):  # each export loads back with its head and tags, to the same F1
        back = bert_mgpu.BertTagger.from_pretrained(os.path.join(out, "export", fmt), towers=towers,
                                                    max_seq_length=16, doc_stride=6)
        assert back.labels == NER_TAGS
        assert back.evaluate(dev)["eval_f1"] == pytest.approx(float(results["eval_f1"]), abs=1e-9), fmt


def test_run_distill_ner_teaches_a_student_of_one_layer_on_tagged_and_unlabelled_sentences(trained, data,
                                                                                            tmp_path):
    """run_distill_ner_mgpu.py: the trained 2-layer tagger teaches a student of its layer 1 on the training file
    and 40 untagged sentences, with the intermediate losses; the student's directory is a tagger run that keeps
    most of the teacher's F1."""
    teacher = os.path.join(trained[0], "best")  # the model eval_results.txt scores (--load_best_model_at_end)
    unlabelled = tmp_path / "unlabelled.txt"
    unlabelled.write_text("".join(" ".join(s.tokens) + "\n" for s in ner_sentences(40, 3, 14, seed=5)))
    out = str(tmp_path / "student")
    proc = run_script("run_distill_ner_mgpu.py", f"--data_dir={data}", f"--teacher={teacher}", "--teacher_layers=1",
                      f"--output_dir={out}", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=16",
                      "--eval_batch_size=4", "--predict_batch_size=4", "--max_seq_length=16", "--doc_stride=6",
                      "--precision=float32", "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=3",
                      "--learning_rate=5e-3", f"--unlabeled_file={unlabelled}", "--hidden_weight=0.1",
                      "--attention_weight=0.1", "--layer_map=0")
    got = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    want = dict(line.split(" = ") for line in open(os.path.join(trained[0], "eval_results.txt")).read().splitlines())
    assert float(got["eval_f1"]) >= float(want["eval_f1"]) - 0.15, (got, want)
    run = json.load(open(os.path.join(out, "bert_mgpu.json")))
    assert (run["kind"], run["bert_config"]["num_hidden_layers"], run["settings"]["teacher_layers"]) == (
        "tagger", 1, ["1"])
    assert run["settings"]["distillation"]["layer_map"] == [0]  # given: the intermediate losses from layer 0
    block = proc.stdout[proc.stdout.index("== run_distill_ner_mgpu.py =="):]
    assert "  unlabeled rows " in block and block.split("  unlabeled rows ")[1].split()[0] == "40"
    assert float(block.split("  teacher eval_f1 ")[1].split()[0]) == pytest.approx(float(want["eval_f1"]), abs=1e-4)
    assert len(open(os.path.join(out, "predict.txt")).read().split("\n\n")) >= 13


def test_the_hf_export_gives_transformers_the_same_logits(trained, reference):
    """The exported directory read by transformers' own BertForTokenClassification: logits to 1e-4."""
    import torch
    import transformers

    import bert_mgpu

    out = trained[0]
    ours = bert_mgpu.BertTagger.from_pretrained(os.path.join(out, "export", "hf"), max_seq_length=16,
                                                precision="float32")
    theirs = transformers.BertForTokenClassification.from_pretrained(os.path.join(out, "export", "hf")).eval()
    assert theirs.config.id2label == dict(enumerate(NER_TAGS))
    ids = np.array([[2, 12, 14, 19, 20, 11, 3, 0]], np.int32)
    mask = ids != 0
    a = ours.model({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}).numpy()
    with torch.no_grad():
        b = theirs(input_ids=torch.tensor(ids, dtype=torch.long),
                   attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    assert np.abs(a[mask] - b[mask]).max() < 1e-4


def test_a_rerun_of_the_finished_command_trains_nothing_and_writes_the_same(trained):
    out, args, _ = trained
    before = open(os.path.join(out, "eval_results.txt")).read()
    proc = run(*args)
    assert "export: hf" in proc.stdout and "already there" in proc.stdout
    assert open(os.path.join(out, "eval_results.txt")).read() == before


def test_a_tagged_test_set_is_scored_as_conlleval_scores_predict_txt(trained, data, tmp_path):
    """--do_predict on a test file with its tags: test_results.txt and the printed F1 are predict.txt's
    gold and predicted columns scored by entity. A byte that is not UTF-8 is read with --invalid_utf8=replace."""
    from bert_mgpu.core.entities import entity_scores

    out, _, _ = trained
    tagged = tmp_path / "data"
    tagged.mkdir()
    (tagged / "test.txt").write_bytes(open(os.path.join(data, "dev.txt"), "rb").read().replace(b" NN ", b"\xff NN ", 1))
    proc = run(f"--data_dir={tagged}", f"--init_checkpoint={out}", f"--output_dir={tmp_path / 'out'}", "--n_gpus=0",
               "--towers_per_gpu=2", "--predict_batch_size=4", "--max_seq_length=16", "--doc_stride=6", "--do_predict",
               "--invalid_utf8=replace")
    blocks = open(tmp_path / "out" / "predict.txt").read().split("\n\n")
    rows = [[line.split() for line in block.splitlines()] for block in blocks if block.strip()]
    assert len(rows) == 40 and all(len(r) == 3 for row in rows for r in row)  # token, gold, predicted
    assert rows[0][0][0].endswith("\ufffd")
    scores = entity_scores([[r[1] for r in row] for row in rows], [[r[2] for r in row] for row in rows])
    results = dict(line.split(" = ") for line in open(tmp_path / "out" / "test_results.txt").read().splitlines())
    assert float(results["test_f1"]) == pytest.approx(scores["f1"], abs=1e-12) and scores["f1"] > 0.9
    assert f"test: entity f1 {scores['f1']:.4f} (precision {scores['precision']:.4f}" in proc.stdout


@pytest.mark.parametrize("case", ["unknown_dev_tag", "unknown_test_tag", "bad_tag_map", "crf_saved_model",
                                  "no_train_file", "stride_too_long", "ragged_columns", "labels_twice"])
def test_bad_input_is_one_line_naming_file_and_line(case, data, release, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for name in ("train.txt", "dev.txt", "test.txt"):
        (d / name).write_text(open(os.path.join(data, name)).read())
    extra, expected = ["--do_train", "--do_eval"], None
    if case == "unknown_dev_tag":
        lines = (d / "dev.txt").read_text().splitlines()
        lines[3] = lines[3].rsplit(" ", 1)[0] + " B-ORG"
        (d / "dev.txt").write_text("\n".join(lines) + "\n")
        expected = f"{d}/dev.txt:4: tag 'B-ORG' is not one of the training tags (O, B-LOC, B-PER, I-PER)"
    elif case == "unknown_test_tag":  # a test file with gold tags; was "test-0: ...", no file or line
        lines = (d / "dev.txt").read_text().splitlines()
        lines[3] = lines[3].rsplit(" ", 1)[0] + " B-ORG"
        (d / "test.txt").write_text("\n".join(lines) + "\n")
        extra = ["--do_train", "--do_predict"]
        expected = f"{d}/test.txt:4: tag 'B-ORG' is not one of the training tags (O, B-LOC, B-PER, I-PER)"
    elif case == "bad_tag_map":
        extra.append("--tag_map=nr:PER")
        expected = "--tag_map: 'nr:PER' is not pos=TYPE (as nr=PER)"
    elif case == "crf_saved_model":
        extra += ["--crf", "--do_export", "--export_format=hf"]
        expected = "--crf --export_format=hf: transformers' BertForTokenClassification has no CRF"
    elif case == "no_train_file":
        os.remove(d / "train.txt")
        expected = f"--data_dir={d}: no train file"
    elif case == "stride_too_long":
        extra.append("--doc_stride=14")
        expected = "--doc_stride=14: must be above 0 and below the 14 pieces a window holds"
    elif case == "labels_twice":  # was a 5-way head for 4 tags
        extra.append("--labels=O,B-LOC,B-PER,I-PER,B-PER")
        expected = "--labels names B-PER more than once: O,B-LOC,B-PER,I-PER,B-PER"
    elif case == "ragged_columns":
        lines = (d / "train.txt").read_text().splitlines()
        lines[5] += " extra"
        (d / "train.txt").write_text("\n".join(lines) + "\n")
        expected = f"{d}/train.txt:6: 4 columns but line 3 has 3"
    out = tmp_path / "out"
    proc = run(*common(str(d), release, str(out)), *extra, check=False)  # a later flag wins
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run_ner_mgpu.py: error: ") and expected in last, proc.stderr
    assert not os.path.exists(out / "checkpoint")  # nothing trained


def test_a_crf_runs_formats_are_all_checked_before_the_first_is_written(data, google_release, tmp_path):
    """Predicting from a CRF run (no --crf given: the run's own) with --export_format=saved_model,hf: hf
    cannot hold a CRF, so nothing is exported; it used to write the SavedModel, then fail."""
    out = tmp_path / "out"
    run(*common(data, google_release, str(out)), "--do_train", "--crf", "--num_train_epochs=0.05")
    proc = run(*common(data, google_release, str(out)), f"--init_checkpoint={out}", "--do_predict", "--do_export",
               "--export_format=saved_model,hf", check=False)  # a later flag wins
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        "run_ner_mgpu.py: error: --crf: transformers' BertForTokenClassification has no CRF; export the model as "
        "google or saved_model")
    assert not os.path.exists(out / "export" / "saved_model") and not os.path.exists(out / "export" / "hf")


@pytest.mark.process
def test_kill_9_mid_run_then_rerun_ends_bit_identical_to_the_uninterrupted_run(tmp_path, google_release):
    """The tagger's windows come back in the same order after a resume: its batches skip what was seen."""
    from test_crash_resume import killed_then_resumed

    d = tmp_path / "data"
    d.mkdir()
    write_conll(d / "train.txt", ner_sentences(96, 3, 30))
    write_conll(d / "dev.txt", ner_sentences(8, 3, 14, seed=1, split="dev"))

    def args(out):
        return [*common(str(d), google_release, out), "--do_train", "--do_eval", "--train_batch_size=4",
                "--num_train_epochs=1", "--save_checkpoints_steps=4", "--deterministic", "--learning_rate=1e-3"]

    killed_then_resumed("run_ner_mgpu.py", args, tmp_path, run)


@pytest.mark.parametrize("actions, watch_flags, splits", [
    (dict(do_train=True), dict(evaluation_strategy="no", eval_every_steps=None), ("train",)),
    (dict(do_train=True), dict(evaluation_strategy="epoch", eval_every_steps=None), ("train", "dev")),
    (dict(do_train=True), dict(evaluation_strategy="no", eval_every_steps=50), ("train", "dev")),
    (dict(do_eval=True, do_predict=True), dict(evaluation_strategy="epoch", eval_every_steps=50), ("dev", "test")),
    (dict(do_predict=True), dict(evaluation_strategy="no", eval_every_steps=None), ("test",)),
])
def test_each_head_script_reads_the_splits_its_actions_need(actions, watch_flags, splits):
    """cli.fine_tuning.wanted, every head script's: dev is read to evaluate or to watch a training, never to
    watch one that is not asked."""
    from types import SimpleNamespace

    from bert_mgpu.cli import fine_tuning

    f = SimpleNamespace(**{"do_train": False, "do_eval": False, "do_predict": False, **actions, **watch_flags})
    assert fine_tuning.wanted(f) == splits
    assert fine_tuning.watching(f) == (f.do_train and "dev" in splits)
    f.tag_map = ["nr=PER", " ns = LOC "]
    assert fine_tuning.tag_map(f) == {"nr": "PER", "ns": "LOC"}
