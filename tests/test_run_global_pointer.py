"""run_global_pointer_mgpu.py end to end, as a user runs it: a GlobalPointer learns nested entities in windows
with evaluation and the best model, predicts the files people read, exports and loads back, and bad input
ends in one line."""

import json
import os

import pytest
from conftest import ROOT, learning_release, ner_sentences, run_script

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

TYPES = ["LOC", "PER", "ROLE"]


def run(*args, check=True):
    return run_script("run_global_pointer_mgpu.py", *args, check=check)


def nested(sentences):
    """ner_sentences' entities as spans, and inside each person of two words its second word, a ROLE: the
    nested entity a tagger cannot give."""
    from bert_mgpu.core.entities import entities

    out = []
    for s in sentences:
        found = [{"type": k, "start": a, "end": b} for k, a, b in entities(s.tags)]
        found += [{"type": "ROLE", "start": e["end"] - 1, "end": e["end"]} for e in found
                  if e["type"] == "PER" and e["end"] - e["start"] > 1]
        out.append({"tokens": s.tokens, "entities": found})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("spans")
    write_jsonl(d / "train.json", nested(ner_sentences(512, 3, 30)))
    write_jsonl(d / "dev.json", nested(ner_sentences(40, 3, 14, seed=1, split="dev")))
    write_jsonl(d / "test.json", nested(ner_sentences(13, 15, 40, seed=2, split="test")))  # in windows
    return str(d)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return learning_release(str(tmp_path_factory.mktemp("release")))


def common(data, release, out, *extra):
    return [f"--data_dir={data}", f"--init_checkpoint={release}", f"--output_dir={out}", "--n_gpus=0",
            "--towers_per_gpu=2", "--train_batch_size=16", "--eval_batch_size=4", "--predict_batch_size=4",
            "--max_seq_length=16", "--doc_stride=6", "--head_size=16", "--precision=float32", *extra]


@pytest.fixture(scope="module")
def trained(data, release, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("out"))
    args = common(data, release, out, "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=24",
                  "--learning_rate=5e-3", "--warmup_proportion=0.05", "--eval_every_steps=200",
                  "--load_best_model_at_end", "--do_export", "--export_format=google,onnx,onnx_int8")
    return out, args, run(*args)


def test_nested_entities_are_learnt_predicted_in_windows_exported_and_loaded_back(trained, data):
    out, _, proc = trained
    results = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    assert float(results["eval_f1"]) > 0.9 and int(results["eval_examples"]) == 40, results
    history = open(os.path.join(out, "eval_history.tsv")).read().splitlines()
    assert history[0].split("\t")[:2] == ["step", "loss"] and len(history) >= 4
    run_file = json.load(open(os.path.join(out, "best", "bert_mgpu.json")))
    assert run_file["kind"] == "global_pointer" and run_file["labels"] == TYPES and run_file["head_size"] == 16
    assert "eval: entity f1" in proc.stdout and "predict: 13 sentences" in proc.stdout

    tested = dict(line.split(" = ") for line in open(os.path.join(out, "test_results.txt")).read().splitlines())
    assert float(tested["test_f1"]) > 0.9, tested  # 15-40 words a sentence, windows of 14 pieces
    found = [json.loads(line) for line in open(os.path.join(out, "predictions.jsonl"))]
    want = [json.loads(line) for line in open(os.path.join(data, "test.json"))]
    assert [f["id"] for f in found] == [f"test-{i}" for i in range(13)]
    assert [f["tokens"] for f in found] == [w["tokens"] for w in want]
    for f in found:
        for e in f["entities"]:
            assert e["text"] == " ".join(f["tokens"][e["start"]:e["end"]]) and e["type"] in TYPES
    # The nested entity a tagger cannot give: the test's roles found, each inside the person found around it.
    # (A stray role elsewhere is possible at F1 0.9: on an AVX2-only CPU the run finds all 3 and 2 more.)
    gold = {(i, e["start"], e["end"]) for i, w in enumerate(want) for e in w["entities"] if e["type"] == "ROLE"}
    inside = {(i, e["start"], e["end"]) for i, f in enumerate(found) for e in f["entities"] if e["type"] == "ROLE"
              and any(p["type"] == "PER" and p["start"] < e["start"] and p["end"] == e["end"] for p in f["entities"])}
    assert len(gold) >= 3 and len(gold & inside) >= 2 * len(gold) / 3, (gold, inside)

    import bert_mgpu

    dev = bert_mgpu.read_spans(os.path.join(data, "dev.json"))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    for source in (os.path.join(out, "best"), os.path.join(out, "export", "google")):  # the model evaluated
        back = bert_mgpu.BertGlobalPointer.from_pretrained(source, towers=towers, max_seq_length=16, doc_stride=6,
                                                           precision="float32")
        assert back.labels == TYPES and back.head_size == 16
        assert back.evaluate(dev)["eval_f1"] == pytest.approx(float(results["eval_f1"]), abs=1e-9), source
    entities = back.predict_entities([w["tokens"] for w in want])
    assert [[list(e) for e in row] for row in entities] == [[[e["type"], e["start"], e["end"]] for e in f["entities"]]
                                                            for f in found]
    text = "the film good the actor story"
    assert [(e["type"], e["text"], e["start"], e["end"]) for e in back.predict([text])[0]] == [
        ("LOC", "film", 4, 8), ("PER", "actor story", 18, 29), ("ROLE", "story", 24, 29)]


