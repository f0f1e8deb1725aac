"""GlobalPointer (model/global_pointer.py) piece by piece: its span scores against a NumPy reference written
another way (RoPE as complex rotations) and, on the same weights, against transformers' encoder with that
reference on top; Su's loss against its formula; windows that hold each entity and read it back; the files it
reads; and its training step on the GPU path's objects."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import hf_state, tiny_config

from bert_mgpu.core.entities import entities, entity_scores, span_scores
from bert_mgpu.core.errors import UserError
from bert_mgpu.data import spans
from bert_mgpu.model.global_pointer import MASKED, SpanScores, build_global_pointer
from bert_mgpu.model.global_pointer_objective import GlobalPointerObjective, multilabel_crossentropy, span_targets


def reference_scores(projected, mask, types, size):
    """s_t(m, n) = Re(sum_i q_i(m) conj(k_i(n)) e^{i (m - n) theta_i}) / sqrt(size): RoPE's relative form, each
    feature pair (2i, 2i + 1) a complex number; spans with n < m or on padding MASKED."""
    batch, length, _ = projected.shape
    x = projected.reshape(batch, length, types, 2, size).astype(np.float64)
    q = x[..., 0, 0::2] + 1j * x[..., 0, 1::2]  # [batch, length, types, size / 2]
    k = x[..., 1, 0::2] + 1j * x[..., 1, 1::2]
    theta = 10000.0 ** (-2.0 * np.arange(size // 2) / size)
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]  # m - n
    turn = np.exp(1j * distance[:, :, None] * theta)  # [m, n, size / 2]
    scores = np.real(np.einsum("bmti,bnti,mni->btmn", q, np.conj(k), turn)) / np.sqrt(size)
    keep = mask[:, None, :, None] & mask[:, None, None, :] & (distance <= 0)[None, None]
    return np.where(keep, scores, MASKED)


def test_span_scores_equal_rotary_positions_written_as_complex_rotations():
    rng = np.random.default_rng(0)
    types, size = 3, 8
    projected = rng.normal(size=(2, 9, types * 2 * size)).astype(np.float32)
    mask = np.arange(9)[None, :] < np.array([[9], [5]])
    ours = SpanScores(types, size)(projected, mask).numpy()
    want = reference_scores(projected, mask, types, size)
    assert ours.shape == (2, types, 9, 9) and ours.dtype == np.float32
    assert np.abs(ours - want)[want > MASKED].max() < 1e-5 and np.array_equal(ours == MASKED, want == MASKED)
    assert (ours[1, :, 5:, :] == MASKED).all() and (ours[1, :, :, 5:] == MASKED).all()  # padding
    # The same query and key at every position: a span's score depends on its length alone.
    same = np.repeat(projected[:1, :1], 9, axis=1)
    flat = SpanScores(types, size)(same, np.ones((1, 9), bool)).numpy()[0, 0]
    assert np.allclose(flat[0, 3], [flat[i, i + 3] for i in range(6)], atol=1e-5)
    with pytest.raises(ValueError, match="head_size=5"):
        SpanScores(2, 5)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "keras_hub"])
def test_scores_equal_transformers_encoder_with_the_reference_head_on_the_same_weights(reference, fused):
    """transformers has no GlobalPointer: its BertForTokenClassification of types x 2 x size labels computes
    the encoder and the dense projection from the same weights, and the reference above turns its logits
    into span scores, which bert_mgpu's equal to 1e-4."""
    import torch
    import transformers

    config, types, size = tiny_config(40, hidden_act="gelu"), 2, 8
    keras.utils.set_random_seed(5)
    model = build_global_pointer(config, types, size, fused=fused)
    rng = np.random.default_rng(1)
    model.head.kernel.assign(rng.normal(scale=0.5, size=model.head.kernel.shape))  # scores of order 1, not 1e-3
    ids = rng.integers(5, 40, (3, 10)).astype(np.int32)
    mask = np.arange(10)[None, :] < np.array([[10], [6], [3]])
    ids[~mask] = 0
    ours = model({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}, training=False).numpy()
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "encoder_ln_mode"},
                                        num_labels=types * 2 * size, layer_norm_eps=1e-12)
    other = transformers.BertForTokenClassification(hf_config).eval()
    missing, unexpected = other.load_state_dict({k: torch.tensor(v) for k, v in hf_state(model).items()},
                                                strict=False)
    assert all(".pooler." in u for u in unexpected) and all("position_ids" in m for m in missing)
    with torch.no_grad():
        logits = other(input_ids=torch.tensor(ids, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    want = reference_scores(logits, mask, types, size)
    real = want > MASKED
    difference = np.abs(ours - want)[real].max()
    print(f"largest span score difference {difference:.2e} over {real.sum()} spans, scores up to "
          f"{np.abs(want[real]).max():.2f}")
    assert np.abs(want[real]).max() > 1 and difference < 1e-4 and np.array_equal(ours == MASKED, ~real)


def test_the_loss_is_sus_multilabel_cross_entropy_over_every_span():
    rng = np.random.default_rng(2)
    scores = rng.normal(scale=3, size=(2, 2, 4, 4)).astype(np.float32)
    scores[:, :, 3, 2] = MASKED  # an end before its start
    labels = np.array([[[0, 1, 2], [1, 0, 3], [-1, -1, -1]], [[1, 2, 2], [1, 2, 2], [-1, -1, -1]]], np.int32)
    targets = span_targets(labels, scores.shape).numpy()
    assert targets.sum() == 3 and targets[0, 0, 1, 2] == targets[0, 1, 0, 3] == targets[1, 1, 2, 2] == 1

    def formula(s, y):  # log(1 + sum over negatives of e^s) + log(1 + sum over positives of e^-s)
        return np.log1p(np.exp(s[y == 0].astype(np.float64)).sum()) + np.log1p(np.exp(-s[y == 1]).sum())

    want = [formula(s, y) for s, y in zip(scores.reshape(4, 16), targets.reshape(4, 16))]
    got = multilabel_crossentropy(tf.constant(targets.reshape(4, 16)), tf.constant(scores.reshape(4, 16))).numpy()
    assert np.allclose(got, want, rtol=1e-5)
    loss, stats = GlobalPointerObjective().loss(lambda f, training: tf.constant(scores), None, labels)
    assert float(loss) == pytest.approx(np.mean(want), rel=1e-5)
    chosen = scores > 0
    assert float(stats["span_f1"]) == pytest.approx(2 * (chosen & (targets == 1)).sum() / (chosen.sum() + 3))


def test_entities_are_scored_exactly_each_nested_one_on_its_own():
    true = [{("ORG", 0, 3), ("LOC", 2, 3)}, {("PER", 1, 2)}]
    predicted = [{("ORG", 0, 3), ("LOC", 2, 4)}, {("PER", 1, 2), ("LOC", 0, 1)}]
    results = GlobalPointerObjective().read_as(types=("LOC", "ORG", "PER")).evaluate(predicted, true)
    assert results == {"eval_precision": 0.5, "eval_recall": pytest.approx(2 / 3), "eval_f1": pytest.approx(4 / 7)}
    assert results.report == {"LOC": (0.0, 0.0, 0.0, 1), "ORG": (1.0, 1.0, 1.0, 1), "PER": (1.0, 1.0, 1.0, 1)}
    assert GlobalPointerObjective().main_metric() == "eval_f1"
    # On flat entities, the numbers conlleval's rules give their tags.
    tags = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "I-ORG"]]
    guess = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "I-ORG", "O"]]
    numbers, _ = span_scores([set(entities(t)) for t in tags], [set(entities(g)) for g in guess])
    want = entity_scores(tags, guess)
    assert numbers == {k: pytest.approx(want[k]) for k in ("precision", "recall", "f1")}
    with pytest.raises(UserError, match="transformers has no GlobalPointer"):
        GlobalPointerObjective().hf_architecture({})


