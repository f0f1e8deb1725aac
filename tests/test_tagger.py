"""The token-classification head and its objective against transformers' BertForTokenClassification on the
same weights: logits to 1e-4, and the loss over labelled positions equal to its ignore_index loss."""

import os

import keras
import numpy as np
import pytest
from conftest import hf_state, tiny_config

from bert_mgpu.model import modeling
from bert_mgpu.model.tagging_objectives import TokenClassification


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "keras_hub"])
def test_logits_and_loss_equal_transformers_on_the_same_weights(reference, fused):
    import torch
    import transformers

    config = tiny_config(40, hidden_act="gelu")
    keras.utils.set_random_seed(3)
    model = modeling.build_tagger(config, 5, fused=fused)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 40, (3, 11)).astype(np.int32)
    mask = np.arange(11)[None, :] < np.array([[11], [7], [4]])
    ids[~mask] = 0
    segments = (np.arange(11)[None, :] >= 5).astype(np.int32) * mask
    labels = np.where(mask & (rng.random((3, 11)) < 0.6), rng.integers(0, 5, (3, 11)), -1).astype(np.int32)
    features = {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}
    ours = model(features, training=False).numpy()

    state = {name: torch.tensor(value) for name, value in hf_state(model).items()}
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "encoder_ln_mode"},
                                        num_labels=5, layer_norm_eps=1e-12)
    reference_model = transformers.BertForTokenClassification(hf_config).eval()
    missing, unexpected = reference_model.load_state_dict(state, strict=False)
    # transformers' token classifier has no pooler; nothing else is left over or missing.
    assert all(".pooler." in u for u in unexpected) and all("position_ids" in m for m in missing), (missing,
                                                                                                   unexpected)
    with torch.no_grad():
        out = reference_model(input_ids=torch.tensor(ids, dtype=torch.long),
                              token_type_ids=torch.tensor(segments, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long),
                              labels=torch.tensor(np.where(labels < 0, -100, labels), dtype=torch.long))
    real = mask  # padding positions are not compared: neither library defines them
    difference = np.abs(out.logits.numpy()[real] - ours[real]).max()
    print(f"largest logit difference {difference:.2e}, loss {float(out.loss):.6f}")
    assert difference < 1e-4

    loss, stats = TokenClassification().loss(lambda f, training: model(f, training=training), features, labels,
                                             training=False)
    assert float(loss) == pytest.approx(float(out.loss), abs=1e-5)
    chosen = ours.argmax(-1)
    assert float(stats["token_accuracy"]) == pytest.approx(float((chosen == labels)[labels >= 0].mean()), abs=1e-6)


def test_the_objective_scores_entities_and_names_its_export():
    kind = TokenClassification()
    results = kind.evaluate([["B-PER", "I-PER", "O", "O"]], [["B-PER", "I-PER", "O", "B-LOC"]])  # predicted, true
    assert results == {"eval_precision": 1.0, "eval_recall": 0.5, "eval_f1": pytest.approx(2 / 3),
                       "eval_accuracy": 0.75}
    assert results.report == {"LOC": (0.0, 0.0, 0.0, 1), "PER": (1.0, 1.0, 1.0, 1)} and kind.main_metric() == "eval_f1"
    assert kind.hf_architecture({}) == "BertForTokenClassification"
    assert kind.hf_facts(["O", "B-PER"])["id2label"] == {"0": "O", "1": "B-PER"}


