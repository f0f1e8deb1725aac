"""Reproduces the stall behind the slow prediction passes (benchmarks/NOTES.md, item 6).

Iterates a finite dataset through `MirroredStrategy.experimental_distribute_dataset` with a step of
about 130 ms of work, then times dropping the exhausted iterator. Often that takes 1 ms, but every few
runs it takes seconds (2.5 s and 7.6 s measured). The main thread waits in
`UnboundedThreadPool::LogicalThreadWrapper::~LogicalThreadWrapper` (py-spy --native) for a tf.data
thread of the MultiDeviceIterator's host pipeline to finish. A plain `iter(dataset)` showed no stall.

Usage: python benchmarks/iterator_stall.py [--runs 6]   (each run in its own process)
"""

import argparse
import os
import subprocess
import sys


def one_run():
    import time

    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    rows = np.random.default_rng(0).integers(0, 1000, (256, 128)).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices(rows).repeat().batch(32).prefetch(tf.data.AUTOTUNE).take(20)
    a = tf.random.normal([3000, 3000])
    step = tf.function(lambda b: strategy.run(lambda t: tf.reduce_sum(a @ a) + tf.cast(tf.reduce_sum(t), tf.float32),
                                              args=(b,)))
    it = iter(strategy.experimental_distribute_dataset(ds))
    for batch in it:
        step(batch).numpy()
    start = time.perf_counter()
    del it
    print(f"dropping the exhausted distributed iterator: {1000 * (time.perf_counter() - start):.0f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one_run()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, __file__, "--one"], capture_output=True, text=True, env=env)
        print(next((line for line in out.stdout.splitlines() if line.startswith("dropping")), out.stderr[-300:]))


if __name__ == "__main__":
    main()
