"""Is another input pipeline faster? Cases (b) and (eb) through two versions of input_pipeline.py, interleaved.

The same model and trainer run both inputs in one process, call after call (as the other A/B scripts,
since separate processes differ by up to 2x here). Each call is a whole prediction pass over the dev set
(eb) or `--steps` training steps (b); both inputs see the same examples, so the ratio of medians is the
ratio of time per example.

Usage:
    git show HEAD:bert_mgpu/input_pipeline.py > /tmp/before.py
    python benchmarks/ab_input.py b|eb /tmp/before.py [--reps 8] [--steps 30] [--reuse]
"""

import argparse
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["b", "eb"])
    ap.add_argument("other", help="another version of bert_mgpu/input_pipeline.py")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reuse", action="store_true", help="eb: make each dataset once and iterate it every pass")
    args = ap.parse_args()
    import bench_bert_mgpu

    from bert_mgpu.devices import distribute_dataset

    spec = importlib.util.spec_from_file_location("other_input_pipeline", args.other)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    tw, _, trainer, new = bench_bert_mgpu.build(args.case)
    old = bench_bert_mgpu.rt_dataset(args.case, other.make_dataset)
    if args.case == "eb":  # each pass makes its dataset (tokenizing is part of it), as bench_bert_mgpu does
        make = {"old": other.make_dataset, "new": None}
        if args.reuse:  # or reads it again
            calls = {name: (lambda ds: lambda: trainer.predict_logits(ds))(bench_bert_mgpu.rt_dataset(args.case, m))
                     for name, m in make.items()}
        else:
            calls = {name: (lambda m: lambda: trainer.predict_logits(bench_bert_mgpu.rt_dataset(args.case, m)))(m)
                     for name, m in make.items()}
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
