"""Each head kind's objective on small numbers: labels checked and encoded, the loss, predictions, prediction
files, export facts and serving outputs. The end-to-end tests (test_run_classifier, test_regression,
test_multi_label, test_golden) run them inside whole runs."""

import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.examples import Example
from bert_mgpu.model.objectives import KINDS, objective

LOGITS = np.array([[2.0, -1.0], [0.5, 1.5]], np.float32)


def model(logits=LOGITS):
    return lambda features, training=True: tf.constant(logits)


def test_classification():
    kind = objective("classification")
    rows = [Example("a", "x", label="pos"), Example("b", "y", label="neg"), Example("c", "z")]
    assert kind.encode(rows, ["neg", "pos"]).tolist() == [1, 0, -1]
    assert kind.label_set(rows) == ["neg", "pos"] and kind.width(["neg", "pos"]) == 2
    assert kind.check_label("pos", ["neg", "pos"]) is None
    assert kind.check_label("x", ["neg", "pos"]) == "label 'x' is not one of neg, pos"
    assert kind.settings() == {}  # what classification run directories always recorded: they resume
    assert objective("regression").settings() == {"task_type": "regression"}
    assert objective("multi_label").settings() == {"task_type": "multi_label"}
    assert "a score, not a class" in kind.check_label("0.5", None)
    assert kind.check_label("inf", None) is None and kind.check_label("NaN", None) is None  # class names, no scores
    loss, _ = kind.loss(model(), {}, tf.constant([0, 1]))
    p = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
    assert float(loss) == pytest.approx(-np.mean(np.log([p[0, 0], p[1, 1]])), rel=1e-6)
    np.testing.assert_allclose(kind.predict(LOGITS), p, rtol=1e-6)
    files = kind.read_as(label_names=["neg", "pos"]).prediction_files(p, [Example("a", "x"), Example("b", "y")])
    assert files["predict.txt"] == "neg\npos\n" and sorted(files) == ["predict.txt", "predictions.tsv",
                                                                       "test_results.tsv"]
    assert kind.hf_facts(["neg", "pos"])["id2label"] == {"0": "neg", "1": "pos"}
    out = kind.serving(tf.constant(LOGITS), tf.constant(["neg", "pos"]))
    assert out["labels"].numpy().tolist() == [b"neg", b"pos"] and out["label_ids"].numpy().tolist() == [0, 1]
    assert kind.main_metric("cola") == "eval_mcc" and kind.main_metric(None) == "eval_accuracy"


def test_regression():
    kind = objective("regression")
    rows = [Example("a", "x", label="0.5"), Example("b", "y")]
    encoded = kind.encode(rows, [])
    assert encoded[0] == 0.5 and np.isnan(encoded[1]) and kind.width(["ignored"]) == 1 and not kind.has_classes
    assert kind.check_label("fresh", None) == "label 'fresh' is not a finite number (--task_type=regression)"
    assert kind.check_label("nan", None) == "label 'nan' is not a finite number (--task_type=regression)"
    assert kind.check_label("-1e3", None) is None and kind.check_label("inf", None) is not None
    with pytest.raises(UserError, match="example c has label 'x', not a number"):
        kind.encode([Example("c", "z", label="x")], [])
    loss, _ = kind.loss(model(), {}, tf.constant([1.0, 0.0]))
    assert float(loss) == pytest.approx(((2.0 - 1.0) ** 2 + 0.5 ** 2) / 2)
    assert kind.predict(LOGITS).tolist() == [2.0, 0.5]
    assert kind.prediction_files(np.array([2.0, 0.5]), rows)["predictions.tsv"] == \
        "id\tscore\na\t2.000000\nb\t0.500000\n"
    assert kind.serving(tf.constant(LOGITS), None)["scores"].numpy().tolist() == [2.0, 0.5]
    assert kind.main_metric() == "eval_pearson" and kind.hf_facts([])["problem_type"] == "regression"