@pytest.mark.learning
def test_a_tagger_learns_entities_that_need_context_on_two_towers_and_predicts_long_sentences_in_windows(tmp_path):
    """BertTagger on two towers: trained with evaluation while training and the best model kept; sentences
    longer than a window are predicted in windows, each word once; entities map back to the text's
    characters; a rerun resumes (nothing left to train) and the run directory loads back with its head."""
    from conftest import NER_TAGS, learning_release, ner_sentences

    import bert_mgpu

    release = learning_release(str(tmp_path / "release"))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    train = ner_sentences(512, 3, 30)  # the longer ones take two windows
    dev = ner_sentences(32, 3, 14, seed=1, split="dev")
    test = ner_sentences(40, 15, 40, seed=2, split="test")  # longer than a window
    tagger = bert_mgpu.BertTagger.from_pretrained(release, labels=NER_TAGS, towers=towers, max_seq_length=16,
                                                  doc_stride=6, precision="float32")
    out = str(tmp_path / "out")
    history = tagger.fit(train, out, epochs=36, learning_rate=5e-3, warmup_proportion=0.05, dev=dev,
                         eval_every_steps=200, load_best_model_at_end=True)
    assert history["loss"][-1] < np.log(len(NER_TAGS)) / 5, history["loss"]  # a fifth of guessing's
    assert len(history["eval_f1"]) >= 4 and max(history["eval_f1"]) > 0.95, history["eval_f1"]
    assert tagger.best_step in history["eval_step"] and os.path.exists(os.path.join(out, "best"))

    results = tagger.evaluate(test)
    assert results["eval_f1"] > 0.95 and tagger.report["PER"][3] > 20, (results, tagger.report)
    assert 0 < results["eval_loss"] < 0.2 and results["eval_examples"] == 40

    text = "the film  good the actor story\ta the  movie"  # only the task's words: others it never saw
    (found,) = tagger.predict([text])
    assert [(e["type"], e["text"]) for e in found] == [("LOC", "film"), ("PER", "actor story"), ("LOC", "movie")]
    assert all(text[e["start"]:e["end"]] == e["text"] for e in found)
    (by_token,) = tagger.predict([text.split()])
    assert [(e["type"], e["start"], e["end"]) for e in by_token] == [("LOC", 1, 2), ("PER", 4, 6), ("LOC", 8, 9)]

    # The SavedModel: raw text in, tags and entities with character offsets out, as predict gives them.
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the served graph's tokenizer ops)

    tagger.export(str(tmp_path / "served"), "saved_model")
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    texts = [text, "a actor story , the film", "", "good good"]
    got = {k: v.numpy() for k, v in served(text=tf.constant(texts)).items()}
    for i, (tags, found) in enumerate(zip(tagger.predict_tags(texts), tagger.predict(texts))):
        assert [t.decode() for t in got["tags"][i] if t] == tags
        assert [(a.decode(), b.decode(), int(s), int(e)) for a, b, s, e in zip(
            got["entity_types"][i], got["entity_texts"][i], got["entity_starts"][i], got["entity_ends"][i])
            if s >= 0] == [(e["type"], e["text"], e["start"], e["end"]) for e in found]
    assert sum(1 for row in got["entity_types"] for t in row if t) >= 4
    # Long texts (up to 40 words, windows of 14 pieces 6 apart) are read in windows in the graph, each word
    # tagged from the window with most context: the tags predict gives, word for word.
    long = [" ".join(s.tokens) for s in test[:12]] + [" ".join(t.tokens[0] for t in test)]
    got = served(text=tf.constant(long))["tags"].numpy()
    for row, want in zip(got, tagger.predict_tags(long)):
        assert [t.decode() for t in row[:len(want)]] == want and not any(row[len(want):])
    assert sum(len(s.tokens) > 14 for s in test[:12]) >= 6
    back = bert_mgpu.BertTagger.from_pretrained(str(tmp_path / "served"), towers=towers, max_seq_length=16,
                                                doc_stride=6, precision="float32")
    assert back.labels == NER_TAGS and back.predict_tags(texts) == tagger.predict_tags(texts)

    steps = tagger.trained_steps
    again = tagger.fit(train, out, epochs=36, learning_rate=5e-3, warmup_proportion=0.05, dev=dev,
                       eval_every_steps=200)
    assert again.get("loss") is None and tagger.trained_steps == steps  # resumed at its end: nothing to train
    # In float32 as trained ("auto" is bfloat16 on a CPU with AMX or AVX512-BF16; with oneDNN off there,
    # bfloat16 flips a few near-tied tags: F1 0.9807 against 0.9835, Intel with AMX, 2026-11-25).
    loaded = bert_mgpu.BertTagger.from_pretrained(os.path.join(out, "best"), towers=towers, precision="float32")
    assert loaded.labels == NER_TAGS and loaded.doc_stride == 6 and loaded.max_seq_length == 16  # its windows
    assert loaded.evaluate(test)["eval_f1"] == pytest.approx(results["eval_f1"], abs=1e-9)
    # A tagger's run as a classifier's --init_checkpoint gives its encoder; the tags are not the classes.
    clf = bert_mgpu.BertClassifier.from_pretrained(out, labels=["neg", "pos"], towers=towers, max_seq_length=16)
    assert clf.task_type == "classification" and clf.labels == ["neg", "pos"] and clf.global_step == 0


