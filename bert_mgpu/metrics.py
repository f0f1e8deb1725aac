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


def check_names(names, regression):
    """UserError for a --metrics name that is unknown or does not fit the task type."""
    from bert_mgpu.errors import UserError

    for name in names or ():
        if name not in CLASSIFICATION:
            raise UserError(f"--metrics={name}: expected some of {', '.join(CLASSIFICATION)}")
        if regression and name not in REGRESSION:
            raise UserError(f"--metrics={name}: a regression has scores, not classes ({', '.join(REGRESSION)})")


TASK_METRICS = {"mrpc": ("eval_f1", f1), "qqp": ("eval_f1", f1), "cola": ("eval_mcc", matthews_corrcoef)}
REGRESSION_METRICS = {"eval_pearson": pearson, "eval_spearman": spearman}