def test_multi_label():
    kind = objective("multi_label", separator="|")
    rows = [Example("a", "x", label="news|sport"), Example("b", "y", label="")]
    assert kind.label_set(rows) == ["news", "sport"] and kind.empty_label_allowed()
    assert kind.encode(rows, ["news", "sport", "war"]).tolist() == [[1, 1, 0], [0, 0, 0]]
    assert "'art' is not one of news" in kind.check_label("news|art", ["news"])
    probabilities = kind.predict(LOGITS)
    np.testing.assert_allclose(probabilities, 1 / (1 + np.exp(-LOGITS)), rtol=1e-6)
    assert kind.read_as(label_names=["news", "sport"], threshold=0.5).prediction_files(probabilities, rows)[
        "predict.txt"] == \
        "news\nnews|sport\n"
    assert kind.run_facts(0.3) == {"label_separator": "|", "threshold": 0.3}
    assert kind.main_metric() == "eval_f1_micro" and kind.hf_facts(["a"])["problem_type"] == \
        "multi_label_classification"


def test_the_task_type_flag_is_read_in_one_place():
    assert sorted(KINDS) == ["classification", "multi_label", "regression"]
    with pytest.raises(UserError, match="--task_type=ner: expected classification, regression, multi_label"):
        objective("ner")


def test_pretraining_loss_is_googles_on_the_real_predictions_and_names_its_results_as_google_does():
    """Masked-LM cross-entropy over the predictions whose weight is 1 (padding predictions count for
    nothing), plus NSP's cross-entropy; the same objective names google-bert's eval results and the
    architecture a Hugging Face export writes."""
    from bert_mgpu.model.mlm_objective import MaskedLanguageModel
    from bert_mgpu.model.objective import Objective

    mlm = np.array([[[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]], [[1.0, 1.0, 1.0], [9.0, -9.0, 0.0]]], np.float32)
    nsp = np.array([[0.0, 2.0], [1.0, -1.0]], np.float32)
    ids, weights, nsp_labels = np.array([[0, 2], [1, 0]]), np.array([[1, 1], [1, 0]]), np.array([1, 1])
    kind = MaskedLanguageModel()
    assert isinstance(kind, Objective) and not hasattr(kind, "encode")  # no label cells to read
    out = lambda features, training=True: {"mlm_logits": tf.constant(mlm), "nsp_logits": tf.constant(nsp)}  # noqa: E731
    labels = {"masked_lm_ids": tf.constant(ids, tf.int32), "masked_lm_weights": tf.constant(weights, tf.float32),
              "next_sentence_labels": tf.constant(nsp_labels, tf.int32)}
    features = {"padding_mask": tf.constant([[True, True, False], [True, True, True]])}
    loss, stats = kind.loss(out, features, labels)

    def xent(logits, i):
        return float(np.log(np.exp(logits).sum()) - logits[i])

    want_mlm = (xent(mlm[0, 0], 0) + xent(mlm[0, 1], 2) + xent(mlm[1, 0], 1)) / (3 + 1e-5)  # [1, 1] weighs 0
    want_nsp = (xent(nsp[0], 1) + xent(nsp[1], 1)) / 2
    assert float(stats["mlm_loss"]) == pytest.approx(want_mlm, rel=1e-5)
    assert float(stats["nsp_loss"]) == pytest.approx(want_nsp, rel=1e-5)
    assert float(loss) == pytest.approx(want_mlm + want_nsp, rel=1e-5)
    assert float(stats["mlm_accuracy"]) == pytest.approx(1 / (3 + 1e-5))  # only [0, 0] is right
    assert float(stats["nsp_accuracy"]) == 0.5 and float(stats["tokens_per_sequence"]) == 2.5
    assert kind.evaluate({**{k: float(v) for k, v in stats.items()}, "loss": float(loss)}) == pytest.approx(
        {"masked_lm_loss": want_mlm, "masked_lm_accuracy": 1 / (3 + 1e-5), "next_sentence_loss": want_nsp,
         "next_sentence_accuracy": 0.5, "loss": want_mlm + want_nsp}, rel=1e-5)
    assert kind.main_metric() == "masked_lm_accuracy"
    assert kind.hf_architecture({"cls/seq_relationship/output_weights": 0}) == "BertForPreTraining"
    assert kind.hf_architecture({"cls/predictions/output_bias": 0}) == "BertForMaskedLM"
    assert objective("classification").hf_architecture({}) == "BertForSequenceClassification"


def _softmax_xent(logits, labels):
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_p, labels[..., None], -1)[..., 0], np.exp(log_p)