def test_a_space_token_keeps_predict_txt_three_columns_and_reads_back(tmp_path):
    """CLUENER's texts hold spaces, a character a token: the line of a space token had two columns, which
    conlleval and the CoNLL reader refuse (issue 66, item 6). It is written as [SPACE]; predictions.jsonl
    keeps the text."""
    import json

    from bert_mgpu.data.tagged import Sentence, read_tagged

    text = "Bob 在 北京"
    sentences = [Sentence("test-0", list(text), ["B-PER", "I-PER", "I-PER", "O", "O", "O", "B-LOC", "I-LOC"], 1),
                 Sentence("test-1", ["New York", "is"], ["B-LOC", "O"], 1)]
    predicted = [["B-PER", "I-PER", "I-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"], ["B-LOC", "O"]]
    files = TokenClassification().read_as(data_format="cluener").prediction_files(predicted, sentences)
    lines = [line for line in files["predict.txt"].splitlines() if line]
    assert all(len(line.split(" ")) == 3 for line in lines), lines
    assert lines[3] == "[SPACE] O I-PER" and lines[5] == "[SPACE] O O" and lines[8] == "New[SPACE]York B-LOC B-LOC"
    assert json.loads(files["predictions.jsonl"].splitlines()[0])["text"] == text
    (tmp_path / "predict.txt").write_text(files["predict.txt"])
    back = read_tagged(str(tmp_path / "predict.txt"), "conll", tag_column=1)
    assert [s.tokens for s in back][0][3] == "[SPACE]" and [s.tags for s in back] == [s.tags for s in sentences]


def test_prediction_files_give_conll_columns_entities_with_character_offsets_and_cluener_submissions():
    import json

    from bert_mgpu.data.tagged import Sentence

    sentences = [Sentence("test-0", list("张三在北京"), None, 1), Sentence("test-1", ["New", "York", "is"], ["B-LOC",
                 "I-LOC", "O"], 1)]
    predicted = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC"], ["B-LOC", "I-LOC", "I-PER"]]
    files = TokenClassification().read_as(data_format="cluener").prediction_files(predicted, sentences)
    assert files["predict.txt"].split("\n\n")[1] == "New B-LOC B-LOC\nYork I-LOC I-LOC\nis O I-PER"
    assert files["predict.txt"].startswith("张 B-PER\n三 I-PER\n在 O\n")
    first, second = (json.loads(line) for line in files["predictions.jsonl"].splitlines())
    assert first == {"id": "test-0", "text": "张三在北京", "entities": [
        {"type": "PER", "text": "张三", "start": 0, "end": 2, "token_start": 0, "token_end": 2},
        {"type": "LOC", "text": "北京", "start": 3, "end": 5, "token_start": 3, "token_end": 5}]}
    assert [(e["text"], e["start"], e["end"]) for e in second["entities"]] == [("New York", 0, 8), ("is", 9, 11)]
    assert json.loads(files["cluener_predict.json"].splitlines()[0]) == {
        "id": 0, "label": {"PER": {"张三": [[0, 1]]}, "LOC": {"北京": [[3, 4]]}}}
    assert "test_results.txt" not in files  # the first sentence has no true tags
    tagged = [Sentence("test-0", list("张三在北京"), ["B-PER", "I-PER", "O", "B-LOC", "O"], 1), sentences[1]]
    results = dict(line.split(" = ") for line in TokenClassification().prediction_files(
        predicted, tagged)["test_results.txt"].splitlines())
    # Right: 张三 and New York; predicted 4 (张三, 北京, New York, is), true 3 (张三, 北, New York): P 2/4, R 2/3.
    assert float(results["test_precision"]) == 0.5 and float(results["test_recall"]) == pytest.approx(2 / 3)
    assert float(results["test_f1"]) == pytest.approx(4 / 7) and float(results["test_accuracy"]) == 6 / 8
    assert results["report_LOC_support"] == "2" and float(results["report_PER_precision"]) == 0.5


