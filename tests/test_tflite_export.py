"""LiteRT export (issue 68 item 4): every head's graph, int8 weights, run by LiteRT's own interpreter
(`ai-edge-litert`) close to the model's outputs, at other batch sizes and lengths than it was checked on."""

import json
import os

import numpy as np
import pytest
from conftest import NER_TAGS
from export_heads import TEXTS, expected_outputs, export_each, head_rows

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import onnx_export

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

litert = pytest.importorskip("ai_edge_litert.interpreter")  # the tflite extra; `make test` installs it
KINDS = ["classification", "regression", "multi_label", "tagger_crf", "question_answerer", "multiple_choice",
         "encoder"]
INT8 = 0.05  # int8 weights: the tolerance of the onnx_int8 test (test_onnx_export.py)


@pytest.fixture(scope="module")
def exported(google_release, tmp_path_factory):
    return export_each(google_release, tmp_path_factory, "tflite")


def _interpreter(path):
    return litert.Interpreter(model_path=os.path.join(path, "model.tflite"))


@pytest.mark.parametrize("kind", KINDS)
def test_litert_runs_each_heads_graph_with_int8_weights(exported, kind):
    """The interpreter's outputs for 12 texts (not the export's probe batch) within int8's distance of the
    model's, and not equal to them: the weights are quantized. Every dense kernel of every layer is int8."""
    model, path = exported[kind]
    facts = json.load(open(os.path.join(path, onnx_export.FACTS)))
    assert facts["weights"] == "int8 (dynamic range)" and facts["signature"] == "serving_default"
    assert 0 < facts["max_difference_to_tensorflow"] < INT8
    interpreter = _interpreter(path)
    signature = interpreter.get_signature_list()["serving_default"]
    assert sorted(signature["inputs"]) == sorted(onnx_export.INPUTS) and signature["outputs"] == facts["outputs"]
    int8 = [t for t in interpreter.get_tensor_details() if t["dtype"] == np.int8 and len(t["shape"]) == 2]
    assert len(int8) >= 6 * model.config.num_hidden_layers, [t["name"] for t in int8]
    rows = head_rows(model, kind, length=12)
    got = interpreter.get_signature_runner("serving_default")(**rows)
    pairs = expected_outputs(model, kind, rows)
    for name, value in pairs:
        assert got[name].shape == value.shape, name
        difference = np.max(np.abs(got[name] - value))
        assert 0 < difference < INT8, (name, difference)
    if kind == "multiple_choice":
        assert got["logits"][2, 3] == pytest.approx(-1e4)  # a padded choice is never chosen
    if kind == "classification":  # the softmax of its own logits, as the SavedModel's
        p = np.exp(got["logits"]) / np.exp(got["logits"]).sum(1, keepdims=True)
        np.testing.assert_allclose(got["probabilities"], p, atol=1e-6)
    if kind == "tagger_crf":
        np.testing.assert_allclose(facts["crf_transitions"], model.model.crf.transitions.numpy(), atol=1e-7)
        config = json.load(open(os.path.join(path, "config.json")))
        assert config["id2label"] == {str(i): t for i, t in enumerate(NER_TAGS)}
    assert sorted(os.listdir(path)) == ["bert_mgpu.json", "config.json", "model.tflite", "tokenizer.json",
                                        "vocab.txt"]


def test_the_scripts_tflite_export_gives_its_test_results(classifier_run):
    """run_classifier_mgpu.py --export_format=tflite (the session's classifier run): the test set's raw texts
    through the export's tokenizer.json and LiteRT give the run's own test_results.tsv to int8's distance,
    and its labels where the model is not near a tie."""
    from bert_mgpu.io.exported import onnx_inputs, read_tokenizer

    out = classifier_run.out
    path = os.path.join(out, "export", "tflite")
    texts = [line.split("\t")[1] for line in open(os.path.join(out, "..", "data", "test.tsv")).read().splitlines()[1:]]
    got = _interpreter(path).get_signature_runner("serving_default")(**onnx_inputs(read_tokenizer(path), texts))
    want = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    assert len(texts) == 13 and got["probabilities"].shape == want.shape
    np.testing.assert_allclose(got["probabilities"], want, atol=0.02)
    sure = np.abs(want[:, 1] - want[:, 0]) > 0.1
    labels = np.array(open(os.path.join(out, "predict.txt")).read().split())
    assert sure.sum() >= 10 and (np.array(["neg", "pos"])[got["probabilities"].argmax(1)] == labels)[sure].all()


