"""Pictures of a run, drawn with matplotlib (Agg; never needed for training): its learning curves from the
TensorBoard events it wrote, and the dev set's confusion matrix.

    python -m bert_mgpu.io.plot OUTPUT_DIR      # learning_curves.png (and confusion_matrix.png) in OUTPUT_DIR

Example:
    path, series = learning_curves("out")    # series: {"train/loss": (steps, values), ...}, as plotted
"""

import os
import sys

import numpy as np

from bert_mgpu.core import storage

SIZE, DPI = (12, 8), 100  # inches: 1200 x 800 pixels
PANELS = (  # (title, [(run, tag), ...]) for each panel; a tag a run did not log is left out
    ("loss", [("train", "loss"), ("train", "mlm_loss"), ("eval", "loss"), ("train", "eval_loss"),
              ("train", "eval_mlm_loss")]),
    ("dev metric / accuracy", [("eval", "accuracy"), ("eval", "f1"), ("eval", "mcc"), ("eval", "pearson"),
                               ("eval", "spearman"), ("train", "mlm_accuracy"), ("train", "eval_mlm_accuracy")]),
    ("learning rate", [("train", "learning_rate")]),
    ("examples / s", [("train", "examples_per_second")]),
)


def read_scalars(directory):
    """{tag: (steps, values)} of the scalars in a TensorBoard directory's event files, in step order."""
    import tensorflow as tf

    points = {}
    for path in storage.glob(os.path.join(directory, "events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():  # summary_iterator warns it is deprecated
            event = tf.compat.v1.Event.FromString(raw)
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                points.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: (np.array(sorted(p)), np.array([p[s] for s in sorted(p)])) for tag, p in points.items()}


def best_step(output_dir):
    """The step of the model kept in best/, or None."""
    import json

    path = os.path.join(output_dir, "best", "bert_mgpu.json")
    return json.loads(storage.read_text(path)).get("global_step") if storage.exists(path) else None


def final_evaluation(output_dir):
    """eval_results.txt's numbers ({"eval_accuracy": ..., "global_step": ...}), or {}: the evaluation after
    training, drawn when none was logged while training."""
    path = os.path.join(output_dir, "eval_results.txt")
    if not storage.exists(path):
        return {}
    results = {}
    for line in storage.read_text(path).splitlines():
        key, _, value = line.partition(" = ")
        try:
            results[key] = float(value)
        except ValueError:
            pass
    return results if "global_step" in results else {}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def learning_curves(output_dir, path=None):
    """learning_curves.png: loss, the dev metric (or masked-LM accuracy), learning rate and examples/s
    against the step, the best model's step marked; without evaluations while training, the final one
    (eval_results.txt) is a star. Returns (path, {"run/tag": (steps, values)} plotted; "final/tag")."""
    runs = {run: read_scalars(os.path.join(output_dir, run)) for run in ("train", "eval")}
    final = final_evaluation(output_dir)
    best = best_step(output_dir)
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=SIZE, dpi=DPI)
    plotted = {}
    for ax, (title, series) in zip(axes.flat, PANELS):
        for run, tag in series:
            if tag in runs[run]:
                steps, values = runs[run][tag]
                few = run == "eval" or tag.startswith("eval_") or len(steps) <= 50  # points one can see
                ax.plot(steps, values, marker="o" if few else None, markersize=3, label=f"{run}/{tag}")
                plotted[f"{run}/{tag}"] = (steps, values)
        evaluated = [tag for run, tag in series if run == "eval" and tag in runs["eval"]]
        for run, tag in series if not evaluated else ():  # no evaluation while training: the one after it
            if run == "eval" and f"eval_{tag}" in final:
                point = (np.array([int(final["global_step"])]), np.array([final[f"eval_{tag}"]]))
                ax.plot(*point, marker="*", markersize=12, linestyle="none", label=f"final eval/{tag}")
                ax.annotate(f"{point[1][0]:.4g}", (point[0][0], point[1][0]), textcoords="offset points",
                            xytext=(-8, 8), ha="right")
                plotted[f"final/{tag}"] = point
        if not ax.lines:
            ax.text(0.5, 0.5, "nothing logged" if not title.startswith("dev") else
                    "no dev evaluation in this run\n(--do_eval, --eval_every_steps)",
                    ha="center", va="center", transform=ax.transAxes, color="grey")
        if best is not None:
            ax.axvline(best, color="grey", linestyle="--", linewidth=1, label=f"best (step {best})")
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=8)
    last = max((int(steps.max()) for steps, _ in plotted.values() if len(steps)), default=0)
    for ax in axes.flat:  # one step axis for every panel, from 0: a lone final point is not a panel of its own
        ax.set_xlim(0, max(1, last) * 1.03)
    fig.suptitle(os.path.basename(os.path.normpath(output_dir)))
    fig.tight_layout()
    path = path or os.path.join(output_dir, "learning_curves.png")
    _save(fig, path)
    plt.close(fig)
    return path, plotted


def confusion_matrix(counts, labels, path):
    """confusion_matrix.png: rows the true labels, columns the predicted ones, each cell its count."""
    counts = np.asarray(counts)
    plt = _pyplot()
    side = min(12, 2 + 0.6 * len(labels))
    fig, ax = plt.subplots(figsize=(side, side), dpi=DPI)
    ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for (i, j), n in np.ndenumerate(counts):
        ax.text(j, i, str(n), ha="center", va="center", color="white" if n > counts.max() / 2 else "black")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def write_confusion(output_dir, counts, labels):
    """confusion_matrix.tsv (true label per row, predicted per column) and its picture."""
    text = "\t".join(["true \\ predicted", *labels]) + "\n" + "".join(
        "\t".join([label, *map(str, row)]) + "\n" for label, row in zip(labels, np.asarray(counts)))
    storage.write_atomic(os.path.join(output_dir, "confusion_matrix.tsv"), text)
    return confusion_matrix(counts, labels, os.path.join(output_dir, "confusion_matrix.png"))


def _save(fig, path):
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    storage.write_atomic(path, buffer.getvalue())


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: python -m bert_mgpu.io.plot OUTPUT_DIR")
    output_dir = argv[1]
    if not storage.isdir(os.path.join(output_dir, "train")):
        sys.exit(f"{output_dir}: no train/ TensorBoard directory (not a bert_mgpu output directory?)")
    print(learning_curves(output_dir)[0])
    table = os.path.join(output_dir, "confusion_matrix.tsv")
    if storage.exists(table):
        lines = [line.split("\t") for line in storage.read_text(table).splitlines()]
        print(confusion_matrix([[int(n) for n in row[1:]] for row in lines[1:]], lines[0][1:],
                               os.path.join(output_dir, "confusion_matrix.png")))


if __name__ == "__main__":
    main(sys.argv)
