"""Chinese text from Debian's fortunes-zh -> a pretraining corpus and a labelled classification task.

Usage: python data/prepare_fortunes_zh.py FORTUNES_DIR OUT_DIR
       python data/prepare_fortunes_zh.py --report OUT_DIR EVAL_RESULTS   (the dev metrics against the majority)
FORTUNES_DIR is the package's usr/share/games/fortunes (files chinese, tang300, song100: entries separated
by lines holding "%", coloured with ANSI escape codes, which are stripped). The task is which collection
an entry comes from: `chinese` (sayings, quotations, Debian's code of conduct), `tang300` (Three Hundred
Tang Poems) or `song100` (a hundred Song poems). Titles (《...》, 题目:), author lines (作者:) and part
markers (其一) are dropped, so the text alone tells. Entries go to dev (10%) and test (10%) by a hash of their text.

Writes OUT_DIR/{train,dev,test}.tsv (header `label<TAB>text`; a text's lines joined by " / "),
OUT_DIR/pretrain.txt (the training entries, a line each, a blank line between entries: google-bert's text
format) and OUT_DIR/valid.txt (the dev entries, for pretraining validation).
"""

import os
import re
import sys
import zlib

COLLECTIONS = ("chinese", "tang300", "song100")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
DROPPED = re.compile(r"^(题目[：:].*|《.*》.*|作者[：:].*|其[一二三四五六七八九十]+)$")  # titles, authors, parts


def entries(path):
    """The entries of one fortune file, each a list of its text lines (titles, authors, blanks dropped)."""
    with open(path, encoding="utf-8") as f:
        text = ANSI.sub("", f.read())
    for entry in re.split(r"(?m)^%\s*$", text):
        lines = [" ".join(line.split()) for line in entry.splitlines()]
        lines = [line for line in lines if line and not DROPPED.match(line)]
        if lines:
            yield lines


def split_of(text):
    bucket = zlib.crc32(text.encode("utf-8")) % 10
    return "dev" if bucket == 0 else "test" if bucket == 1 else "train"


def main(source, out):
    os.makedirs(out, exist_ok=True)
    rows = {"train": [], "dev": [], "test": []}
    corpus = {"train": [], "dev": []}
    for name in COLLECTIONS:
        path = os.path.join(source, name)
        if not os.path.exists(path):
            sys.exit(f"{path}: not found; FORTUNES_DIR is the package's usr/share/games/fortunes")
        for lines in entries(path):
            text = " / ".join(lines).replace("\t", " ")
            split = split_of(text)
            rows[split].append(f"{name}\t{text}\n")
            if split in corpus:
                corpus[split].append("\n".join(lines) + "\n\n")
    for split, lines in rows.items():
        with open(os.path.join(out, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("label\ttext\n" + "".join(lines))
    for split, name in (("train", "pretrain.txt"), ("dev", "valid.txt")):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write("".join(corpus[split]))
    counts = {s: {c: sum(r.startswith(c + "\t") for r in rows[s]) for c in COLLECTIONS} for s in rows}
    print(" ".join(f"{s}={sum(c.values())} ({', '.join(f'{k} {v}' for k, v in c.items())})"
                   for s, c in counts.items()) + f" -> {out}")


def report(out, eval_results):
    """The fine-tuned classifier's dev accuracy and macro F1 beside always saying the majority class."""
    with open(os.path.join(out, "dev.tsv"), encoding="utf-8") as f:
        labels = [line.split("\t", 1)[0] for line in f.read().splitlines()[1:]]
    majority = max(set(labels), key=labels.count)
    share = labels.count(majority) / len(labels)
    # Macro F1 of the majority guess: F1 = 2p/(1+p) for its class, 0 for the others.
    majority_f1 = 2 * share / (1 + share) / len(set(labels))
    with open(eval_results, encoding="utf-8") as f:
        results = dict(line.split(" = ") for line in f.read().splitlines())
    print(f"dev ({len(labels)} entries): accuracy {float(results['eval_accuracy']):.3f}, macro F1 "
          f"{float(results['eval_f1_macro']):.3f}; always '{majority}': accuracy {share:.3f}, macro F1 "
          f"{majority_f1:.3f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--report":
        report(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
