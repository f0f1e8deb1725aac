"""The span head and BertQuestionAnswerer: transformers' BertForQuestionAnswering on the same weights (logits
to 1e-4, the same loss), a question answerer that learns on two towers and answers long contexts in windows,
and its exports read back."""

import json
import os

import keras
import numpy as np
import pytest
from conftest import WORDS, hf_state, learning_release, tiny_config, write_google_release

from bert_mgpu.data.squad import Question
from bert_mgpu.model import modeling
from bert_mgpu.model.span_objectives import GOOGLE_HEAD, SpanExtraction


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "keras_hub"])
def test_logits_and_loss_equal_transformers_on_the_same_weights(reference, fused):
    import torch
    import transformers

    config = tiny_config(40, hidden_act="gelu")
    keras.utils.set_random_seed(5)
    model = modeling.build_span_model(config, fused=fused)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 40, (3, 12)).astype(np.int32)
    segments = (np.arange(12)[None, :] >= 5).astype(np.int32).repeat(3, 0)
    mask = np.ones_like(ids, bool)  # no padding: transformers' loss counts padded positions, ours does not
    labels = np.array([[6, 8], [0, 0], [11, 11]], np.int32)
    features = {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}
    ours = model(features, training=False).numpy()

    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "encoder_ln_mode"},
                                        layer_norm_eps=1e-12)
    theirs = transformers.BertForQuestionAnswering(hf_config).eval()
    missing, unexpected = theirs.load_state_dict({k: torch.tensor(v) for k, v in hf_state(model, GOOGLE_HEAD).items()},
                                                 strict=False)
    assert all(".pooler." in u for u in unexpected) and all("position_ids" in m for m in missing), (missing,
                                                                                                   unexpected)
    with torch.no_grad():
        out = theirs(input_ids=torch.tensor(ids, dtype=torch.long), token_type_ids=torch.tensor(segments).long(),
                     attention_mask=torch.tensor(mask).long(), start_positions=torch.tensor(labels[:, 0]).long(),
                     end_positions=torch.tensor(labels[:, 1]).long())
    difference = max(np.abs(out.start_logits.numpy() - ours[:, :, 0]).max(),
                     np.abs(out.end_logits.numpy() - ours[:, :, 1]).max())
    print(f"largest logit difference {difference:.2e}")
    assert difference < 1e-4
    loss, stats = SpanExtraction().loss(lambda f, training: model(f, training=training), features, labels,
                                        training=False)
    assert float(loss) == pytest.approx(float(out.loss), abs=1e-5)
    both = (ours[:, :, 0].argmax(1) == labels[:, 0]) & (ours[:, :, 1].argmax(1) == labels[:, 1])
    assert float(stats["span_accuracy"]) == pytest.approx(both.mean())


def test_padding_never_changes_a_windows_loss():
    """A window's loss is the same alone or padded in a batch with a longer one: padding never scores."""
    keras.utils.set_random_seed(1)
    model = modeling.build_span_model(tiny_config(40))
    rng = np.random.default_rng(1)
    ids = rng.integers(5, 40, (2, 10)).astype(np.int32)
    ids[0, 6:] = 0
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 0}
    labels = np.array([[2, 4], [3, 9]], np.int32)
    both, _ = SpanExtraction().loss(lambda f, training: model(f, training=training), features, labels, False)
    alone = [SpanExtraction().loss(lambda f, training: model(f, training=training),
                                   {k: v[i:i + 1, :6 if i == 0 else 10] for k, v in features.items()},
                                   labels[i:i + 1], False)[0] for i in (0, 1)]
    assert float(both) == pytest.approx(float(np.mean(alone)), abs=1e-5)


FILL = [w for w in WORDS if w not in ("brilliant", "awful")]


