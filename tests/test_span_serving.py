"""The question answerer's SavedModel gives `predict`'s answer to every request, alone or in a batch: an
empty or blank context, a one-word context, a context of many windows, a NUL inside a word."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the served graph's tokenizer ops)
from conftest import WORDS

import bert_mgpu

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

rng = np.random.default_rng(7)
LONG = " ".join(rng.choice(WORDS, 60))
PAIRS = [("the movie ?", ""), ("the movie ?", "   "), ("good ?", "film"), ("good ?", "the film was good ."),
         ("a plot", LONG), ("actor ?", "the actor\x00story was fun"), ("fun ?", "电影 fun")]


@pytest.fixture(scope="module", params=[False, True], ids=["v1", "v2"])
def served(request, google_release, tmp_path_factory):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(google_release, towers=towers, max_seq_length=16,
                                                        doc_stride=4, max_query_length=4, precision="float32",
                                                        version_2_with_negative=request.param)
    path = str(tmp_path_factory.mktemp("served"))
    qa.export(path, "saved_model")
    return qa, tf.saved_model.load(path).signatures["serving_default"], path


@pytest.mark.parametrize("batch", ["together", "alone"])
def test_the_served_answer_is_predicts_for_every_request(served, batch):
    qa, endpoint, _ = served
    requests = [PAIRS] if batch == "together" else [[pair] for pair in PAIRS]
    got = []
    for request in requests:
        out = endpoint(question=tf.constant([q for q, _ in request]), context=tf.constant([c for _, c in request]))
        got += [(a.decode(), int(s), int(e)) for a, s, e in zip(out["answer"].numpy(), out["answer_start"].numpy(),
                                                                 out["answer_end"].numpy())]
    assert got[:2] == [("", -1, -1)] * 2  # no context, no answer (predict refuses it: one line naming it)
    want = qa.predict(PAIRS[2:])
    assert got[2:] == [(w["text"], w["start"] if w["text"] else -1, w["end"] if w["text"] else -1) for w in want]
    with pytest.raises(bert_mgpu.UserError, match="question 0: an empty question or context"):
        qa.predict(PAIRS[:1])
    assert sum(bool(a) for a, _, _ in got) >= 3  # answers to compare, not only empty ones


def test_the_saved_model_stores_each_weight_once(served):
    """Issue 68 item 1: as many values as the model's weights, each once (a Keras variable and its
    tf.Variable were saved apart, every weight twice)."""
    from test_export import stored_values

    qa, _, path = served
    stored = stored_values(path)
    weights = [w for w in qa.model.weights if "seed_generator" not in w.path]
    assert len(stored) == len(weights) and sum(stored.values()) == sum(int(np.prod(w.shape)) for w in weights), (
        len(stored), [w.path for w in weights])
