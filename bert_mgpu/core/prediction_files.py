"""A sentence head's prediction files (test_results.tsv, predict.txt, predictions.tsv), from NumPy outputs
alone: the classifier's objectives write them after `--do_predict`, and `predict_exported.py` writes the same
files from an ONNX or LiteRT export in a process that never loads TensorFlow.

Example:
    files = classes(np.array([[0.2, 0.8]]), ["neg", "pos"], ["test-0"])   # {file name: text}
"""


def classes(predicted, labels, guids, predict_format="label"):
    """One class a row: test_results.tsv (probabilities), predict.txt (a label a line, or its index with
    predict_format="index", bert-ad's two forms) and predictions.tsv (id, label, probabilities)."""
    chosen = predicted.argmax(axis=1)
    test = "".join("\t".join(f"{p:.8f}" for p in row) + "\n" for row in predicted)
    lines = "".join(f"{i if predict_format == 'index' else labels[i]}\n" for i in chosen)
    header = "\t".join(["id", "label"] + [f"p_{name}" for name in labels]) + "\n"
    table = header + "".join("\t".join([guid, labels[i]] + [f"{p:.8f}" for p in row]) + "\n"
                             for guid, i, row in zip(guids, chosen, predicted))
    return {"test_results.tsv": test, "predict.txt": lines, "predictions.tsv": table}


def scores(predicted, guids):
    """A score a row (a regression): test_results.tsv, predict.txt and predictions.tsv with its id."""
    lines = "".join(f"{x:.6f}\n" for x in predicted)
    table = "id\tscore\n" + "".join(f"{guid}\t{x:.6f}\n" for guid, x in zip(guids, predicted))
    return {"test_results.tsv": lines, "predict.txt": lines, "predictions.tsv": table}


def label_sets(predicted, labels, guids, threshold, separator):
    """Any labels a row (multi-label): each label's probability (test_results.tsv), the labels above
    `threshold` joined by `separator` (predict.txt; an empty line for none), and predictions.tsv."""
    chosen = [separator.join(labels[i] for i in range(len(labels)) if row[i] > threshold) for row in predicted]
    test = "".join("\t".join(f"{p:.8f}" for p in row) + "\n" for row in predicted)
    header = "\t".join(["id", "labels"] + [f"p_{name}" for name in labels]) + "\n"
    table = header + "".join("\t".join([guid, names] + [f"{p:.8f}" for p in row]) + "\n"
                             for guid, names, row in zip(guids, chosen, predicted))
    return {"test_results.tsv": test, "predict.txt": "".join(c + "\n" for c in chosen), "predictions.tsv": table}
