"""Are other length buckets faster? Cases (b) and (eb) with two bucket boundary lists, interleaved.

The same model and trainer run both inputs in one process, call after call (as the other A/B scripts,
since separate processes differ by up to 2x here). Each call is a whole prediction pass over the dev set
(eb) or `--steps` training steps (b); both inputs see the same examples, so the ratio of medians is the
ratio of time per example.

Usage: python benchmarks/ab_buckets.py b|eb --old 16,24,32,48,64,96,128,192,256,384 [--reps 8]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["b", "eb"])
    ap.add_argument("--old", required=True, help="comma-separated boundaries to compare with the current ones")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    import bench_bert_mgpu

    from bert_mgpu import input_pipeline
    from bert_mgpu.devices import distribute_dataset

    current = input_pipeline._BOUNDARIES
    input_pipeline._BOUNDARIES = tuple(int(b) for b in args.old.split(","))
    tw, _, trainer, old = bench_bert_mgpu.build(args.case)
    input_pipeline._BOUNDARIES = current
    new = bench_bert_mgpu.build(args.case)[3]
    if args.case == "eb":
        calls = {"old": lambda: trainer.predict_logits(old), "new": lambda: trainer.predict_logits(new)}
        warmup = 1
    else:
        def steps(it):
            def run():
                for _ in range(args.steps):
                    loss = trainer.train_step(next(it))[0]
                float(loss)  # blocks until the last step is done
            return run
        iters = [iter(distribute_dataset(tw.strategy, ds.map(lambda f, y, i: (f, y)))) for ds in (old, new)]
        calls = {"old": steps(iters[0]), "new": steps(iters[1])}
        warmup = 4  # every bucket traced before timing
    common.ab_compare(calls, args.reps, warmup)


if __name__ == "__main__":
    main()
