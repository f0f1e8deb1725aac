"""A head's prediction files, from NumPy outputs alone: a sentence head's (test_results.tsv, predict.txt,
predictions.tsv) and a tagger's (predict.txt in CoNLL columns, predictions.jsonl, ...). The objectives write
them after `--do_predict`, and `predict_exported.py` writes the same files from an ONNX or LiteRT export in
a process that never loads TensorFlow.

Example:
    files = classes(np.array([[0.2, 0.8]]), ["neg", "pos"], ["test-0"])   # {file name: text}
"""

import json
import logging
import re

import numpy as np

from bert_mgpu.core.entities import entities, entity_scores, span_scores

log = logging.getLogger("bert_mgpu")
SPACE = "[SPACE]"  # a white-space character of a token, in a tagger's predict.txt columns
_WHITE = re.compile(r"\s")


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


def tagged(sentences, predicted, data_format=None):
    """A tagger's files for sentences (guid, tokens, tags or None) and their predicted tags (see
    `TokenClassification.prediction_files`): predict.txt (CoNLL columns), predictions.jsonl, test_results.txt
    for a tagged test set, cluener_predict.json for CLUENER's data."""
    columns, found, cluener, spaced = [], [], [], 0
    for n, (s, tags) in enumerate(zip(sentences, predicted, strict=True)):
        gold = s.tags or [None] * len(tags)
        cells = [SPACE.join(_WHITE.split(token)) if _WHITE.search(token) else token for token in s.tokens]
        spaced += sum(cell != token for cell, token in zip(cells, s.tokens))
        columns.append("".join(" ".join(c for c in (cell, true, tag) if c is not None) + "\n"
                               for cell, true, tag in zip(cells, gold, tags)) + "\n")
        joiner = "" if all(len(t) == 1 for t in s.tokens) else " "
        starts = np.cumsum([0] + [len(t) + len(joiner) for t in s.tokens])
        text = joiner.join(s.tokens)
        spans = []
        for kind, first, end in entities(tags):
            begin, stop = int(starts[first]), int(starts[end] - len(joiner))
            spans.append({"type": kind, "text": text[begin:stop], "start": begin, "end": stop,
                          "token_start": first, "token_end": end})
        found.append(json.dumps({"id": s.guid, "text": text, "entities": spans}, ensure_ascii=False) + "\n")
        label = {}
        for e in spans:
            label.setdefault(e["type"], {}).setdefault(e["text"], []).append([e["start"], e["end"] - 1])
        cluener.append(json.dumps({"id": n, "label": label}, ensure_ascii=False) + "\n")
    if spaced:
        log.info("predict.txt: %d token(s) holding white space written with %s (predictions.jsonl keeps "
                 "the text)", spaced, SPACE)
    files = {"predict.txt": "".join(columns), "predictions.jsonl": "".join(found)}
    if sentences and all(s.tags is not None for s in sentences):  # a tagged test set: conlleval's scores
        results, report = tag_scores([s.tags for s in sentences], predicted)
        files["test_results.txt"] = "".join(f"test_{k[5:]} = {v}\n" for k, v in sorted(results.items())) + "".join(
            f"report_{kind}_{name} = {values[name]}\n" for kind, values in report.items()
            for name in ("precision", "recall", "f1", "support"))
    if data_format == "cluener":
        files["cluener_predict.json"] = "".join(cluener)
    return files


def tag_scores(true_tags, predicted_tags):
    """Tag sequences (strings) -> ({eval_precision, eval_recall, eval_f1, eval_accuracy}, per-type report):
    conlleval's entity-level scores, TokenClassification.evaluate's."""
    scores = entity_scores(true_tags, predicted_tags)
    return {f"eval_{k}": scores[k] for k in ("precision", "recall", "f1", "accuracy")}, scores["per_type"]


def spans(rows, predicted):
    """GlobalPointer's files for sentences `rows` (guid, tokens, entities or None) and their predicted entities
    [(type, start, end)]: predictions.jsonl (each sentence's tokens and entities: type, token start and end,
    end exclusive, and text: the tokens joined by a space, or run together when every token is one character)
    and test_results.txt when every sentence has its true entities."""
    lines = []
    for row, found in zip(rows, predicted, strict=True):
        joiner = "" if all(len(t) == 1 for t in row.tokens) else " "
        lines.append(json.dumps({"id": row.guid, "tokens": list(row.tokens), "entities": [
            {"type": kind, "start": start, "end": end, "text": joiner.join(row.tokens[start:end])}
            for kind, start, end in sorted(found, key=lambda e: (e[1], e[2], e[0]))]}, ensure_ascii=False))
    files = {"predictions.jsonl": "".join(line + "\n" for line in lines)}
    if rows and all(row.entities is not None for row in rows):
        numbers, _ = span_scores([row.entities for row in rows], predicted)
        files["test_results.txt"] = "".join(f"test_{k} = {v}\n" for k, v in sorted(numbers.items()))
    return files


def answers(found, version_2_with_negative=False):
    """A question answerer's files, run_squad's: predictions.json, nbest_predictions.json and (v2)
    null_odds.json, from `squad_input.Answers`."""
    files = {"predictions.json": found.predictions, "nbest_predictions.json": found.nbest}
    if version_2_with_negative:
        files["null_odds.json"] = found.null_odds
    return {name: json.dumps(value, indent=4, ensure_ascii=False) + "\n" for name, value in files.items()}


def choices(questions, probabilities, submission=None):
    """A multiple-choice model's files: predictions.jsonl (id, the chosen index and text, every choice's
    probability), predict.txt (the chosen index a line) and, for CLUE's data, its leaderboard file:
    c311_predict.json (C3: {"id", "label"} lines) or chid11_predict.json (CHID: {blank: index})."""
    chosen = [int(np.argmax(p)) for p in probabilities]
    lines = "".join(json.dumps({"id": q.guid, "label": k, "answer": q.choices[k],
                                "probabilities": [round(float(x), 8) for x in p]}, ensure_ascii=False) + "\n"
                    for q, k, p in zip(questions, chosen, probabilities))
    files = {"predictions.jsonl": lines, "predict.txt": "".join(f"{k}\n" for k in chosen)}
    if submission == "c3":
        files["c311_predict.json"] = "".join(json.dumps({"id": _number(q.guid), "label": k}) + "\n"
                                             for q, k in zip(questions, chosen))
    elif submission == "chid":
        files["chid11_predict.json"] = json.dumps({q.guid: k for q, k in zip(questions, chosen)}, indent=2) + "\n"
    return files


def _number(guid):
    return int(guid) if str(guid).isdigit() else guid
