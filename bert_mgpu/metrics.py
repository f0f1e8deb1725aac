"""Classification metrics of GLUE: accuracy, F1 (MRPC, QQP) and Matthews correlation (CoLA)."""

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


TASK_METRICS = {"mrpc": ("eval_f1", f1), "cola": ("eval_mcc", matthews_corrcoef)}
