"""A named-entity set in CoNLL columns from Python's library reference (Debian package python3.11-doc).

Usage: python data/prepare_python_ner.py SOURCES_DIR OUT_DIR

No package we may use ships a labelled NER corpus, but Python's documentation is one: its authors mark every
module, class, function, exception and attribute they name in running prose with a role (":mod:`json`",
":class:`~io.StringIO`", ":meth:`str.split`", ":exc:`KeyError`", ":attr:`x.real`"). A sentence of prose with the
markup taken away is the text; the roles are the entities: MOD, CLASS, FUNC (func and meth), EXC and ATTR
(attr, data, const). The model must tell them from the words around them ("the X module", "raises X"), since
the text no longer shows the markup. Literals (``None``, ``x + 1``) and other roles (:ref:, :term:, :pep:)
stay as plain words, tagged O; paragraphs naming C code (:c:func: and the like) are left out.

Kept: sentences of prose (bodies of ".. function::" and the like included; code blocks, doctests, tables,
titles' underlines and field lists left out) of four words or more. Pages go to dev.txt and test.txt by a
hash of their path (a tenth each), so their sentences come from pages training never saw. Writes train.txt,
dev.txt and test.txt (a word and its BIO tag a line, a blank line between sentences) and baseline.txt, the
dictionary baseline: every entity string of train tagged, with its most frequent type, wherever it appears
in dev and test.
"""

import collections
import os
import re
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_python_docs import SENTENCE_END  # noqa: E402

from bert_mgpu.core.entities import entities, entity_scores  # noqa: E402

TYPES = {"mod": "MOD", "class": "CLASS", "func": "FUNC", "meth": "FUNC", "exc": "EXC", "attr": "ATTR",
         "data": "ATTR", "const": "ATTR"}
MARKUP = re.compile(r":(?P<role>[a-z:]+):`(?P<target>[^`]*)`|``(?P<literal>.*?)``|\*\*?")
WORD = re.compile(r"\w+(?:\.\w+)*|[^\w\s]")
SHOWN = re.compile(r"^(?P<shown>.*?)\s*<[^>]*>$")  # :func:`title <str.title>` shows "title"
CODE_DIRECTIVE = re.compile(r"\.\. (code-block|sourcecode|doctest|testcode|testoutput|testsetup|productionlist"
                            r"|literalinclude|highlight|raw|csv-table|list-table|table|math)::")
BULLET = re.compile(r"^(?:[-*+]|#\.|\d+\.)\s+")
FIELD = re.compile(r"^:[^`:]+:(\s|$)")  # ":param x:", ":noindex:" (not a role, ":func:`len`")
RULE = re.compile(r"^([=\-~^\"'*+#`:.])\1{2,}$|^[+|]|^>>>|^\.\.\.")


def paragraphs(text):
    """The prose paragraphs of a reST page, the bodies of `.. function::` and the like included; code blocks
    (after "::", code directives, doctests), tables, titles' underlines and field lists left out."""
    para, code_indent = [], None
    for line in text.splitlines() + [""]:
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        if code_indent is not None and (not stripped or indent > code_indent):
            continue
        code_indent = None
        starts_item = BULLET.match(stripped)
        markup = not stripped or stripped.startswith(".. ") or FIELD.match(stripped) or RULE.match(stripped)
        if (markup or starts_item) and para:
            yield " ".join(para)
            para = []
        if CODE_DIRECTIVE.match(stripped) or stripped.endswith("::") and not stripped.startswith(".. "):
            code_indent = indent
            if not stripped.startswith(".. "):
                para.append(stripped[:-1])
            continue
        if markup:
            continue
        para.append(stripped[starts_item.end():] if starts_item else stripped)
    if para:
        yield " ".join(para)


def shown(target):
    """The text a role shows: `~a.b.c` -> c, `text <target>` -> text, `!name` -> name."""
    labelled = SHOWN.match(target)
    if labelled:
        return labelled.group("shown")
    target = target.lstrip("!")
    return target.rsplit(".", 1)[-1] if target.startswith("~") else target


