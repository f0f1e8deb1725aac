import numpy as np
import pytest

from bert_mgpu.core import metrics


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
    from bert_mgpu.core.metrics import pearson, ranks, spearman

    a, b = [1, 2, 2, 3, 5], [2, 1, 4, 4, 9]
    assert list(ranks(a)) == [1, 2.5, 2.5, 4, 5] and list(ranks(b)) == [2, 1, 3.5, 3.5, 5]
    # By hand: ranks centred (-2, -.5, -.5, 1, 2) and (-1, -2, .5, .5, 2): 7.25 / sqrt(9.5 * 9.5).
    assert spearman(a, b) == pytest.approx(7.25 / 9.5)
    # Centred a (-1.6, -.6, -.6, .4, 2.4), b (-2, -3, 0, 0, 5): 17 / sqrt(9.2 * 38).
    assert pearson(a, b) == pytest.approx(17 / (9.2 * 38) ** 0.5)
    assert pearson(a, [2 * x + 1 for x in a]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # undefined for a constant: 0, as the other metrics


@pytest.mark.parametrize("k, seed", [(2, 0), (3, 1), (5, 2)])
def test_every_metric_equals_scikit_learns(k, seed):
    """On random labels and probabilities with ties, 2 to 5 classes, one class never predicted."""
    import sklearn.metrics as sklearn  # the test extra's reference
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, 300)
    probabilities = rng.multinomial(20, np.ones(k) / k, 300) / 20  # in twentieths: tied scores, as models give
    p = probabilities.argmax(1)
    p[p == k - 1] = 0  # a class never predicted: zero precision, as scikit-learn's zero_division=0
    precision, recall, f1, support = metrics.per_class(y, p, k)
    ref = sklearn.precision_recall_fscore_support(y, p, labels=range(k), zero_division=0)
    for ours, theirs in zip((precision, recall, f1, support), ref):
        np.testing.assert_allclose(ours, theirs, atol=1e-12)
    assert metrics.f1_macro(y, p, k) == pytest.approx(sklearn.f1_score(y, p, average="macro", labels=range(k),
                                                                       zero_division=0), abs=1e-12)
    assert metrics.f1_micro(y, p, k) == pytest.approx(sklearn.f1_score(y, p, average="micro"), abs=1e-12)
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(sklearn.matthews_corrcoef(y, p), abs=1e-12)
    auc = sklearn.roc_auc_score(y, probabilities[:, 1]) if k == 2 else sklearn.roc_auc_score(
        y, probabilities, multi_class="ovr", average="macro")
    assert metrics.roc_auc(y, probabilities) == pytest.approx(auc, abs=1e-12)


def test_metric_names_are_checked_against_the_task_type():
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.model.objectives import objective

    objective("classification").check_metrics(["f1_macro", "auc"])
    objective("regression").check_metrics(["pearson"])
    for kind in ("classification", "regression", "multi_label"):
        with pytest.raises(UserError, match=r"--metrics=f2: expected some of accuracy, f1, f1_macro"):
            objective(kind).check_metrics(["f2"])
    with pytest.raises(UserError, match=r"--metrics=accuracy: a regression has scores, not classes"):
        objective("regression").check_metrics(["accuracy"])
    with pytest.raises(UserError, match=r"--metrics=accuracy: a multi-label task reports exact-match accuracy"):
        objective("multi_label").check_metrics(["accuracy"])
