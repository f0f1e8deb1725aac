"""Every head with a last batch that leaves one tower of two, or two of three, empty, on the strategy a GPU run
builds (NCCL-hinted collectives, run as RING on CPU devices): a last batch of fewer rows than towers leaves towers
empty, which crashed the masked-LM gather and aborted a token head's all-gather (issue 65, items 1 and 2).
`Trainer.evaluate` must weigh an empty tower 0 and `predict_logits` give each row its own outputs, twice in a
row (a failed collective aborts every later one in the process)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_python, tiny_config

from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import training

HEADS = ("classification", "regression", "multi_label", "tagger", "tagger_crf", "span", "multiple_choice",
         "pretraining")
LENGTH, VOCAB = 8, 60


def head(name, config):
    """(model, loss_fn, rows(n) -> (features, labels)) of one head kind, built in the current scope. Every
    row has as many labelled tokens (predictions, choices) as the others, so a mean over rows is the mean
    over the batch."""
    from bert_mgpu.model import mlm_objective, objectives
    from bert_mgpu.model.choice_objectives import MultipleChoice
    from bert_mgpu.model.pretraining_model import build_pretrainer
    from bert_mgpu.model.span_objectives import SpanExtraction
    from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification

    rng = np.random.default_rng(HEADS.index(name))

    def text(n, shape=()):
        ids = rng.integers(5, VOCAB, (n, *shape, LENGTH)).astype(np.int32)
        return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones(ids.shape, bool)}

    tokens = lambda n: np.where(np.arange(LENGTH) % 3 == 1, rng.integers(0, 5, (n, LENGTH)), -1).astype(np.int32)  # noqa: E731
    if name in ("classification", "regression", "multi_label"):
        width, objective = {"classification": (3, objectives.Classification()), "regression": (
            1, objectives.Regression()), "multi_label": (4, objectives.MultiLabel())}[name]
        labels = {"classification": lambda n: rng.integers(0, 3, n).astype(np.int32),
                  "regression": lambda n: rng.normal(size=n).astype(np.float32),
                  "multi_label": lambda n: rng.integers(0, 2, (n, 4)).astype(np.float32)}[name]
        return modeling.build_classifier(config, width), objective.loss, lambda n: (text(n), labels(n))
    if name in ("tagger", "tagger_crf"):
        crf = name == "tagger_crf"
        loss = (CRFTagging() if crf else TokenClassification()).loss
        return modeling.build_tagger(config, 5, crf=crf), loss, lambda n: (text(n), tokens(n))
    if name == "span":
        return modeling.build_span_model(config), SpanExtraction().loss, lambda n: (
            text(n), np.sort(rng.integers(0, LENGTH, (n, 2)), axis=1).astype(np.int32))
    if name == "multiple_choice":
        return modeling.build_choice_model(config), MultipleChoice().loss, lambda n: (
            text(n, (3,)), rng.integers(0, 3, n).astype(np.int32))

    def pretraining_rows(n):
        features = text(n)
        features["mask_positions"] = np.sort(rng.permuted(np.tile(np.arange(1, LENGTH), (n, 1)), axis=1)[:, :3], 1)
        labels = {"masked_lm_ids": rng.integers(5, VOCAB, (n, 3)).astype(np.int32),
                  "masked_lm_weights": np.ones((n, 3), np.float32),
                  "next_sentence_labels": rng.integers(0, 2, n).astype(np.int32)}
        return features, labels

    return build_pretrainer(config, nsp=True), mlm_objective.MaskedLanguageModel().loss, pretraining_rows


def remainders(towers, empty=None):
    """The row counts whose last batch leaves towers empty: 1..towers-1 rows alone and after a whole batch
    (2 rows a tower); `empty` keeps those that leave that many towers empty."""
    rows = [r for r in range(1, towers) if empty is None or towers - r == empty]
    return [*rows, *(2 * towers + r for r in rows)]


def check_every_head(towers, empty=None):
    """{head: {rows: (worst |loss - reference| / reference, worst |logits - model's|)}} over the last-batch
    remainders that leave towers empty (`remainders`), on `towers` towers of a GPU run's strategy."""
    names = [f"/cpu:{i}" for i in range(towers)]
    gpus = tuple(str(i) for i in range(towers))
    strategy = distribute.make_strategy(devices.plan_devices(towers, 1, gpus), devices=names, timeout_seconds=120)
    config = tiny_config(VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    found = {}
    for name in HEADS:
        keras.utils.set_random_seed(3)
        with strategy.scope():
            model, loss_fn, rows = head(name, config)
        trainer = training.Trainer(strategy, model, loss_fn=loss_fn)
        batch = 2 * towers
        for n in remainders(towers, empty):
            features, labels = rows(n)
            loss, stats = loss_fn(model, features, labels, training=False)  # one batch, no tower
            reference = {"loss": float(loss), **{k: float(v) for k, v in stats.items()}}
            got = trainer.evaluate(tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch))
            assert set(got) == set(reference), (name, n, got, reference)
            eval_error = max(abs(got[k] - v) / max(abs(v), 1e-3) for k, v in reference.items())
            logits_error = 0.0
            direct = model(features, training=False)
            if not isinstance(direct, dict):  # the pretrainer is scored, not predicted
                index = np.arange(n, dtype=np.int32)
                ds = tf.data.Dataset.from_tensor_slices((features, labels, index)).batch(batch)
                for _ in range(2):  # an aborted collective would fail the second pass
                    logits, got_labels = trainer.predict_logits(ds)
                    assert logits.shape == tuple(direct.shape), (name, n, logits.shape, direct.shape)
                    np.testing.assert_array_equal(got_labels, labels)
                    logits_error = max(logits_error, float(np.abs(logits - direct.numpy()).max()))
            found.setdefault(name, {})[n] = (eval_error, logits_error)
    return found


def assert_exact(found, rows):
    assert set(found) == set(HEADS)
    for name, cases in found.items():
        assert sorted(cases) == rows, (name, cases)
        for n, (eval_error, logits_error) in cases.items():
            assert eval_error < 1e-4 and logits_error < 1e-5, (name, n, eval_error, logits_error)


def test_every_head_with_every_remainder_on_two_towers():
    assert remainders(2) == [1, 5]  # one tower of two empty, alone and after a whole batch
    assert_exact(check_every_head(2), remainders(2))


@pytest.mark.process  # a process of its own, configured with three CPU devices
def test_every_head_with_two_of_three_towers_empty():
    """One row on three towers, alone and after a whole batch: two towers empty. One empty tower, whatever
    the count of towers, is the two-tower test's case: the same code."""
    assert remainders(3) == [1, 2, 7, 8] and remainders(3, empty=2) == [1, 7]
    code = ("import json, tensorflow as tf\nfrom test_empty_towers import check_every_head\n"
            "cpu = tf.config.list_physical_devices('CPU')[0]\n"
            "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)\n"
            "print('FOUND', json.dumps(check_every_head(3, empty=2)))\n")
    proc = run_python(code, fresh=True, timeout=600)
    found = json.loads(proc.stdout.split("FOUND ", 1)[1])
    assert_exact({name: {int(n): tuple(v) for n, v in cases.items()} for name, cases in found.items()}, [1, 7])