def marker_questions(count, low, high, seed=0, impossible=0.0):
    """A made-up reading task that needs the question: a context of WORDS with "brilliant" and "awful" each
    somewhere; the question names one of them ("awful ?"), the answer is that word. With `impossible`, that
    share of contexts lack one of the two, so a question may have no answer (v2)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        words = [str(rng.choice(FILL)) for _ in range(int(rng.integers(low, high)))]
        present = ["brilliant", "awful"]
        if rng.random() < impossible:
            present = [str(rng.choice(present))]
        for word in present:
            words.insert(int(rng.integers(0, len(words) + 1)), word)
        asked, context = str(rng.choice(["brilliant", "awful"])), " ".join(words)
        if asked in words:
            start = len(" ".join(words[:words.index(asked)] + [""]))
            out.append(Question(f"{seed}-{i}", f"{asked} ?", context, [(asked, start)]))
        else:
            out.append(Question(f"{seed}-{i}", f"{asked} ?", context, [], True))
    return out


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return learning_release(str(tmp_path_factory.mktemp("release")))


@pytest.mark.learning
def test_a_question_answerer_learns_on_two_towers_answers_long_contexts_in_windows_and_exports(tmp_path, release,
                                                                                                reference):
    """Trained with evaluation while training and the best model kept; contexts far longer than a window
    answered from the window the answer has most context in, with the context's own characters; the run
    directory, the Hugging Face, Google and SavedModel exports all give the same answers back."""
    import tensorflow as tf
    import torch
    import transformers

    import bert_mgpu

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    train = marker_questions(512, 3, 20)
    dev = marker_questions(32, 3, 20, seed=1)
    test = marker_questions(40, 20, 60, seed=2)  # 3 to 10 windows each
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(release, towers=towers, max_seq_length=24, doc_stride=6,
                                                        max_query_length=4, precision="float32")
    out = str(tmp_path / "out")
    history = qa.fit(train, out, epochs=40, learning_rate=2e-3, warmup_proportion=0.05, dev=dev,
                     eval_every_steps=160, load_best_model_at_end=True)
    assert history["loss"][-1] < 0.05, history["loss"]  # ln 2 where the question is not read
    assert max(history["eval_f1"]) == 100.0 and qa.best_step in history["eval_step"]
    assert os.path.exists(os.path.join(out, "best", "bert_mgpu.json"))
    results = qa.evaluate(test)
    assert results["eval_exact_match"] >= 95.0 and results["eval_examples"] == 40, results
    assert len(qa._windows(test)[0]) > 5 * len(test)

    context = "the film was awful ; the  BRILLIANT plot"
    (answer, other) = qa.predict([("brilliant ?", context), ("awful ?", context)])
    assert (answer["text"], answer["start"], answer["end"]) == ("BRILLIANT", 26, 35) and answer["probability"] > 0.5
    assert (other["text"], other["start"], other["end"]) == ("awful", 13, 18)
    assert context[26:35] == "BRILLIANT" and context[13:18] == "awful"

    # transformers' BertForQuestionAnswering reads the hf export and scores as the model does.
    qa.export(str(tmp_path / "hf"), "hf")
    config = json.load(open(tmp_path / "hf" / "config.json"))
    assert config["architectures"] == ["BertForQuestionAnswering"]
    theirs = transformers.BertForQuestionAnswering.from_pretrained(str(tmp_path / "hf")).eval()
    windows, _, logits = qa.logits(test[:4])
    ids = np.zeros((len(windows), 24), np.int64)
    segments, mask = np.zeros_like(ids), np.zeros_like(ids)
    for i, w in enumerate(windows):
        ids[i, :len(w.token_ids)], segments[i, :len(w.segment_ids)], mask[i, :len(w.token_ids)] = (
            w.token_ids, w.segment_ids, 1)
    with torch.no_grad():
        got = theirs(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments),
                     attention_mask=torch.tensor(mask))
    real = mask.astype(bool)
    assert np.abs(got.start_logits.numpy()[real] - logits[:, :24, 0][real]).max() < 1e-4
    assert np.abs(got.end_logits.numpy()[real] - logits[:, :24, 1][real]).max() < 1e-4

    # Each export and the run directory read back as --init_checkpoint, head and windows included.
    expected = qa.answer(test).predictions
    qa.export(str(tmp_path / "google"), "google")
    qa.export(str(tmp_path / "served"), "saved_model")
    for source in ("hf", "google", "served"):
        back = bert_mgpu.BertQuestionAnswerer.from_pretrained(str(tmp_path / source), towers=towers,
                                                              max_seq_length=24, doc_stride=6, max_query_length=4,
                                                              precision="float32")
        assert back.answer(test).predictions == expected, source
    loaded = bert_mgpu.BertQuestionAnswerer.from_pretrained(os.path.join(out, "best"), towers=towers,
                                                            precision="float32")  # as trained (see test_tagger)
    assert (loaded.max_seq_length, loaded.doc_stride, loaded.max_query_length) == (24, 6, 4)
    assert loaded.evaluate(test)["eval_f1"] == pytest.approx(results["eval_f1"], abs=1e-9)

    # The SavedModel answers raw strings in the graph as predict does, long contexts in windows; its ids
    # signature gives the start and end scores.
    loaded = tf.saved_model.load(str(tmp_path / "served"))
    pairs = [(q.question, q.context) for q in test] + [("brilliant ?", context), ("awful ?", "no answer here"),
                                                       ("awful ?", "Ünï cödé  awful ,tabs\tawful")]
    got = loaded.signatures["serving_default"](question=tf.constant([p[0] for p in pairs]),
                                               context=tf.constant([p[1] for p in pairs]))
    for i, want in enumerate(qa.predict(pairs)):
        assert got["answer"].numpy()[i].decode() == want["text"], (i, pairs[i])
        assert int(got["answer_start"][i]) == (want["start"] if want["text"] else -1), i
    scores = loaded.signatures["serving_ids"](token_ids=tf.constant(ids, tf.int32),
                                              segment_ids=tf.constant(segments, tf.int32))
    assert np.abs(scores["start_logits"].numpy()[real] - logits[:, :24, 0][real]).max() < 1e-4

    steps = qa.trained_steps
    again = qa.fit(train, out, epochs=40, learning_rate=2e-3, warmup_proportion=0.05, dev=dev, eval_every_steps=160)
    assert again.get("loss") is None and qa.trained_steps == steps  # resumed at its end: nothing to train


def test_version_2_learns_when_there_is_no_answer(tmp_path, release):
    """SQuAD 2.0's null answer: questions the context cannot answer are predicted "", with null odds."""
    import bert_mgpu

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    train = marker_questions(512, 3, 20, impossible=0.4)
    test = marker_questions(40, 3, 20, seed=3, impossible=0.4)
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(release, towers=towers, max_seq_length=24, doc_stride=6,
                                                        max_query_length=4, precision="float32",
                                                        version_2_with_negative=True)
    # 80 epochs of 3e-3: the loss sits near ln 2 (the question not read) until it drops, and when it drops
    # depends on the CPU's arithmetic; shorter runs left some head initializations there (NOTES 65, 68).
    qa.fit(train, str(tmp_path / "out"), epochs=80, learning_rate=3e-3, warmup_proportion=0.05)
    results = qa.evaluate(test)
    assert results["eval_NoAns_total"] + results["eval_HasAns_total"] == 40
    assert results["eval_HasAns_exact"] >= 90 and results["eval_NoAns_exact"] >= 90, results
    assert "eval_best_f1_thresh" in results and len(qa.answers.null_odds) == 40
    files = qa.reader().prediction_files(qa.answers, test)  # the answerer's own settings: SQuAD v2
    assert sorted(files) == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
    assert sum(1 for v in json.loads(files["predictions.json"]).values() if v == "") == results["eval_NoAns_total"]

    # The SavedModel gives the same answers, no-answers and null odds in the graph.
    import tensorflow as tf

    qa.export(str(tmp_path / "served"), "saved_model")
    served = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    got = served(question=tf.constant([q.question for q in test]), context=tf.constant([q.context for q in test]))
    assert [t.decode() for t in got["answer"].numpy()] == [qa.answers.predictions[q.qid] for q in test]
    assert got["null_odds"].numpy() == pytest.approx([qa.answers.null_odds[q.qid] for q in test], abs=1e-4)


@pytest.mark.process
def test_auto_batch_size_sizes_the_batch_for_windows_of_384_pieces(tmp_path, caplog):
    """--auto_batch_size at run_squad's length: the largest per-tower batch of 384-piece windows whose step
    fits the limit, the next one measured over it (both CPU allocators: .ci/run runs this again with oneDNN
    flipped)."""
    import logging
    import re

    import bert_mgpu

    caplog.set_level(logging.INFO, "bert_mgpu")
    release, _ = write_google_release(str(tmp_path / "release"), tiny_config(10 + len(WORDS),
                                                                             max_position_embeddings=512))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(release, towers=towers, max_seq_length=384,
                                                        precision="float32")
    best = qa.auto_batch_size(memory_limit_mb=96)
    assert qa.train_batch_size == best and 1 <= best <= 8
    peaks = dict(re.findall(r"(\d+): ([\d.]+ MiB(?: over)?)", caplog.text))
    assert not peaks[str(best)].endswith("over") and peaks[str(best + 1)].endswith("over"), caplog.text