def test_windows_hold_each_entity_and_perfect_scores_give_every_one_back(google_release):
    """Long sentences in windows of 8 pieces, 3 apart: an entity trains in each window that holds both its
    ends, at its words' first pieces; scores that are the targets themselves read back every entity once,
    nested ones included, from the window that owns its first word."""
    from bert_mgpu.data.tokenization import FullTokenizer

    tokenizer = FullTokenizer(f"{google_release}/vocab.txt")
    rng = np.random.default_rng(3)
    words = "the a movie film good bad great awful fun dull plot actor story love hate boring brilliant".split()
    sentences = []
    for n in range(6):
        tokens = [str(w) for w in rng.choice(words, int(rng.integers(4, 20)))]
        found = {("PER", i, i + 2) for i in range(0, len(tokens) - 1, 5)} | {("LOC", i + 1, i + 2)
                                                                           for i in range(0, len(tokens) - 1, 5)}
        sentences.append(spans.SpanSentence(str(n), tokens, sorted(found), 1))
    windows, entities = spans.span_windows(sentences, tokenizer, ["LOC", "PER"], 10, 3)
    assert len(windows) > len(sentences) and entities.shape == (len(windows), entities.shape[1], 3)
    for window, held in zip(windows, entities):
        for kind, start, end in held[held[:, 0] >= 0]:
            first, last = window.words[start], window.words[end]
            assert first >= 0 and last >= first  # first pieces of words
            assert (["LOC", "PER"][kind], first, last + 1) in sentences[window.sentence].entities
    scores = span_targets(entities, (len(windows), 2, 10, 10)).numpy() * 20 - 10
    found = spans.window_entities(windows, scores, len(sentences))
    assert found == [{(["LOC", "PER"].index(k), a, b) for k, a, b in s.entities} for s in sentences]


