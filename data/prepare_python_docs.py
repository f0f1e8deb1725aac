"""Python's reST documentation (Debian package python3.11-doc) -> pretraining text.

Usage: python data/prepare_python_docs.py SOURCES_DIR OUT_DIR
Writes OUT_DIR/train.txt and OUT_DIR/valid.txt in google-bert's input format: one sentence per line, a
blank line between documents (one document per .rst.txt page). Markup lines (directives, titles'
underlines, indented code) are dropped; paragraphs are split into sentences at ". " before a capital.
Pages go to valid.txt by a hash of their path (5%), so validation text is unseen.
"""

import os
import re
import sys
import zlib

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
INLINE_ROLE = re.compile(r":[a-z:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`len` -> len


def paragraphs(text):
    para = []
    for line in text.splitlines():
        stripped = line.strip()
        markup = (not stripped or line[:1].isspace() or stripped.startswith((".. ", "..", "|"))
                  or re.fullmatch(r"([=\-~^\"'*+#`:.])\1{2,}", stripped))
        if markup:
            if para:
                yield " ".join(para)
                para = []
        else:
            para.append(stripped)
    if para:
        yield " ".join(para)


def sentences(paragraph):
    paragraph = INLINE_ROLE.sub(r"\1", paragraph).replace("``", "").replace("**", "").replace("*", "")
    for s in SENTENCE_END.split(paragraph):
        s = s.strip().rstrip(":")
        if len(s.split()) >= 3:
            yield s


def main(src, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    outs = {name: open(os.path.join(out_dir, f"{name}.txt"), "w", encoding="utf-8") for name in ("train", "valid")}
    counts = dict.fromkeys(outs, 0)
    for root, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith(".rst.txt"):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = [s for p in paragraphs(f.read()) for s in sentences(p)]
            if len(lines) < 2:
                continue
            split = "valid" if zlib.crc32(os.path.relpath(path, src).encode()) % 20 == 0 else "train"
            outs[split].write("\n".join(lines) + "\n\n")
            counts[split] += len(lines)
    for f in outs.values():
        f.close()
    print(f"sentences: {counts} -> {out_dir}")


if __name__ == "__main__":
    main(*sys.argv[1:])
