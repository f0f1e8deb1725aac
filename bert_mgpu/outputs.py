"""Result files, written atomically (temporary file, then rename) so a crash never leaves half a file.

eval_results.txt is google-research/bert's `key = value` lines; test_results.tsv is its tab-separated class
probabilities; predict.txt is bert-ad's one label per line; predictions.tsv has a header, the example id,
the predicted label and one probability column per class.
"""

import os

from bert_mgpu.storage import write_atomic, write_set


def summary(title, facts, output_dir):
    """The block a run ends with: `facts` (name -> value, None left out), then every file and directory
    in `output_dir` with what it is."""
    from bert_mgpu import storage

    width = max(len(k) for k in facts) if facts else 0
    lines = [f"== {title} =="]
    lines += [f"  {k.ljust(width)}  {v:.4g}" if isinstance(v, float) else f"  {k.ljust(width)}  {v}"
              for k, v in facts.items() if v is not None]
    names = sorted(os.path.basename(p.rstrip("/")) for p in storage.glob(os.path.join(output_dir, "*")))
    shown = [n for n in names if not n.startswith(("ckpt-", ".")) and n != "checkpoint"]
    latest = [n[: -len(".index")] for n in names if n.startswith("ckpt-") and n.endswith(".index")]
    if latest:
        shown.insert(0, max(latest, key=lambda n: int(n.split("-")[1])) + " (latest checkpoint)")
    lines.append(f"  outputs in {output_dir}: " + ", ".join(f"{n}{'/' if _is_dir(output_dir, n) else ''}"
                                                           for n in shown))
    return "\n".join(lines)


def _is_dir(directory, name):
    from bert_mgpu import storage

    return " " not in name and storage.isdir(os.path.join(directory, name))


def draw(what, *args):
    """`bert_mgpu.plot.<what>(*args)` when matplotlib is installed (it is never needed for training);
    otherwise one line saying how to get the pictures."""
    import logging

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logging.getLogger("bert_mgpu").warning("no %s: matplotlib is not installed (pip install matplotlib; "
                                               "then python -m bert_mgpu.plot OUTPUT_DIR)", what)
        return None
    from bert_mgpu import plot

    return getattr(plot, what)(*args)


def write_eval_results(output_dir, results, report=None):
    """google-bert's `key = value` lines; with `report` ({label: (precision, recall, F1, support)}) a
    `report_<label>_<measure>` line each after them."""
    lines = "".join(f"{k} = {results[k]}\n" for k in sorted(results))
    for label, values in (report or {}).items():
        lines += "".join(f"report_{label}_{name} = {value}\n"
                         for name, value in zip(("precision", "recall", "f1", "support"), values))
    return write_atomic(os.path.join(output_dir, "eval_results.txt"), lines)


def write_predictions(output_dir, probabilities, label_list, guids, predict_format="label"):
    """The three prediction files; returns their paths. predict.txt holds a label a line, or its index in
    the label list with `predict_format="index"` (bert-ad's two forms)."""
    predicted = probabilities.argmax(axis=1)
    test = "".join("\t".join(f"{p:.8f}" for p in row) + "\n" for row in probabilities)
    labels = "".join(f"{i if predict_format == 'index' else label_list[i]}\n" for i in predicted)
    header = "\t".join(["id", "label"] + [f"p_{name}" for name in label_list]) + "\n"
    table = header + "".join(
        "\t".join([guid, label_list[i]] + [f"{p:.8f}" for p in row]) + "\n"
        for guid, i, row in zip(guids, predicted, probabilities))
    return write_set(output_dir, {"test_results.tsv": test, "predict.txt": labels, "predictions.tsv": table})


def write_scores(output_dir, scores, guids):
    """The prediction files of a regression: a score a line (test_results.tsv, predict.txt) and
    predictions.tsv with its id; returns their paths."""
    lines = "".join(f"{x:.6f}\n" for x in scores)
    table = "id\tscore\n" + "".join(f"{guid}\t{x:.6f}\n" for guid, x in zip(guids, scores))
    return write_set(output_dir, {"test_results.tsv": lines, "predict.txt": lines, "predictions.tsv": table})


def write_label_sets(output_dir, probabilities, label_list, guids, threshold=0.5, separator=","):
    """The prediction files of a multi-label task: each label's probability (test_results.tsv), the labels
    above `threshold` joined by `separator` (predict.txt; an empty line for none), and predictions.tsv."""
    chosen = [separator.join(label_list[i] for i in range(len(label_list)) if row[i] > threshold)
              for row in probabilities]
    test = "".join("\t".join(f"{p:.8f}" for p in row) + "\n" for row in probabilities)
    header = "\t".join(["id", "labels"] + [f"p_{name}" for name in label_list]) + "\n"
    table = header + "".join("\t".join([guid, labels] + [f"{p:.8f}" for p in row]) + "\n"
                             for guid, labels, row in zip(guids, chosen, probabilities))
    return write_set(output_dir, {"test_results.tsv": test, "predict.txt": "".join(c + "\n" for c in chosen),
                                  "predictions.tsv": table})