def test_stray_inside_tags_are_counted_in_one_warning(tmp_path, caplog):
    from bert_mgpu.data.tagged import read_tagged

    path = tmp_path / "train.txt"
    path.write_text("a O\nb I-PER\nc I-PER\n\nd B-LOC\ne I-PER\n")
    with caplog.at_level("WARNING", logger="bert_mgpu"):
        read_tagged(str(path))
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 2 I- tag(s) follow O or another type (first at {path}:2); read as conlleval reads them, "
        "each starts an entity"]
    (tmp_path / "io.txt").write_text("a O\nb I-PER\n")  # the IO scheme: nothing to warn of
    caplog.clear()
    with caplog.at_level("WARNING", logger="bert_mgpu"):
        read_tagged(str(tmp_path / "io.txt"))
    assert caplog.records == []


def test_a_crf_tagger_learns_on_two_towers_and_its_google_export_loads_back_with_the_transitions(tmp_path):
    """--crf: the transitions learn that I-PER follows B-PER, not O; predictions are Viterbi paths; the
    google export carries crf/transitions and loads back as a CRF tagger giving the same entities."""
    from conftest import NER_TAGS, learning_release, ner_sentences

    import bert_mgpu

    release = learning_release(str(tmp_path / "release"))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    tagger = bert_mgpu.BertTagger.from_pretrained(release, labels=NER_TAGS, towers=towers, max_seq_length=16,
                                                  doc_stride=6, precision="float32", crf=True)
    tagger.fit(ner_sentences(512, 3, 30), str(tmp_path / "out"), epochs=14, learning_rate=5e-3,
               warmup_proportion=0.05)  # test F1 0.973, transitions 1.54 apart (2026-11-28)
    test = ner_sentences(40, 15, 40, seed=2, split="test")
    results = tagger.evaluate(test)
    assert results["eval_f1"] > 0.9, results
    t = tagger.model.crf.transitions.numpy()
    o, b_per, i_per = (NER_TAGS.index(x) for x in ("O", "B-PER", "I-PER"))
    assert t[b_per, i_per] > t[o, i_per] + 1.0, t  # learnt: I-PER continues a person, never starts one
    with pytest.raises(bert_mgpu.UserError, match="has no CRF; export the model as google or saved_model"):
        tagger.export(str(tmp_path / "hf"), "hf")
    tagger.export(str(tmp_path / "google"), "google")
    back = bert_mgpu.BertTagger.from_pretrained(str(tmp_path / "google"), towers=towers, max_seq_length=16,
                                                doc_stride=6, precision="float32")
    assert back.model.crf is not None and np.array_equal(back.model.crf.transitions.numpy(), t)
    assert back.predict_tags(test) == tagger.predict_tags(test)
    # The SavedModel decodes the same Viterbi paths in its graph, each window's words together, long texts in
    # windows; it reads back as a CRF tagger.
    import tensorflow as tf

    tagger.export(str(tmp_path / "served"), "saved_model")
    short = ner_sentences(40, 2, 40, seed=4, split="short")
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"](
        text=tf.constant([" ".join(s.tokens) for s in short]))["tags"].numpy()
    expected = tagger.predict_tags(short)  # Viterbi paths on the host
    for row, want in zip(served, expected):
        assert [t.decode() for t in row[:len(want)]] == want
    again = bert_mgpu.BertTagger.from_pretrained(str(tmp_path / "served"), towers=towers, max_seq_length=16,
                                                 doc_stride=6, precision="float32")
    assert again.model.crf is not None and np.allclose(again.model.crf.transitions.numpy(), t)


