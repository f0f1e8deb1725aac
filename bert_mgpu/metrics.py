"""The metrics of GLUE: accuracy, F1 (MRPC, QQP), Matthews correlation (CoLA), and Pearson and Spearman
correlation for scores (STS-B), as scikit-learn and SciPy compute them, in NumPy."""

import numpy as np


def accuracy(labels, predictions):
    return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1(labels, predictions, positive=1):
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    tp = np.sum((predictions == positive) & (labels == positive))
    fp = np.sum((predictions == positive) & (labels != positive))
    fn = np.sum((predictions != positive) & (labels == positive))
    return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def matthews_corrcoef(labels, predictions):
    """Binary or multi-class MCC (Gorodkin's R_K), 0 where it is undefined."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    k = int(max(labels.max(initial=0), predictions.max(initial=0))) + 1
    c = np.zeros((k, k), np.float64)
    np.add.at(c, (labels, predictions), 1)
    t, p, n, correct = c.sum(1), c.sum(0), c.sum(), np.trace(c)
    denom = np.sqrt((n * n - p @ p) * (n * n - t @ t))
    return float((correct * n - t @ p) / denom) if denom else 0.0


def pearson(labels, predictions):
    """Pearson's r, 0 where it is undefined (a constant input)."""
    x, y = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denom) if denom else 0.0


def ranks(values):
    """1-based ranks, ties given the mean of the ranks they span (SciPy's rankdata "average")."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(values)] - 1
    out = np.empty(len(values))
    out[order] = (first[group] + last[group]) / 2 + 1
    return out


def spearman(labels, predictions):
    """Spearman's rho: Pearson's r of the ranks."""
    return pearson(ranks(labels), ranks(predictions))


TASK_METRICS = {"mrpc": ("eval_f1", f1), "qqp": ("eval_f1", f1), "cola": ("eval_mcc", matthews_corrcoef)}
REGRESSION_METRICS = {"eval_pearson": pearson, "eval_spearman": spearman}
