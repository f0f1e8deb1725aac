"""ONNX export (issue 68 item 2): every head's graph runs in ONNX Runtime to the model's own outputs, and its
tokenizer.json gives Hugging Face `tokenizers` bert_mgpu's ids."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import NER_TAGS, WORDS
from export_heads import TEXTS, expected_outputs, export_each, head_rows, model_outputs, rng, rows_of

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import encode
from bert_mgpu.data.tokenization import FullTokenizer
from bert_mgpu.io import export, onnx_export

onnxruntime = pytest.importorskip("onnxruntime")  # the onnx extra; `make test` installs it
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def exported(google_release, tmp_path_factory):
    return export_each(google_release, tmp_path_factory, "onnx")


@pytest.mark.parametrize("kind", ["classification", "regression", "multi_label", "tagger_crf", "question_answerer",
                                  "multiple_choice", "encoder"])
def test_onnx_runtime_gives_each_heads_outputs(exported, kind):
    model, path = exported[kind]
    facts = json.load(open(os.path.join(path, onnx_export.FACTS)))
    session = onnxruntime.InferenceSession(os.path.join(path, "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(onnx_export.INPUTS)
    assert [o.name for o in session.get_outputs()] == facts["outputs"]
    assert facts["max_difference_to_tensorflow"] < 1e-4 and facts["weights"] == "float32"
    rows = head_rows(model, kind)
    got = dict(zip(facts["outputs"], session.run(None, rows)))
    pairs = expected_outputs(model, kind, rows)
    for name, value in pairs:
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, atol=1e-4, rtol=0, err_msg=name)
    if kind == "multiple_choice":
        assert got["logits"][2, 3] == pytest.approx(-1e4)  # a padded choice is never chosen
    if kind == "tagger_crf":
        np.testing.assert_allclose(facts["crf_transitions"], model.model.crf.transitions.numpy(), atol=1e-7)
        config = json.load(open(os.path.join(path, "config.json")))
        assert config["id2label"] == {str(i): t for i, t in enumerate(NER_TAGS)}
        assert config["architectures"] == ["BertForTokenClassification"]  # the emissions; Viterbi on the host


def _without_tensorflow(path, texts):
    """An export's outputs for raw texts through its tokenizer.json (Hugging Face `tokenizers`) and ONNX Runtime."""
    from bert_mgpu.io.exported import onnx_inputs, read_tokenizer

    rows = onnx_inputs(read_tokenizer(path), texts)
    session = onnxruntime.InferenceSession(os.path.join(path, "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, rows)))


def test_hf_tokenizers_and_onnx_runtime_predict_as_the_classifier(exported):
    """Raw text to probabilities with no TensorFlow: tokenizer.json in `tokenizers`, model.onnx in ONNX
    Runtime; the probabilities are `predict`'s, the labels config.json's."""
    clf, path = exported["classification"]
    got = _without_tensorflow(path, TEXTS)
    np.testing.assert_allclose(got["probabilities"], clf.predict(TEXTS), atol=1e-5)
    config = json.load(open(os.path.join(path, "config.json")))
    assert config["id2label"] == {"0": "neg", "1": "pos", "2": "mixed"}
    assert config["architectures"] == ["BertForSequenceClassification"]


SERVE = r"""
import json, sys
import numpy as np
import bert_mgpu

model = bert_mgpu.load_exported(sys.argv[1])
texts = json.load(open(sys.argv[2]))
np.save(sys.argv[3], model.predict(texts))
print(json.dumps({"labels": model.predict_labels(texts), "loaded": sorted(
    m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "keras_hub", "tf2onnx", "torch"))}))
"""


def test_the_scripts_onnx_export_predicts_its_test_results_without_tensorflow(classifier_run, tmp_path):
    """run_classifier_mgpu.py --do_export --export_format=onnx (the session's classifier run, tanh-GELU), read
    by `bert_mgpu.load_exported` in a process that never loads TensorFlow: the test set's texts give the run's
    own test_results.tsv and predict.txt."""
    import subprocess
    import sys

    out = classifier_run.out
    path = os.path.join(out, "export", "onnx")
    texts = [line.split("\t")[1] for line in open(os.path.join(out, "..", "data", "test.tsv")).read().splitlines()[1:]]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    done = subprocess.run([sys.executable, "-c", SERVE, path, str(tmp_path / "texts.json"), str(tmp_path / "p.npy")],
                          capture_output=True, text=True, check=True)
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["loaded"] == []  # numpy, onnxruntime and tokenizers only
    want = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    got = np.load(tmp_path / "p.npy")
    assert len(texts) == 13 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)  # the file keeps 8 decimals
    assert facts["labels"] == open(os.path.join(out, "predict.txt")).read().split()
    onnx_facts = json.load(open(os.path.join(path, onnx_export.FACTS)))
    assert onnx_facts["labels"] == ["neg", "pos"] and onnx_facts["max_seq_length"] == 32


def test_load_exported_refuses_what_it_cannot_predict_in_one_line(exported, tmp_path):
    from bert_mgpu.io.exported import load_exported

    with pytest.raises(UserError, match=r"not an ONNX or LiteRT export of bert_mgpu \(no bert_mgpu.json and "
                                        r"model.onnx or model.tflite\)"):
        load_exported(str(tmp_path))
    with pytest.raises(UserError, match=r"a pretrainer's export has no predictions; run its model.onnx"):
        load_exported(exported["encoder"][1])
    regression = load_exported(exported["regression"][1])
    clf = exported["regression"][0]
    np.testing.assert_allclose(regression.predict(TEXTS), clf.predict(TEXTS), atol=1e-5)
    with pytest.raises(UserError, match="reads single texts: text_b is not used"):
        regression.predict(TEXTS, TEXTS)
    with pytest.raises(ValueError, match="a regression has no labels"):
        regression.predict_labels(TEXTS)
    multi = load_exported(exported["multi_label"][1])
    p = exported["multi_label"][0].predict(TEXTS)
    np.testing.assert_allclose(multi.predict(TEXTS), p, atol=1e-5)
    assert multi.predict_labels(TEXTS, threshold=0.5) == [",".join(
        name for name, x in zip(["a", "b"], row) if x >= 0.5) for row in p]
    clf, path = exported["classification"]
    assert load_exported(path).predict_labels(TEXTS) == [clf.labels[i] for i in clf.predict(TEXTS).argmax(1)]


# Text where google-bert's steps matter: accents, capitals, Unicode spaces and controls, CJK with full-width
# punctuation, symbols, a word longer than the WordPiece limit (100 bytes).
TRICKY = ["Ünïcödé ÀÇÇÉNTS and CAPITALS … “quotes” — dashes", "tabs\tand\u00a0no-break\u3000spaces\r\n",
          "a\x00b\u200bc\ufffdd", "中文文本，包括标点。《书名》和“引号”！", "混合 text 漢字 123",
          "$3,000 = 12.5% @home #tag",
          "naïve café résumé Straße ÉCOLE", "x" * 99, "y" * 101, "émoji 🙂 and ½ ﬁ ligature", ""]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_tokenizer_json_gives_bert_mgpus_ids(minilm_dir, lower):
    """The same ids, segments and truncation as bert_mgpu's tokenizer, single texts and pairs, on the real
    MiniLM vocabulary (CJK characters included). Two differences `tokenizers` cannot be told about, each
    shown: when both texts of a pair are cut, the second at least as long, at an odd budget of pieces, the
    odd piece goes to the second (google-bert, and bert_mgpu: to the first); and an upper-case Greek
    word's final Σ becomes σ (google-bert's Python, and bert_mgpu: ς)."""
    vocab = os.path.join(minilm_dir, "vocab.txt")
    texts = TRICKY + [" ".join(rng.choice(WORDS, rng.integers(1, 60))) for _ in range(20)]
    ours = FullTokenizer(vocab, lower)
    compared = 0
    for truncation, pairs, length in (("head", False, 24), ("tail", False, 24), ("head", True, 25)):
        trained = export.Trained("classifier", None, vocab, lower, {}, ["a"], max_seq_length=length,
                                 truncation=truncation)
        tok = tokenizers.Tokenizer.from_str(json.dumps(onnx_export.tokenizer_json(trained)))
        b = texts[::-1] if pairs else None
        ids, segments = encode(ours, tf.constant(texts), tf.constant(b) if pairs else None, length, pairs,
                               truncation=truncation)
        encoded = tok.encode_batch(list(zip(texts, b)) if pairs else texts)
        for i, e in enumerate(encoded):
            assert e.ids == ids[i].numpy().tolist(), (texts[i], truncation, pairs)
            assert e.type_ids == segments[i].numpy().tolist(), (texts[i], truncation, pairs)
            compared += len(e.ids) - 2
    assert compared > 1000  # real pieces compared, not only [CLS] [SEP]
    trained = export.Trained("classifier", None, vocab, lower, {}, ["a"], max_seq_length=24)
    odd = tokenizers.Tokenizer.from_str(json.dumps(onnx_export.tokenizer_json(trained)))  # 21 pieces for a pair
    long_a, long_b = " ".join(WORDS[:12]), " ".join(WORDS[12:])  # both over 10 pieces, the second longer
    ids = encode(ours, tf.constant([long_a]), tf.constant([long_b]), 24, True)[0][0].numpy().tolist()
    theirs = odd.encode(long_a, long_b).ids
    assert len(theirs) == len(ids) == 24 and (ids.index(ours.sep_id), theirs.index(ours.sep_id)) == (12, 11)
    greek = ours.tokenize("ΣΟΦΌΣ")
    assert tok.encode("ΣΟΦΌΣ", add_special_tokens=False).tokens == (
        ["σ", "##ο", "##φ", "##ο", "##σ"] if lower else greek)
    assert greek == (["σ", "##ο", "##φ", "##ος"] if lower else greek)


def test_int8_export_quantizes_every_dense_kernel_and_stays_close(exported, tmp_path):
    """onnx_int8: each layer's six dense kernels stored as int8 and multiplied in integers; the outputs near
    the float32 model's. Its size and accuracy on real data are benchmarked (benchmarks/deploy.py), not
    tested: this model's weights are too small for the ratio to mean anything."""
    import onnx

    clf, _ = exported["classification"]
    path = export.export_model(clf, str(tmp_path / "int8"), "onnx_int8")
    facts = json.load(open(os.path.join(path, onnx_export.FACTS)))
    assert facts["weights"] == "int8"
    graph = onnx.load(os.path.join(path, "model.onnx")).graph
    int8 = [i for i in graph.initializer if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2]
    layers = clf.config.num_hidden_layers  # q, k, v, output, intermediate, feed-forward output: 6 a layer
    assert len(int8) >= 6 * layers and sum(n.op_type == "MatMulInteger" for n in graph.node) >= 6 * layers, (
        [i.name for i in int8])
    session = onnxruntime.InferenceSession(os.path.join(path, "model.onnx"), providers=["CPUExecutionProvider"])
    rows = rows_of(clf.tokenizer, TEXTS, pairs=True)
    got = dict(zip(facts["outputs"], session.run(None, rows)))
    difference = np.max(np.abs(got["logits"] - model_outputs(clf, rows)))
    assert 0 < difference < 0.05 and facts["max_difference_to_tensorflow"] > 0, difference


def test_a_missing_onnx_extra_is_one_line(monkeypatch):
    real = onnx_export.importlib.util.find_spec
    monkeypatch.setattr(onnx_export.importlib.util, "find_spec", lambda m: None if m == "tf2onnx" else real(m))
    with pytest.raises(UserError, match=r"--export_format=onnx: needs tf2onnx; pip install 'bert_mgpu\[onnx\]'"):
        onnx_export.check_available("onnx")
    onnx_export.check_available("hf")  # other formats need nothing more


def test_a_taggers_export_predicts_its_tags_and_entities_without_tensorflow(exported):
    """load_exported on the CRF tagger's ONNX export: the words of raw texts (and of word lists), their
    pieces through tokenizer.json, windows 7 pieces apart where a text is longer than the 14 a window holds,
    Viterbi with the exported transitions: the same tags and entities as the tagger's own predict."""
    from bert_mgpu.io.exported import load_exported

    tagger, path = exported["tagger_crf"]
    served = load_exported(path)
    assert served.doc_stride == 7 and served.transitions is not None
    texts = TEXTS + ["the film actor story good the movie", "actor " * 25]
    assert max(len(t.split()) for t in texts) > 20  # several windows
    assert served.predict_tags(texts) == tagger.predict_tags(texts)
    assert served.predict(texts) == tagger.predict(texts)
    words = [["the", "film", "New-York", "\x00", "actor"], ["actor", "story"], []]
    assert served.predict_tags(words) == tagger.predict_tags(words)
    assert served.predict(words) == tagger.predict(words)
    for bad in ([["film", ""]], [3], ["a\udc80b"]):
        with pytest.raises(UserError, match="input 0: ") as ours:
            served.predict(bad)
        with pytest.raises(UserError) as theirs:
            tagger.predict(bad)
        assert str(ours.value).split(":")[0] == str(theirs.value).split(":")[0]
    tags = [t for row in served.predict_tags(texts) for t in row]
    # random weights and transitions: more than one tag, and entities, so that the comparison means something
    assert len(set(tags)) >= 2 and sum(map(len, served.predict(texts))) >= 3


def test_a_question_answerers_export_answers_as_it_does_without_tensorflow(google_release, tmp_path):
    """load_exported on a question answerer's ONNX export (windows of 32 pieces, questions cut to 8, 6 pieces
    apart): the question's and the context's pieces through tokenizer.json, windows over contexts longer
    than a window, run_squad's n-best selection: the same answers, offsets and probabilities as the model's
    own predict."""
    import bert_mgpu
    from bert_mgpu.io.exported import load_exported

    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(
        google_release, towers=bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2), precision="float32", max_seq_length=32,
        max_query_length=8, doc_stride=6, max_answer_length=5, n_best_size=4)
    served = load_exported(export.export_model(qa, str(tmp_path / "onnx"), "onnx"))
    assert served.settings["doc_stride"] == 6 and served.settings["n_best_size"] == 4
    questions = [(TEXTS[i] or "film", TEXTS[-1 - i] or "a good film") for i in range(len(TEXTS))]
    questions += [("who", "Ünïcödé actor, “quotes” 电影 film ! " * 4), {"id": "x", "question": "the plot",
                                                                         "context": "the plot was dull . " * 6}]
    got, want = served.predict(questions), qa.predict(questions)
    assert [g["text"] for g in got] == [w["text"] for w in want] and sum(bool(w["text"]) for w in want) >= 5
    for g, w in zip(got, want):
        assert (g["start"], g["end"]) == (w["start"], w["end"])
        assert g["probability"] == pytest.approx(w["probability"], abs=1e-4)
    answers = served.answer(questions)
    assert len(answers.nbest["x"]) > 1 and answers.predictions == qa.answer(questions, verbose=False).predictions