@pytest.mark.parametrize("weights, gamma", [((0.5, 2.0, 1.0), 0.0), (None, 2.0), ((3.0, 0.25, 1.0), 1.5)])
def test_class_weights_and_focal_loss_equal_a_numpy_reference(weights, gamma):
    """Lin et al. 2017: -(1 - p)^gamma log p times the label's weight, a mean over the batch, for the classifier
    (rows) and the tagger (labelled tokens; -1 elsewhere)."""
    from bert_mgpu.model.tagging_objectives import TokenClassification

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (6, 3)).astype(np.float32)
    labels = rng.integers(0, 3, 6).astype(np.int32)
    per, p = _softmax_xent(logits.astype(np.float64), labels)
    scale = (1 - np.take_along_axis(p, labels[:, None], 1)[:, 0]) ** gamma * (
        np.asarray(weights)[labels] if weights else 1.0)
    obj = objective("classification").reweighted(weights, gamma)
    got = obj.example_losses(tf.constant(logits), tf.constant(labels)).numpy()
    np.testing.assert_allclose(got, per * scale, rtol=1e-5)
    assert objective("classification").class_weights is None  # reweighted is a copy

    tokens = rng.normal(0, 3, (2, 5, 3)).astype(np.float32)
    tags = rng.integers(0, 3, (2, 5)).astype(np.int32)
    tags[0, 3:] = tags[1, 0] = -1
    known = tags >= 0
    per, p = _softmax_xent(tokens.astype(np.float64), np.where(known, tags, 0))
    pt = np.take_along_axis(p, np.where(known, tags, 0)[..., None], -1)[..., 0]
    scale = (1 - pt) ** gamma * (np.asarray(weights)[np.where(known, tags, 0)] if weights else 1.0)
    loss, _ = TokenClassification().reweighted(weights, gamma).token_stats(tf.constant(tokens), tf.constant(tags))
    assert float(loss) == pytest.approx((per * scale)[known].sum() / known.sum(), rel=1e-5)


def test_auto_class_weights_are_sklearns_balanced_and_other_heads_refuse_them():
    from bert_mgpu.model.objective import label_weights
    from bert_mgpu.model.tagging_objectives import CRFTagging

    assert label_weights([6, 2, 0, 4]) == pytest.approx((12 / 24, 12 / 8, 1.0, 12 / 16))
    for obj, why in ((objective("regression"), "not a regression head's loss"),
                     (objective("multi_label"), "not a multi_label head's loss"),
                     (CRFTagging(), "a CRF's loss is the whole path's likelihood")):
        with pytest.raises(UserError, match=why):
            obj.reweighted((1.0, 2.0), 0.0)


def test_every_objective_reads_outputs_with_the_same_two_calls():
    """Issue 67's seam: `evaluate(outputs, targets)` and `prediction_files(predictions, rows)` for every head
    kind; what a kind reads besides (label names, a threshold, a file format) is set by `read_as`, on a copy."""
    import inspect

    from bert_mgpu.model.choice_objectives import MultipleChoice
    from bert_mgpu.model.mlm_objective import MaskedLanguageModel
    from bert_mgpu.model.span_objectives import SpanExtraction
    from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification

    kinds = [objective(name) for name in KINDS] + [TokenClassification(), CRFTagging(), SpanExtraction(),
                                                   MultipleChoice(), MaskedLanguageModel()]
    for kind in kinds:
        assert list(inspect.signature(kind.evaluate).parameters)[:2] == ["outputs", "targets"], kind.name
        assert list(inspect.signature(kind.prediction_files).parameters) == ["predictions", "rows"], kind.name
    kind = objective("classification")
    reader = kind.read_as(label_names=["neg", "pos"], metric_names=("f1_macro",))
    assert kind.label_names == () and reader.label_names == ["neg", "pos"]  # a copy: the objective is unchanged
    with pytest.raises(TypeError, match="reads no data_format"):
        kind.read_as(data_format="cluener")
    results = reader.evaluate(LOGITS, np.array([0, 0]))  # predicted 0 and 1
    assert results["eval_accuracy"] == 0.5 and results["eval_f1_macro"] == pytest.approx((2 / 3 + 0) / 2)
    assert results.confusion.tolist() == [[1, 1], [0, 0]] and results.report["neg"][:3] == (1.0, 0.5,
                                                                                              pytest.approx(2 / 3))
    assert isinstance(results, dict) and "report" not in results  # eval_results.txt holds the numbers only
