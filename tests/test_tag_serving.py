"""The tagger's SavedModel gives `predict`'s answer for every text, with and without a CRF: no word, one
word, white space only, a NUL inside a word, texts whose last window holds one word, texts of many windows,
all in one batch (a text the graph cannot handle would fail the whole request)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the served graph's tokenizer ops)
from conftest import NER_TAGS, WORDS

import bert_mgpu

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

rng = np.random.default_rng(5)
LONG = " ".join(rng.choice(WORDS, 90))  # 90 words: windows of 6 pieces, 3 apart
EDGES = ["", "   ", "paris", "film", "\t\n", "a\x00b film", "the film\x00", "\x00", "the movie good actor story the",
         "the movie good actor story the a", "film , movie .", "电影 film", LONG]


@pytest.fixture(scope="module", params=[False, True], ids=["softmax", "crf"])
def served(request, google_release, tmp_path_factory):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    tagger = bert_mgpu.BertTagger.from_pretrained(google_release, labels=NER_TAGS, towers=towers, max_seq_length=8,
                                                  doc_stride=3, precision="float32", crf=request.param)
    if request.param:  # transitions far from zero, so the CRF's paths differ from each word's own best tag
        tagger.model.crf.transitions.assign(rng.normal(0, 3, (len(NER_TAGS), len(NER_TAGS))).astype(np.float32))
    path = str(tmp_path_factory.mktemp("served"))
    tagger.export(path, "saved_model")
    return tagger, tf.saved_model.load(path).signatures["serving_default"], path


def _tags(got, i):
    return [t.decode() for t in got["tags"][i] if t]


@pytest.mark.parametrize("batch", ["together", "alone"])
def test_the_served_tags_and_entities_are_predicts_for_every_text(served, batch):
    tagger, endpoint, _ = served
    requests = [EDGES] if batch == "together" else [[text] for text in EDGES]
    texts = [text for request in requests for text in request]
    got = [{k: v.numpy() for k, v in endpoint(text=tf.constant(request)).items()} for request in requests]
    rows = [(g, i) for g, request in zip(got, requests) for i in range(len(request))]
    want_tags, want_entities = tagger.predict_tags(texts), tagger.predict(texts)
    for text, (g, i), tags, found in zip(texts, rows, want_tags, want_entities):
        assert _tags(g, i) == tags, repr(text)
        assert [(a.decode(), b.decode(), int(s), int(e)) for a, b, s, e in zip(
            g["entity_types"][i], g["entity_texts"][i], g["entity_starts"][i], g["entity_ends"][i]) if s >= 0] == [
            (e["type"], e["text"], e["start"], e["end"]) for e in found], repr(text)
    assert [len(t) for t in want_tags[:5]] == [0, 0, 1, 1, 0] and len(want_tags[-1]) == 90
    assert sum(bool(f) for f in want_entities) >= 3  # entities to compare, not only empty lists


def test_the_saved_model_stores_each_weight_once(served):
    """Issue 68 item 1: as many values as the model's weights (and the CRF's transitions), each once (a Keras
    variable and its tf.Variable were saved apart, every weight twice)."""
    from test_export import stored_values

    tagger, _, path = served
    stored = stored_values(path)
    weights = [w for w in tagger.model.weights if "seed_generator" not in w.path]
    assert len(stored) == len(weights) and sum(stored.values()) == sum(int(np.prod(w.shape)) for w in weights), (
        len(stored), [w.path for w in weights])
