"""A reading-comprehension set in SQuAD's JSON from Python's library reference (Debian package python3.11-doc).

Usage: python data/prepare_python_qa.py SOURCES_DIR OUT_DIR

No package ships a labelled question-answering set, so this one is derived from real text: every function
or method of the library reference and the C API whose description starts "Return ..." gives the question
"What does NAME() return?" and, as its answer, the rest of that first sentence ("the absolute value of a
number"). A context is four such entries of one page, one after another as the page has them ("abs(x):
Return the absolute value of a number. The argument may be ..."), so the answer must be found under the
right name among similar sentences. Pages go to dev.json by a hash of their name (a sixth), so dev's text
is unseen. Also prints the trivial baseline: the first entry's answer, whatever the question.
"""

import json
import os
import re
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_python_docs import INLINE_ROLE  # noqa: E402

from bert_mgpu.core.qa_metrics import squad_scores  # noqa: E402

DIRECTIVE = re.compile(r"^(\s*)\.\. (?:function|method|classmethod|staticmethod|coroutinefunction|coroutinemethod"
                       r"|c:function):: (?:[\w\s*]*?[\s*])?([A-Za-z_][\w.]*)\((.*?)\)?\s*$")
FIRST_SENTENCE = re.compile(r"^Return (.+?)\.(?:\s|$)")
GROUP = 4  # entries a context


def clean(text):
    text = INLINE_ROLE.sub(r"\1", text).replace("``", "").replace("**", "").replace("*", "")
    return " ".join(text.split())


def entries(path):
    """(name, signature, first paragraph) of each function and method of a page, in page order."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out = []
    for i, line in enumerate(lines):
        found = DIRECTIVE.match(line)
        if not found:
            continue
        indent, name, args = len(found.group(1)), found.group(2).split(".")[-1], found.group(3)
        k = i + 1
        while k < len(lines) and (not lines[k].strip() or lines[k].strip().startswith((":", ".. "))
                                  or DIRECTIVE.match(lines[k])):
            if lines[k].strip() and not lines[k].strip().startswith(":") and len(lines[k]) - len(
                    lines[k].lstrip()) <= indent:
                break  # the next directive at this level: no body of its own
            k += 1
        body = []
        while k < len(lines) and lines[k].strip() and len(lines[k]) - len(lines[k].lstrip()) > indent:
            body.append(lines[k].strip())
            k += 1
        if body:
            out.append((name, f"{name}({clean(args)})", clean(" ".join(body))))
    return out


def questions(page, items):
    """SQuAD paragraphs of one page: its "Return ..." entries, GROUP to a context."""
    usable = [(n, s, t) for n, s, t in items if FIRST_SENTENCE.match(t) and 3 <= len(t.split(". ")[0].split()) <= 30]
    paragraphs = []
    for g in range(0, len(usable) - 1, GROUP):
        group = usable[g:g + GROUP]
        names = [n for n, _, _ in group]
        context, qas = "", []
        for name, signature, text in group:
            context += ("" if not context else " ") + f"{signature}: "
            answer = FIRST_SENTENCE.match(text).group(1)
            start = len(context) + len("Return ")
            context += text
            if names.count(name) == 1:
                qas.append({"id": f"{page}-{g}-{name}", "question": f"What does {name}() return?",
                            "answers": [{"text": answer, "answer_start": start}]})
        if len(qas) >= 2:
            paragraphs.append({"context": context, "qas": qas})
    return paragraphs


def main(sources, out_dir):
    split = {"train": [], "dev": []}
    for part in ("library", "c-api"):
        for page in sorted(os.listdir(os.path.join(sources, part))):
            if not page.endswith(".rst.txt"):
                continue
            title = f"{part}/{page[:-len('.rst.txt')]}"
            paragraphs = questions(title, entries(os.path.join(sources, part, page)))
            if paragraphs:
                side = "dev" if zlib.crc32(title.encode()) % 6 == 0 else "train"
                split[side].append({"title": title, "paragraphs": paragraphs})
    os.makedirs(out_dir, exist_ok=True)
    for side, articles in split.items():
        with open(os.path.join(out_dir, f"{side}.json"), "w", encoding="utf-8") as f:
            json.dump({"version": "1.1", "data": articles}, f, indent=1, ensure_ascii=False)
        count = sum(len(p["qas"]) for a in articles for p in a["paragraphs"])
        print(f"{side}: {count} questions on {sum(len(a['paragraphs']) for a in articles)} contexts "
              f"from {len(articles)} pages")
    gold, first = {}, {}
    for article in split["dev"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                gold[qa["id"]] = [a["text"] for a in qa["answers"]]
                first[qa["id"]] = p["qas"][0]["answers"][0]["text"]
    scores = squad_scores(gold, first)
    print(f"dev baseline (the context's first answer): exact match {scores['exact_match']:.1f}, "
          f"F1 {scores['f1']:.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