def test_files_are_read_with_nested_entities_kept_and_bad_ones_named_by_line(tmp_path):
    cluener = tmp_path / "train.json"
    cluener.write_text(json.dumps({"text": "中国银行在北京", "label": {"organization": {"中国银行": [[0, 3]]},
                                                                 "address": {"中国": [[0, 1]], "北京": [[5, 6]]}}},
                                  ensure_ascii=False) + "\n" + json.dumps({"text": "无"}) + "\n", encoding="utf-8")
    (one, bare) = spans.read_spans(str(cluener), split="train")
    assert one.tokens == list("中国银行在北京") and bare.entities is None and one.guid == "train-0"
    assert one.entities == [("address", 0, 2), ("organization", 0, 4), ("address", 5, 7)]  # nested kept
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text(json.dumps({"tokens": ["Bank", "of", "China"], "entities": [
        {"type": "ORG", "start": 0, "end": 3}, {"type": "LOC", "start": 2, "end": 3}]}) + "\n")
    assert spans.read_spans(str(tokens))[0].entities == [("ORG", 0, 3), ("LOC", 2, 3)]
    conll = tmp_path / "train.txt"
    conll.write_text("John B-PER\nSmith I-PER\nruns O\n\nParis B-LOC\n")
    assert [s.entities for s in spans.read_spans(str(conll))] == [[("PER", 0, 2)], [("LOC", 0, 1)]]
    assert spans.entity_types(spans.read_spans(str(cluener))) == ["address", "organization"]

    tokens.write_text(json.dumps({"tokens": ["a"], "entities": []}) + "\n" + json.dumps(
        {"tokens": ["a", "b"], "entities": [{"type": "X", "start": 1, "end": 3}]}) + "\n")
    with pytest.raises(UserError, match=rf"^{tokens}:2: X entity \[1, 3\) is outside the 2 tokens$"):
        spans.read_spans(str(tokens))
    cluener.write_text(json.dumps({"text": "中国", "label": {"LOC": {"中国": [[0, 0]]}}}, ensure_ascii=False) + "\n",
                       encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{cluener}:1: LOC '中国' at \[0, 0\] is '中' in the text$"):
        spans.read_spans(str(cluener))
    rows = spans.as_span_sentences([(["Bank", "of", "China"], [("ORG", 0, 3)]), "John runs",
                                         {"tokens": ["a"], "tags": ["B-X"]}])
    assert [(r.tokens, r.entities) for r in rows] == [(["Bank", "of", "China"], [("ORG", 0, 3)]),
                                                     (["John", "runs"], None), (["a"], [("X", 0, 1)])]
    with pytest.raises(UserError, match="input 0: an entity is a type and its token start and end"):
        spans.as_span_sentences([(["a"], [("X", 0)])])
    sentences = spans.read_spans(str(conll))
    with pytest.raises(UserError, match=rf"^{conll}:5: entity type 'LOC' is not one of the model's \(PER\)$"):
        spans.check_types(sentences, ["PER"], str(conll))


def test_a_training_step_on_the_gpu_runs_objects_keeps_both_towers_equal_and_two_towers_equal_one():
    """The step a 2-GPU run builds (devices.plan_devices of GPUs, make_strategy: CollectiveAllReduce with
    NCCL, run here as RING on the 2 CPU devices): in mixed_float16 the loss is finite and both towers'
    weights stay bit-equal over 2 steps; in float32 the first step's loss on 2 towers is the loss of the
    whole batch on one (each tower's mean over its half, averaged). The labels are `make gpu-check`'s probe
    (io/heads.py), nested spans included."""
    from bert_mgpu.io.heads import HEADS
    from bert_mgpu.parallel import devices, distribute
    from bert_mgpu.train import memory, optimization, training

    plan = devices.plan_devices(2, 1, ("0", "1"))
    strategy = distribute.make_strategy(plan, devices=["/cpu:0", "/cpu:1"], timeout_seconds=120)
    features, _ = memory.classifier_batch(8, 16)
    build, loss, labels = HEADS["global_pointer"].gpu_probe(tiny_config(500), 8, 16)
    assert (labels[::2, 1] >= 0).all() and (labels[1::2, 1] < 0).all()
    with strategy.scope():
        model = build()
        opt = optimization.create_optimizer(1e-3, 10, 0, float16=True)
    trainer = training.Trainer(strategy, model, opt, loss_fn=loss)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(2))
    losses = [float(trainer.train_step(b)[0]) for b in batches]
    assert np.all(np.isfinite(losses)) and trainer.applied_steps == 2, losses
    for v in model.trainable_variables:
        towers = [c.numpy() for c in strategy.experimental_local_results(v.value)]
        assert np.array_equal(towers[0], towers[1]), v.path

    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = build_global_pointer(tiny_config(500), 2, 16, "float32", dropout=0.0)
        opt = optimization.create_optimizer(1e-3, 10, 0)
    one = float(GlobalPointerObjective().loss(model, features, labels, training=False)[0])
    trainer = training.Trainer(strategy, model, opt, loss_fn=lambda m, f, y, training=True: GlobalPointerObjective(
    ).loss(m, f, y, training=False))
    (batch,) = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)))
    assert float(trainer.train_step(batch)[0]) == pytest.approx(one, rel=1e-5)


