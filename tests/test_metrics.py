import numpy as np
import pytest

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


def test_pearson_spearman_and_ranks_on_known_values():
    from bert_mgpu.metrics import pearson, ranks, spearman

    a, b = [1, 2, 2, 3, 5], [2, 1, 4, 4, 9]
    assert list(ranks(a)) == [1, 2.5, 2.5, 4, 5] and list(ranks(b)) == [2, 1, 3.5, 3.5, 5]
    # By hand: ranks centred (-2, -.5, -.5, 1, 2) and (-1, -2, .5, .5, 2): 7.25 / sqrt(9.5 * 9.5).
    assert spearman(a, b) == pytest.approx(7.25 / 9.5)
    # Centred a (-1.6, -.6, -.6, .4, 2.4), b (-2, -3, 0, 0, 5): 17 / sqrt(9.2 * 38).
    assert pearson(a, b) == pytest.approx(17 / (9.2 * 38) ** 0.5)
    assert pearson(a, [2 * x + 1 for x in a]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # undefined for a constant: 0, as the other metrics