def unmark(paragraph):
    """(plain text, [(start, end, type)]) of a paragraph, or None if it names C code."""
    text, spans, length, at = [], [], 0, 0
    for found in MARKUP.finditer(paragraph):
        text.append(paragraph[at:found.start()])
        length += found.start() - at
        at = found.end()
        role = found.group("role")
        if found.group("literal") is not None:
            words = found.group("literal")  # a value or an expression (``None``, ``x + 1``): O
        elif role is None:
            continue  # emphasis: dropped
        elif role.startswith("c:"):
            return None  # C's names: another language's code
        else:
            words = shown(found.group("target")).lstrip("~")
            if role in TYPES and words.strip():
                spans.append((length, length + len(words), TYPES[role]))
        text.append(words)
        length += len(words)
    text.append(paragraph[at:])
    return "".join(text), spans


def tagged_sentences(paragraph):
    """[(words, tags)] of a paragraph's sentences."""
    unmarked = unmark(paragraph)
    if unmarked is None:
        return []
    text, spans = unmarked
    out, start = [], 0
    ends = [m.start() for m in SENTENCE_END.finditer(text)] + [len(text)]
    for end in ends:
        words, tags, previous = [], [], None
        for word in WORD.finditer(text, start, end):
            inside = [s for s in spans if s[0] <= word.start() and word.end() <= s[1]]
            if not inside and any(s[0] < word.end() and word.start() < s[1] for s in spans):
                break  # a span that ends inside a word (rare markup): leave the sentence out
            span = inside[0] if inside else None
            tags.append("O" if span is None else ("I-" if span == previous else "B-") + span[2])
            words.append(word.group())
            previous = span
        else:
            if len(words) >= 4 and not any(s[0] < end < s[1] for s in spans):
                out.append((words, tags))
        start = end
    return out


def dictionary_baseline(train, evaluated):
    """Entity F1 of tagging every training entity string (its most frequent type) wherever it appears."""
    types = collections.defaultdict(collections.Counter)
    for words, tags in train:
        for kind, begin, end in entities(tags):
            types[tuple(words[begin:end])][kind] += 1
    known = {name: counts.most_common(1)[0][0] for name, counts in types.items()}
    longest = max(map(len, known))
    predicted = []
    for words, _ in evaluated:
        tags, i = ["O"] * len(words), 0
        while i < len(words):
            for n in range(min(longest, len(words) - i), 0, -1):
                kind = known.get(tuple(words[i:i + n]))
                if kind:
                    tags[i:i + n] = ["B-" + kind] + ["I-" + kind] * (n - 1)
                    i += n
                    break
            else:
                i += 1
        predicted.append(tags)
    return entity_scores([tags for _, tags in evaluated], predicted)


def main(src, out_dir):
    splits = {"train": [], "dev": [], "test": []}
    for root, _, files in sorted(os.walk(os.path.join(src, "library"))):
        for name in sorted(files):
            if not name.endswith(".rst.txt"):
                continue
            path = os.path.join(root, name)
            bucket = zlib.crc32(os.path.relpath(path, src).encode()) % 10
            split = {0: "dev", 1: "test"}.get(bucket, "train")
            with open(path, encoding="utf-8", errors="replace") as f:
                for paragraph in paragraphs(f.read()):
                    splits[split].extend(tagged_sentences(paragraph))
    os.makedirs(out_dir, exist_ok=True)
    for split, sentences in splits.items():
        with open(os.path.join(out_dir, f"{split}.txt"), "w", encoding="utf-8") as f:
            for words, tags in sentences:
                f.write("".join(f"{w} {t}\n" for w, t in zip(words, tags)) + "\n")
        counted = collections.Counter(kind for _, tags in sentences for kind, _, _ in entities(tags))
        print(f"{split}: {len(sentences)} sentences, {sum(counted.values())} entities "
              f"({', '.join(f'{k} {n}' for k, n in sorted(counted.items()))})")
    lines = []
    for split in ("dev", "test"):
        scores = dictionary_baseline(splits["train"], splits[split])
        lines.append(f"dictionary baseline on {split}: entity F1 {scores['f1']:.4f} (precision "
                     f"{scores['precision']:.4f}, recall {scores['recall']:.4f})\n")
    with open(os.path.join(out_dir, "baseline.txt"), "w", encoding="utf-8") as f:
        f.writelines(lines)
    print("".join(lines), end="")


if __name__ == "__main__":
    main(*sys.argv[1:])