def test_evaluation_loss_is_the_training_loss_of_each_window_whatever_the_batches_widths(google_release):
    """Windows of 3 widths predicted one a batch: the prediction pads each to the widest with scores of 0,
    which the evaluation's loss must not count as spans; it is the mean of each window's own loss."""
    import bert_mgpu

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    gp = bert_mgpu.BertGlobalPointer.from_pretrained(google_release, types=["LOC", "PER"], towers=towers,
                                                     max_seq_length=32, head_size=8, precision="float32")
    sentences = [(["the", "movie"], [("LOC", 1, 2)]), (["a", "good", "actor", "story", "is", "fun"], [("PER", 2, 4)]),
                 (["the"] * 20, [("LOC", 0, 20), ("PER", 3, 5)])]
    results = gp.evaluate(sentences, batch_size=1)
    windows, entities = gp._windows(spans.as_span_sentences(sentences))
    each = []
    for window, held in zip(windows, entities):
        ids = np.array([window.token_ids], np.int32)
        features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 0}
        each.append(float(gp.objective.loss(gp.model, features, held[None], training=False)[0]))
    assert results["eval_loss"] == pytest.approx(np.mean(each), rel=1e-5) and 0 < results["eval_loss"] < 50
    assert results["eval_examples"] == 3 and set(gp.report) == {"LOC", "PER"}