def test_its_onnx_exports_predict_the_runs_entities_without_tensorflow(trained, data, tmp_path):
    """predict_exported.py on the run's test.json (sentences of 15-40 words in windows of 14 pieces, 6 apart)
    with the run's ONNX export, in a process that never imports TensorFlow: the run's own predictions.jsonl
    and test_results.txt, byte for byte. The int8 export: the same entities but for a few."""
    import subprocess
    import sys

    out, _, _ = trained
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('tensorflow imported:', 'tensorflow' in sys.modules))\n"
            f"sys.argv = ['predict_exported.py', '--model_dir={os.path.join(out, 'export', 'onnx')}', "
            f"'--input_file={os.path.join(data, 'test.json')}', '--output_dir={tmp_path}']\n"
            f"runpy.run_path({os.path.join(ROOT, 'predict_exported.py')!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "predicted 13 sentences with" in done.stdout and "tensorflow imported: False" in done.stdout
    assert sorted(os.listdir(tmp_path)) == ["predictions.jsonl", "test_results.txt"]
    for name in ("predictions.jsonl", "test_results.txt"):
        assert (tmp_path / name).read_text() == open(os.path.join(out, name)).read(), name

    import bert_mgpu

    want = [[(e["type"], e["start"], e["end"]) for e in json.loads(line)["entities"]]
            for line in open(os.path.join(out, "predictions.jsonl"))]
    tokens = [json.loads(line)["tokens"] for line in open(os.path.join(data, "test.json"))]
    served = bert_mgpu.load_exported(os.path.join(out, "export", "onnx"))
    assert type(served).__name__ == "ExportedGlobalPointer" and served.predict_entities(tokens, 4) == want
    text = "the film good the actor story"
    assert served.predict([text, ""]) == bert_mgpu.BertGlobalPointer.from_pretrained(
        os.path.join(out, "best"), towers=bert_mgpu.Towers(n_gpus=0), precision="float32").predict([text, ""])
    int8 = bert_mgpu.load_exported(os.path.join(out, "export", "onnx_int8")).predict_entities(tokens, 4)
    same = sum(len(set(a) & set(b)) for a, b in zip(int8, want))
    assert same >= 0.9 * sum(len(w) for w in want), (int8, want)


def test_a_rerun_of_the_finished_command_trains_nothing_and_writes_the_same(trained):
    out, args, _ = trained
    before = open(os.path.join(out, "eval_results.txt")).read()
    proc = run(*args)
    assert "export: google" in proc.stdout and "already there" in proc.stdout
    assert open(os.path.join(out, "eval_results.txt")).read() == before


@pytest.mark.parametrize("case", ["unknown_dev_type", "hf_export", "crf", "entity_outside", "no_entities",
                                  "bad_tag_map"])
def test_bad_input_is_one_line_naming_file_and_line(case, data, release, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    rows = {name: [json.loads(line) for line in open(os.path.join(data, name))] for name in ("train.json", "dev.json")}
    extra, expected = ["--do_train", "--do_eval"], None
    if case == "unknown_dev_type":
        rows["dev.json"][2]["entities"].append({"type": "ORG", "start": 0, "end": 1})
        expected = f"{d}/dev.json:3: entity type 'ORG' is not one of the model's (LOC, PER, ROLE)"
    elif case == "hf_export":
        extra += ["--do_export", "--export_format=hf"]
        expected = "--export_format=hf: run_global_pointer_mgpu.py exports google"
    elif case == "crf":
        extra.append("--crf")
        expected = "--crf: a GlobalPointer scores spans, not tag sequences"
    elif case == "entity_outside":
        rows["train.json"][4]["entities"].append({"type": "PER", "start": 1, "end": 99})
        expected = f"{d}/train.json:5: PER entity [1, 99) is outside the"
    elif case == "no_entities":
        del rows["dev.json"][0]["entities"]
        rows["dev.json"] = rows["dev.json"][:1]
        expected = f"{d}/dev.json: has no entities"
    elif case == "bad_tag_map":  # read before the towers, as run_ner_mgpu.py does
        extra.append("--tag_map=nr:PER")
        expected = "--tag_map: 'nr:PER' is not pos=TYPE (as nr=PER)"
    for name, values in rows.items():
        write_jsonl(d / name, values)
    out = tmp_path / "out"
    proc = run(*common(str(d), release, str(out)), *extra, check=False)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run_global_pointer_mgpu.py: error: ") and expected in last, proc.stderr
    assert not os.path.exists(out / "checkpoint")  # nothing trained