def test_a_multiple_choice_export_chooses_as_the_model_does_without_tensorflow(exported):
    """load_exported on the multiple-choice model's ONNX export: questions of 2 to 4 choices (padded in a
    batch), a context or none, a CHID blank, texts longer than the 16 pieces a choice holds: the same choices
    and probabilities as the model's own predict."""
    from bert_mgpu.io.exported import load_exported

    mc, path = exported["multiple_choice"]
    served = load_exported(path)
    questions = [(TEXTS[i], TEXTS[i + 1] or "which", [TEXTS[i + 2] or "a", TEXTS[(i + 3) % 12], "film"][:2 + i % 2])
                 for i in range(9)]
    questions += [("", "the film was", ["good", "bad", "dull", "great"]), ("the \x00 was good", "", ["film", "plot"]),
                  {"context": "a story", "question": "", "choices": ["actor " * 20, "movie"]}]
    got, want = served.predict(questions, batch_size=5), mc.predict(questions)
    assert [g["label"] for g in got] == [w["label"] for w in want]
    for g, w in zip(got, want):
        assert g["answer"] == w["answer"] and len(g["probabilities"]) == len(w["probabilities"])
        np.testing.assert_allclose(g["probabilities"], w["probabilities"], atol=1e-5)
    assert len({g["label"] for g in got}) > 1  # random weights: not one answer for all