def test_a_missing_tflite_extra_is_one_line(monkeypatch):
    real = onnx_export.importlib.util.find_spec
    monkeypatch.setattr(onnx_export.importlib.util, "find_spec", lambda m: None if m == "ai_edge_litert" else real(m))
    with pytest.raises(UserError, match=r"--export_format=tflite: needs ai_edge_litert; pip install "
                                        r"'bert_mgpu\[tflite\]'"):
        onnx_export.check_available("tflite")


def test_predict_exported_writes_the_runs_prediction_files_from_each_export(classifier_run, tmp_path):
    """predict_exported.py on the run's test.tsv, from its onnx and its tflite export: the run's own
    predictions.tsv (ids, labels, probabilities: ONNX to the file's 8 decimals, LiteRT to int8's distance) and
    predict.txt, in a process that never loads TensorFlow; bad input is one line."""
    import subprocess
    import sys

    from conftest import ROOT

    out = classifier_run.out
    test = os.path.join(out, "..", "data", "test.tsv")
    want = [line.split("\t") for line in open(os.path.join(out, "predictions.tsv")).read().splitlines()]
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; "
            "exec('try:\\n runpy.run_path(sys.argv[0], run_name=\"__main__\")\\nfinally:\\n"
            " print(sorted(m for m in sys.modules if m.split(\".\")[0] in (\"tensorflow\", \"keras\")))')")
    for fmt, tolerance in (("onnx", 1e-5), ("tflite", 0.02)):
        done = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "predict_exported.py"),
                               f"--model_dir={os.path.join(out, 'export', fmt)}", f"--input_file={test}",
                               f"--output_dir={tmp_path / fmt}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.splitlines()[-1] == "[]"  # no TensorFlow, no Keras
        assert f"predicted 13 texts with {os.path.join(out, 'export', fmt)}" in done.stdout
        got = [line.split("\t") for line in (tmp_path / fmt / "predictions.tsv").read_text().splitlines()]
        assert got[0] == want[0] == ["id", "label", "p_neg", "p_pos"] and len(got) == len(want) == 14
        sure = [abs(float(w[2]) - float(w[3])) > 0.1 for w in want[1:]]
        for g, w, s in zip(got[1:], want[1:], sure):
            assert g[0] == w[0] and (g[1] == w[1] or not s), (g, w)
            np.testing.assert_allclose(np.array(g[2:], float), np.array(w[2:], float), atol=tolerance)
        if fmt == "onnx":
            assert (tmp_path / fmt / "predict.txt").read_text() == open(os.path.join(out, "predict.txt")).read()
    bad = tmp_path / "bad.tsv"
    bad.write_text("label\tsentence_x\nfresh\tgood\n")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "predict_exported.py"),
                           f"--model_dir={os.path.join(out, 'export', 'onnx')}", f"--input_file={bad}",
                           f"--output_dir={tmp_path / 'bad'}"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"predict_exported.py: error: {bad}: no column named text or text_a or sentence or sentence1; give "
        "--text_column; the file has label, sentence_x"]


def test_a_taggers_litert_export_tags_as_the_tagger_does(exported):
    """load_exported on the CRF tagger's LiteRT export (windows, Viterbi on the host): int8 weights move the
    scores by at most INT8, so nearly every word gets the tagger's own tag."""
    from bert_mgpu.io.exported import load_exported

    tagger, path = exported["tagger_crf"]
    texts = TEXTS + ["actor " * 25]
    got, want = load_exported(path).predict_tags(texts), tagger.predict_tags(texts)
    assert [len(row) for row in got] == [len(row) for row in want]
    same = [a == b for g, w in zip(got, want) for a, b in zip(g, w)]
    assert len(same) > 100 and np.mean(same) >= 0.95, np.mean(same)
