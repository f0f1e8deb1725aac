"""Is another input pipeline faster? Cases (b) and (eb) through two versions of input_pipeline.py, interleaved.

The same model and trainer run both inputs in one process, call after call (as the other A/B scripts,
since separate processes differ by up to 2x here). Each call is a whole prediction pass over the dev set
(eb) or `--steps` training steps (b); both inputs see the same examples, so the ratio of medians is the
ratio of time per example.

Usage:
    git show HEAD:bert_mgpu/data/input_pipeline.py > /tmp/before.py
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
    ap.add_argument("other", help="another version of bert_mgpu/data/input_pipeline.py")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reuse", action="store_true", help="eb: make each dataset once and iterate it every pass")
    args = ap.parse_args()
    import bench_bert_mgpu

    from bert_mgpu.parallel.distribute import distribute_dataset

    spec = importlib.util.spec_from_file_location("other_input_pipeline", args.other)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    tw, _, trainer, _ = bench_bert_mgpu.build(args.case)
    versions = {"old": other.make_dataset, "new": None}  # None: the current input_pipeline
    if args.case == "eb":
        def pass_with(make_dataset):  # each pass makes its dataset (tokenizing is part of it), as the bench does
            if args.reuse:  # or make it once and read it again every pass
                made = bench_bert_mgpu.rt_dataset(args.case, make_dataset)
                return lambda: trainer.predict_logits(made)
            return lambda: trainer.predict_logits(bench_bert_mgpu.rt_dataset(args.case, make_dataset))

        calls = {name: pass_with(make) for name, make in versions.items()}
        warmup = 1
    else:
        def steps_with(make_dataset):
            it = iter(distribute_dataset(tw.strategy, bench_bert_mgpu.rt_dataset(args.case, make_dataset)
                                         .map(lambda f, y, i: (f, y))))

            def run():
                for _ in range(args.steps):
                    loss = trainer.train_step(next(it))[0]
                float(loss)  # blocks until the last step is done
            return run

        calls = {name: steps_with(make) for name, make in versions.items()}
        warmup = 4  # every bucket traced before timing
    common.ab_compare(calls, args.reps, warmup)


if __name__ == "__main__":
    main()