def test_a_pair_is_cut_as_google_bert_cuts_it():
    """windows.pair_counts against google-bert's _truncate_seq_pair (pop a piece from the longer text, the
    second when they are as long) on every pair of lengths up to 12 at budgets 1 to 13."""
    from bert_mgpu.data.windows import pair_counts as trim

    for budget in range(1, 14):
        for a in range(13):
            for b in range(13):
                na, nb = a, b
                while na + nb > budget:
                    if na > nb:
                        na -= 1
                    else:
                        nb -= 1
                assert trim(a, b, budget) == (na, nb), (a, b, budget)


SERVE_EACH = r"""
import json, sys
import bert_mgpu

tagger, mc, qa = (bert_mgpu.load_exported(p) for p in sys.argv[1:4])
out = {"tags": tagger.predict_tags(["the film actor story"]), "entities": tagger.predict(["the film actor"]),
       "choice": mc.predict([("a story", "the film was", ["good", "bad"])])[0]["label"], "qa": qa.kind}
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "keras_hub", "torch"))
print(json.dumps(out))
"""


def test_every_heads_export_is_served_in_a_process_without_tensorflow(exported):
    """The tagger's, the multiple-choice model's and the question answerer's exports load, and the first two
    predict, in a process that never imports TensorFlow, Keras or PyTorch."""
    import subprocess
    import sys

    paths = [exported[k][1] for k in ("tagger_crf", "multiple_choice", "question_answerer")]
    done = subprocess.run([sys.executable, "-c", SERVE_EACH, *paths], capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["loaded"] == [] and out["qa"] == "question_answerer"
    assert out["tags"] == exported["tagger_crf"][0].predict_tags(["the film actor story"])
    assert out["entities"] == exported["tagger_crf"][0].predict(["the film actor"])
    assert out["choice"] == exported["multiple_choice"][0].predict([("a story", "the film was", ["good", "bad"])])[0][
        "label"]


LONG = [" ".join(rng.choice(WORDS, n)) for n in (1, 12, 13, 14, 15, 31, 47)] + ["", "电影 film ! " * 9]


@pytest.mark.parametrize("settings", [
    dict(doc_stride=5), dict(doc_stride=3, window_pooling="max", task_type="multi_label"),
    dict(doc_stride=13, task_type="regression"), dict(truncation="head+tail"), dict(truncation="tail"),
    dict(truncation="head+tail", task="mrpc"), dict(truncation="head", task="mrpc")],
    ids=["windows", "max_multi_label", "regression", "head+tail", "tail", "pairs_head+tail", "pairs_head"])
def test_a_classifier_reads_long_texts_served_as_it_does(google_release, tmp_path, settings):
    """load_exported on a classifier with windows over long texts (--doc_stride, mean or max pooled) or cut
    head+tail, single texts or pairs: the windows' and pieces' cuts on the host, the probabilities (scores)
    the model's own predict gives, for texts of 1 to 47 words in windows of 14 pieces."""
    import bert_mgpu
    from bert_mgpu.io.exported import load_exported

    labels = None if settings.get("task_type") == "regression" else ["neg", "pos", "mixed"]
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, labels=labels, max_seq_length=16,
                                                   towers=bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2),
                                                   precision="float32", **settings)
    kernel = clf.model.get_layer("classifier").kernel  # a fresh head's outputs barely differ between texts
    kernel.assign(np.random.default_rng(5).normal(0, 3, kernel.shape).astype(np.float32))
    served = load_exported(export.export_model(clf, str(tmp_path / "onnx"), "onnx"))
    pairs = settings.get("task") == "mrpc"
    text_b = LONG[::-1] if pairs else None
    want = clf.predict(list(zip(LONG, text_b)) if pairs else LONG)
    np.testing.assert_allclose(served.predict(LONG, text_b, batch_size=3), want, atol=1e-5)
    assert np.ptp(want, axis=0).max() > 1e-3  # the texts' outputs differ, by 100 times the tolerance
