"""Long documents: windows over a text (--doc_stride), pooled back into one output a text, in Python, in
training and in the SavedModel; the loss counts each document once."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import WORDS, sentiment_rows, tiny_config, write_google_release

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.data import doc_windows, windows
from bert_mgpu.data.tagging_input import spans
from bert_mgpu.model.objectives import objective

LENGTH, STRIDE = 16, 6  # windows of 14 pieces, 6 apart


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    base = tmp_path_factory.mktemp("long")
    release, _ = write_google_release(str(base / "release"), tiny_config(len(WORDS) + 10))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    clf = bert_mgpu.BertClassifier.from_pretrained(release, labels=["neg", "pos"], towers=towers,
                                                   precision="float32", max_seq_length=LENGTH, doc_stride=STRIDE)
    return clf, towers, base


def texts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(0, 60))) for _ in range(n)]


def test_windows_cover_every_piece_as_spans_cuts_them_and_pooling_is_per_text(classifier):
    clf, _, _ = classifier
    docs = texts(30)
    cut = doc_windows.cut_documents(clf.tokenizer, docs, LENGTH, STRIDE)
    starts = np.r_[0, np.cumsum(cut.lengths)[:-1]]
    for d, text in enumerate(docs):
        pieces = clf.tokenizer.convert_tokens_to_ids(clf.tokenizer.tokenize(text))
        mine = np.flatnonzero(cut.doc_of == d)
        assert cut.count[d] == len(mine) == len(spans(len(pieces), LENGTH - 2, STRIDE))
        for w, (a, b) in zip(mine, spans(len(pieces), LENGTH - 2, STRIDE)):
            window = cut.ids[starts[w]:starts[w] + cut.lengths[w]].tolist()
            assert window == [clf.tokenizer.cls_id, *pieces[a:b], clf.tokenizer.sep_id]
    logits = np.random.default_rng(1).normal(size=(len(cut.lengths), 3))
    for how, reduce in (("mean", np.mean), ("max", np.max)):
        pooled = windows.pool(logits, cut.doc_of, len(docs), how)
        want = [reduce(logits[cut.doc_of == d], axis=0) for d in range(len(docs))]
        np.testing.assert_allclose(pooled, want, atol=1e-6)  # pooled in float32
    in_graph = tf.function(lambda t: doc_windows.windows_in_graph(clf.tokenizer, t, LENGTH, STRIDE), autograph=False)
    ids, segments, real, doc_of = in_graph(tf.constant(docs))  # traced, as in a SavedModel
    assert doc_of.numpy().tolist() == cut.doc_of.tolist() and not segments.numpy().any()
    for w in range(len(cut.lengths)):
        assert ids.numpy()[w][real.numpy()[w]].tolist() == cut.ids[starts[w]:starts[w] + cut.lengths[w]].tolist()


def test_predict_pools_each_texts_windows_in_input_order_on_every_tower(classifier):
    """Each window's logits from the model directly, their mean (and max) per text, against `predict`."""
    clf, _, _ = classifier
    docs = texts(21, seed=2)  # not a multiple of the towers' batch
    cut = doc_windows.cut_documents(clf.tokenizer, docs, LENGTH, STRIDE)
    starts = np.r_[0, np.cumsum(cut.lengths)[:-1]]
    ids = np.zeros((len(cut.lengths), LENGTH), np.int32)
    for w, (s, n) in enumerate(zip(starts, cut.lengths)):
        ids[w, :n] = cut.ids[s:s + n]
    logits = clf.model({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 0},
                       training=False).numpy()
    for how in ("mean", "max"):
        clf.window_pooling = how
        want = tf.nn.softmax(windows.pool(logits, cut.doc_of, len(docs), how)).numpy()
        np.testing.assert_allclose(clf.predict(docs, batch_size=3), want, atol=1e-5)
    clf.window_pooling = "mean"
    assert max(cut.count) >= 4 and min(cut.count) == 1


