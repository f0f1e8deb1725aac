"""Each head kind's objective on small numbers: labels checked and encoded, the loss, predictions, prediction
files, export facts and serving outputs. The end-to-end tests (test_run_classifier, test_regression,
test_multi_label, test_golden) run them inside whole runs."""

import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.tasks import Example
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
    loss, _ = kind.loss(model(), {}, tf.constant([0, 1]))
    p = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
    assert float(loss) == pytest.approx(-np.mean(np.log([p[0, 0], p[1, 1]])), rel=1e-6)
    np.testing.assert_allclose(kind.predict(LOGITS), p, rtol=1e-6)
    files = kind.prediction_files(p, ["neg", "pos"], ["a", "b"])
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
    assert "not a number" in kind.check_label("fresh", None)
    with pytest.raises(UserError, match="example c has label 'x', not a number"):
        kind.encode([Example("c", "z", label="x")], [])
    loss, _ = kind.loss(model(), {}, tf.constant([1.0, 0.0]))
    assert float(loss) == pytest.approx(((2.0 - 1.0) ** 2 + 0.5 ** 2) / 2)
    assert kind.predict(LOGITS).tolist() == [2.0, 0.5]
    assert kind.prediction_files(np.array([2.0, 0.5]), [], ["a", "b"])["predictions.tsv"] == \
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
    assert kind.prediction_files(probabilities, ["news", "sport"], ["a", "b"], threshold=0.5)["predict.txt"] == \
        "news\nnews|sport\n"
    assert kind.run_facts(0.3) == {"label_separator": "|", "threshold": 0.3}
    assert kind.main_metric() == "eval_f1_micro" and kind.hf_facts(["a"])["problem_type"] == \
        "multi_label_classification"


def test_the_task_type_flag_is_read_in_one_place():
    assert sorted(KINDS) == ["classification", "multi_label", "regression"]
    with pytest.raises(UserError, match="--task_type=ner: expected classification, regression, multi_label"):
        objective("ner")