def test_the_served_chunking_equals_conllevals_on_random_tag_sequences():
    """The SavedModel's entities (TensorFlow ops over every text's words end to end) against
    core.entities, per text, on random BIO/BIOES/BILOU/IO sequences and texts with no words."""
    import tensorflow as tf

    from bert_mgpu.core.entities import entities

    labels = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "L-LOC", "U-LOC", "ORG"]
    rng = np.random.default_rng(0)
    rows = [[labels[i] for i in rng.integers(0, len(labels), int(rng.integers(0, 12)))] for _ in range(300)]
    rows += [[], ["I-PER"], ["E-PER", "I-PER"]]
    flat = [labels.index(t) for row in rows for t in row]
    lengths = np.array([len(r) for r in rows])
    last = np.zeros(len(flat), bool)
    last[np.cumsum(lengths)[lengths > 0] - 1] = True
    first, final, kind, types = TokenClassification().serving_chunks(tf.constant(flat, tf.int32),
                                                                    tf.constant(last), labels)
    row_of = np.repeat(np.arange(len(rows)), lengths)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    got = [[] for _ in rows]
    for a, b, k in zip(first.numpy(), final.numpy(), kind.numpy()):
        assert row_of[a] == row_of[b]
        got[row_of[a]].append((types[k], int(a - starts[row_of[a]]), int(b - starts[row_of[a]]) + 1))
    assert got == [entities(row) for row in rows]


def test_a_taggers_auto_class_weights_count_the_tags_its_loss_reads_and_a_crf_refuses_them(google_release, tmp_path):
    """--class_weights=auto on a tagger: each tag's count over the labelled first pieces of the training
    windows (a word in two windows twice, as the loss reads it), scikit-learn's balanced weights from them.
    A CRF refuses them, and R-Drop (a softmax's divergence) too."""
    import bert_mgpu
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.train.train_config import TrainConfig

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1)
    sentences = [(["paris", "is", "big"], ["B-LOC", "O", "O"]), (["bob", "smith", "ran"], ["B-PER", "I-PER", "O"]),
                 (["film"] * 20, ["O"] * 20)]  # 20 words in windows of 14 pieces, 7 apart: 6 words counted twice
    tagger = bert_mgpu.BertTagger.from_pretrained(google_release, labels=["O", "B-LOC", "B-PER", "I-PER"],
                                                  max_seq_length=16, doc_stride=7, towers=towers, precision="float32")
    windows, _, _ = tagger._training_data(sentences)
    counts = tagger._label_counts(windows)
    films = sum(sum(1 for word in w.words if word >= 0) for w in windows[2:])
    assert films > 20 and list(counts) == [3 + films, 1, 1, 1]
    loss = tagger._training_loss(TrainConfig(class_weights="auto"), windows)
    assert tagger.objective.class_weights is None  # evaluation keeps the plain loss
    assert loss.__self__.class_weights == pytest.approx(tuple(counts.sum() / (4 * c) for c in counts))
    crf = bert_mgpu.BertTagger.from_pretrained(google_release, labels=["O", "B-LOC"], max_seq_length=16, crf=True,
                                               towers=towers, precision="float32")
    with pytest.raises(UserError, match="a CRF's loss is the whole path's likelihood"):
        crf.fit([(["paris"], ["B-LOC"])], str(tmp_path / "crf"), class_weights="auto", epochs=1, train_batch_size=1)
    with pytest.raises(UserError, match="--rdrop_alpha compares two passes' softmax over each token's tags; a CRF"):
        crf.fit([(["paris"], ["B-LOC"])], str(tmp_path / "crf"), rdrop_alpha=4.0, epochs=1, train_batch_size=1)
    assert not os.path.exists(tmp_path / "crf")  # refused before anything was written
    assert tagger._training_loss(TrainConfig(rdrop_alpha=4.0), windows).__qualname__ == "with_rdrop.<locals>.loss"