def test_each_document_counts_once_in_the_training_loss(classifier):
    clf, _, _ = classifier
    docs = texts(12, seed=3)
    examples = [bert_mgpu.Example(str(i), t, None, "pos" if i % 2 else "neg") for i, t in enumerate(docs)]
    ds, cut = doc_windows.window_dataset(examples, clf.tokenizer, clf.labels, LENGTH, STRIDE, 4, training=True,
                                         seed=0, encode_labels=clf.objective.encode)
    seen = {}
    for features, labels, index in ds.take(40):
        for w, weight, label in zip(index.numpy(), features["window_weight"].numpy(), labels.numpy()):
            d = cut.doc_of[w]
            assert label == d % 2 and weight == pytest.approx(len(cut.lengths) / len(docs) / cut.count[d])
            seen[int(w)] = weight
    assert len(seen) > 0.8 * len(cut.lengths)
    # A document's weights sum to the same whatever its windows; their mean over all windows is 1.
    totals = np.bincount(cut.doc_of, len(cut.lengths) / len(docs) / cut.count[cut.doc_of])
    np.testing.assert_allclose(totals, len(cut.lengths) / len(docs))
    kind = objective("classification")
    logits = tf.constant(np.random.default_rng(0).normal(size=(5, 2)), tf.float32)
    labels = tf.constant([0, 1, 1, 0, 1])
    weight = tf.constant([0.5, 2.0, 1.0, 0.25, 1.25])
    model = lambda features, training: logits  # noqa: E731
    got, _ = kind.loss(model, {"token_ids": tf.zeros([5, 3]), "window_weight": weight}, labels)
    want = np.mean(kind.example_losses(logits, labels).numpy() * weight.numpy())
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_the_run_keeps_its_windows_and_its_saved_model_pools_them(classifier, tmp_path):
    clf, towers, _ = classifier
    rows = [bert_mgpu.Example(str(i), t + " " + " ".join(["the"] * 20), None, label)
            for i, (label, t) in enumerate(sentiment_rows(48, seed=5))]
    clf.fit(rows, str(tmp_path / "run"), epochs=1, learning_rate=1e-4, verbose=False)
    back = bert_mgpu.BertClassifier.from_pretrained(str(tmp_path / "run"), towers=towers, precision="float32",
                                                    max_seq_length=LENGTH)
    assert (back.doc_stride, back.window_pooling) == (STRIDE, "mean")
    docs = texts(17, seed=6) + ["", "good"]
    np.testing.assert_allclose(back.predict(docs), clf.predict(docs), atol=1e-6)
    served = tf.saved_model.load(back.export(str(tmp_path / "saved_model")))
    got = served.signatures["serving_default"](text=tf.constant(docs))["probabilities"].numpy()
    np.testing.assert_allclose(got, clf.predict(docs), atol=1e-5)
    with pytest.raises(UserError, match="keeps the head of a long text; this model reads its windows"):
        back.export(str(tmp_path / "keras_hub"), "keras_hub")


@pytest.mark.parametrize("kwargs, message", [
    (dict(doc_stride=14), r"--doc_stride=14: must be above 0 and below the 14 pieces of a window"),
    (dict(window_pooling="max"), r"--window_pooling=max needs --doc_stride"),
    (dict(doc_stride=6, window_pooling="median"), r"--window_pooling=median: one of mean, max"),
    (dict(doc_stride=6, truncation="tail"), r"--truncation=tail with --doc_stride: windows keep every piece"),
])
def test_bad_window_settings_say_what_is_wrong_in_one_line(classifier, kwargs, message):
    clf, towers, base = classifier
    with pytest.raises(UserError, match=message):
        bert_mgpu.BertClassifier.from_pretrained(str(base / "release"), labels=["neg", "pos"], towers=towers,
                                                 max_seq_length=LENGTH, **kwargs)
    with pytest.raises(UserError, match="windows slide over single texts; this task reads sentence pairs"):
        doc_windows.check_windows(LENGTH, STRIDE, pairs=True)
