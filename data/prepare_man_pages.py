"""A long-document classification set from the Linux manual pages (Debian packages manpages, manpages-dev).

Usage: python data/prepare_man_pages.py MAN_DIR OUT_DIR      (MAN_DIR: the packages' usr/share/man)

Each page is one document, rendered to plain text by groff; its label is the manual section it belongs to:
2 (system calls), 3 (library functions), 4 (special files), 5 (file formats) or 7 (overviews). The page's
header and footer lines, which print its own section ("OPEN(2)"), are dropped, as are pages that only
point to another (`.so`). Pages go to dev.tsv by a hash of their name (a fifth). Most pages are far longer
than 512 pieces, and telling a system call from a library function often needs more than the page's start:
a task for --truncation and windows. Prints the label counts and the pages' length distribution in words.
"""

import collections
import gzip
import os
import re
import subprocess
import sys
import zlib

SECTIONS = ("2", "3", "4", "5", "7")


def render(path):
    """A page's text (groff, no formatting codes), or None for a page that only includes another."""
    source = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    if re.match(r"\s*\.so\s", "\n".join(line for line in source.splitlines() if not line.startswith('.\\"'))):
        return None
    out = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou", "-rLL=200n"], input=source, capture_output=True,
                         text=True, check=True).stdout
    lines = [line.rstrip() for line in out.splitlines()]
    lines = [line for line in lines if line.strip()]
    if len(lines) < 3:
        return None
    body = lines[1:-1]  # the header and footer print the page's own section
    return " ".join(" ".join(body).split())


def main(man_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = {"train": [], "dev": []}
    for section in SECTIONS:
        folder = os.path.join(man_dir, f"man{section}")
        for name in sorted(os.listdir(folder)):
            text = render(os.path.join(folder, name))
            if not text:
                continue
            split = "dev" if zlib.crc32(name.encode()) % 5 == 0 else "train"
            rows[split].append((section, text.replace("\t", " ")))
    for split, found in rows.items():
        with open(os.path.join(out_dir, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("label\ttext\n")
            f.writelines(f"{label}\t{text}\n" for label, text in found)
        words = sorted(len(text.split()) for _, text in found)
        counts = collections.Counter(label for label, _ in found)
        print(f"{split}: {len(found)} pages, by section {dict(sorted(counts.items()))}; words a page: median "
              f"{words[len(words) // 2]}, quartiles {words[len(words) // 4]}-{words[3 * len(words) // 4]}, "
              f"over 400 words {sum(w > 400 for w in words) / len(words):.0%}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
