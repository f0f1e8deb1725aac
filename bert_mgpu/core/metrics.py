"""The metrics of GLUE: accuracy, F1 (MRPC, QQP), Matthews correlation (CoLA), and Pearson and Spearman
correlation for scores (STS-B), plus macro and micro F1, ROC AUC and the per-class report, as
scikit-learn and SciPy compute them (tests/test_metrics.py compares), in NumPy."""

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


def per_class(labels, predictions, num_classes):
    """(precision, recall, F1, support) arrays, one entry per class; 0 where undefined, as scikit-learn's
    `precision_recall_fscore_support(zero_division=0)`."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    c = np.zeros((num_classes, num_classes), np.float64)
    np.add.at(c, (labels, predictions), 1)
    tp, support, predicted = np.diag(c), c.sum(1), c.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, tp / predicted, 0.0)
        recall = np.where(support > 0, tp / support, 0.0)
        f = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    return precision, recall, f, support.astype(np.int64)


def f1_macro(labels, predictions, num_classes):
    """The unweighted mean of the classes' F1 (every class of the label set counts)."""
    return float(np.mean(per_class(labels, predictions, num_classes)[2]))


def f1_micro(labels, predictions, num_classes=None):
    """F1 of all decisions pooled; for one label an example, it equals accuracy."""
    return accuracy(labels, predictions)


def roc_auc(labels, probabilities):
    """Area under the ROC curve from the probabilities [N, classes]: binary from the positive class's,
    else the mean of one-vs-rest over the classes present (scikit-learn's `multi_class="ovr"`, macro)."""
    labels, probabilities = np.asarray(labels), np.asarray(probabilities, np.float64)
    classes = [1] if probabilities.shape[1] == 2 else [k for k in range(probabilities.shape[1])
                                                         if 0 < np.sum(labels == k) < len(labels)]
    areas = []
    for k in classes:
        positive = labels == k
        n_pos, n_neg = positive.sum(), (~positive).sum()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        r = ranks(probabilities[:, k])
        areas.append((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return float(np.mean(areas)) if areas else float("nan")


def per_label(labels, predicted):
    """Per label of 0/1 rows [N, labels]: (precision, recall, F1, support), 0 where undefined."""
    y, p = np.asarray(labels) > 0.5, np.asarray(predicted) > 0.5
    tp, fp, fn = (y & p).sum(0), (~y & p).sum(0), (y & ~p).sum(0)
    precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), 0.0)
    recall = np.where(tp + fn > 0, tp / np.maximum(tp + fn, 1), 0.0)
    f = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
    return precision, recall, f, y.sum(0)


def multi_label(labels, predicted):
    """Exact-match accuracy and micro/macro F1 of 0/1 rows [N, labels] (scikit-learn's multilabel F1)."""
    y, p = np.asarray(labels) > 0.5, np.asarray(predicted) > 0.5
    tp, fp, fn = (y & p).sum(), (~y & p).sum(), (y & ~p).sum()
    return {"eval_accuracy": float(np.mean(np.all(y == p, axis=1))),
            "eval_f1_macro": float(np.mean(per_label(y, p)[2])),
            "eval_f1_micro": float(2 * tp / (2 * tp + fp + fn)) if 2 * tp + fp + fn else 0.0}


def _sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def _log_softmax(x):
    x = np.asarray(x, np.float32)  # float32, as the model computes them: runs that differ by rounding agree
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def regression_results(logits, labels, names=()):
    """(results, None, None) of a regression's evaluation: mean squared error, Pearson and Spearman, and
    the `names` (--metrics) as eval_<name>."""
    scores = np.asarray(logits, np.float32)[:, 0].astype(np.float64)
    loss = float(np.mean(np.square(scores - labels)))
    results = {name: fn(labels, scores) for name, fn in REGRESSION_METRICS.items()}
    results.update({f"eval_{n}": CLASSIFICATION[n](labels, scores, None, 0) for n in names})
    return {"eval_loss": loss, "loss": loss, **results}, None, None


def multi_label_results(logits, labels, label_names, threshold=0.5):
    """(results, None, per-label report) of a multi-label evaluation: binary cross-entropy, exact-match
    accuracy and micro/macro F1 of the labels above `threshold`."""
    logits = np.asarray(logits, np.float32)
    z = np.clip(logits, -50, 50)
    loss = float(np.mean(np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z))), dtype=np.float32))
    predicted = _sigmoid(logits) > threshold
    report = dict(zip(label_names, zip(*per_label(labels, predicted))))
    return {"eval_loss": loss, "loss": loss, **multi_label(labels, predicted)}, None, report


def classification_results(logits, labels, label_names, task=None, names=()):
    """(results, confusion matrix, per-class report) of a classification's evaluation: cross-entropy,
    accuracy, the task's metric (F1 for MRPC and QQP, MCC for CoLA) and the `names` (--metrics)."""
    logits = np.asarray(logits, np.float32)
    k = len(label_names)
    predicted = np.argmax(logits, axis=1)
    confusion = np.zeros([k] * 2, np.int64)  # true label per row, predicted per column
    np.add.at(confusion, (labels, predicted), 1)
    loss = float(-np.mean(_log_softmax(logits)[np.arange(len(labels)), labels], dtype=np.float32))
    results = {"eval_accuracy": accuracy(labels, predicted), "eval_loss": loss, "loss": loss}
    if task in TASK_METRICS:
        name, fn = TASK_METRICS[task]
        results[name] = fn(labels, predicted)
    probabilities = np.exp(_log_softmax(logits).astype(np.float64))
    results.update({f"eval_{n}": CLASSIFICATION[n](labels, predicted, probabilities, k) for n in names})
    return results, confusion, dict(zip(label_names, zip(*per_class(labels, predicted, k))))


# --metrics: name -> fn(label ids, predicted ids, probabilities, number of classes).
CLASSIFICATION = {
    "accuracy": lambda y, p, prob, k: accuracy(y, p),
    "f1": lambda y, p, prob, k: f1(y, p),
    "f1_macro": lambda y, p, prob, k: f1_macro(y, p, k),
    "f1_micro": lambda y, p, prob, k: f1_micro(y, p, k),
    "mcc": lambda y, p, prob, k: matthews_corrcoef(y, p),
    "auc": lambda y, p, prob, k: roc_auc(y, prob),
    "pearson": lambda y, p, prob, k: pearson(y, p),
    "spearman": lambda y, p, prob, k: spearman(y, p),
}
REGRESSION = ("pearson", "spearman")


TASK_METRICS = {"mrpc": ("eval_f1", f1), "qqp": ("eval_f1", f1), "cola": ("eval_mcc", matthews_corrcoef)}
REGRESSION_METRICS = {"eval_pearson": pearson, "eval_spearman": spearman}
