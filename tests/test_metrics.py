import numpy as np

from bert_mgpu import metrics


def test_accuracy_f1_mcc_on_known_values():
    y = [1, 1, 1, 0, 0, 0, 1, 0]
    p = [1, 1, 0, 0, 1, 0, 1, 0]  # tp=3 fn=1 fp=1 tn=3
    assert metrics.accuracy(y, p) == 0.75
    assert metrics.f1(y, p) == 0.75
    assert abs(metrics.matthews_corrcoef(y, p) - 0.5) < 1e-12  # (9-1)/sqrt(4*4*4*4)
    assert metrics.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == -1.0
    assert metrics.matthews_corrcoef([0, 0, 1], [0, 0, 0]) == 0.0


def test_multiclass_mcc_matches_binary_formula_when_two_classes():
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    tp, tn = np.sum((y == 1) & (p == 1)), np.sum((y == 0) & (p == 0))
    fp, fn = np.sum((y == 0) & (p == 1)), np.sum((y == 1) & (p == 0))
    want = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    assert abs(metrics.matthews_corrcoef(y, p) - want) < 1e-12
