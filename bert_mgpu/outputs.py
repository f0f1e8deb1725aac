"""Result files, written atomically (temporary file, then rename) so a crash never leaves half a file.

eval_results.txt is google-research/bert's `key = value` lines; test_results.tsv is its tab-separated class
probabilities; predict.txt is bert-ad's one label per line; predictions.tsv has a header, the example id,
the predicted label and one probability column per class.
"""

import os

from bert_mgpu.storage import write_atomic


def write_eval_results(output_dir, results):
    lines = "".join(f"{k} = {results[k]}\n" for k in sorted(results))
    return write_atomic(os.path.join(output_dir, "eval_results.txt"), lines)


def write_predictions(output_dir, probabilities, label_list, guids):
    """The three prediction files; returns their paths."""
    predicted = probabilities.argmax(axis=1)
    test = "".join("\t".join(f"{p:.8f}" for p in row) + "\n" for row in probabilities)
    labels = "".join(f"{label_list[i]}\n" for i in predicted)
    header = "\t".join(["id", "label"] + [f"p_{name}" for name in label_list]) + "\n"
    table = header + "".join(
        "\t".join([guid, label_list[i]] + [f"{p:.8f}" for p in row]) + "\n"
        for guid, i, row in zip(guids, predicted, probabilities))
    return [write_atomic(os.path.join(output_dir, name), text) for name, text in
            (("test_results.tsv", test), ("predict.txt", labels), ("predictions.tsv", table))]
