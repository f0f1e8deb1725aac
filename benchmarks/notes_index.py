"""The index at the top of benchmarks/NOTES.md: each numbered item's title and section, written between its
markers from the items themselves (`tests/test_readmes.py` checks that it is current).

    python benchmarks/notes_index.py          # rewrite the index in place
"""

import os
import re

NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "NOTES.md")
BEGIN, END = "<!-- index: benchmarks/notes_index.py writes it -->", "<!-- end of index -->"


def items(text):
    """[(number, title, section)] of the notes' numbered items (`N. **title** ...`, the title may wrap)."""
    body = text.split(END, 1)[-1]
    out, section = [], ""
    lines = body.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            section = line[3:].strip()
        m = re.match(r"^(\d+)\. \*\*(.*)", line)
        if not m:
            continue
        title = m.group(2)
        j = i
        while "**" not in title and j + 1 < len(lines):  # a title wrapped onto the next lines
            j += 1
            title += " " + lines[j].strip()
        out.append((int(m.group(1)), title.split("**")[0].strip(), section))
    return out


def index(text):
    rows = ["| item | what | section |", "|---:|---|---|"]
    rows += [f"| {n} | {title} | {section} |" for n, title, section in items(text)]
    return "\n".join([BEGIN, "## Index", "", *rows, END])


def with_index(text):
    """NOTES.md's text with its index current (placed after the first paragraph the first time)."""
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        return head + index(text) + rest.split(END, 1)[1]
    title, rest = text.split("\n", 1)
    return f"{title}\n\n{index(text)}\n{rest}"


if __name__ == "__main__":
    with open(NOTES, encoding="utf-8") as f:
        text = f.read()
    with open(NOTES, "w", encoding="utf-8") as f:
        f.write(with_index(text))
