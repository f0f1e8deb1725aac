"""Reproduces the stall behind the slow prediction passes (benchmarks/NOTES.md, item 6).

Iterates a finite dataset through `MirroredStrategy.experimental_distribute_dataset` with a step of
about 130 ms of work, then times dropping the exhausted iterator. Often that takes 1 ms, but every few
runs it takes seconds (2.5 s and 7.6 s measured). The main thread waits in
`UnboundedThreadPool::LogicalThreadWrapper::~LogicalThreadWrapper` (py-spy --native) for a tf.data
thread of the MultiDeviceIterator's host pipeline to finish. A plain `iter(dataset)` showed no stall.
`--via bert_mgpu` drops bert_mgpu's `distribute.distribute_dataset` iterator instead (item 12).

Usage: python benchmarks/iterator_stall.py [--runs 6] [--towers 2] [--via tf|bert_mgpu]
       (each run in its own process)
"""

import argparse
import os
import subprocess
import sys


def one_run(towers, via):
    import time

    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * towers)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(towers)])
    rows = np.random.default_rng(0).integers(0, 1000, (256, 128)).astype(np.int32)
    ds = tf.data.Dataset.from_tensor_slices(rows).repeat().batch(32).prefetch(tf.data.AUTOTUNE).take(20)
    a = tf.random.normal([3000, 3000])
    step = tf.function(lambda b: strategy.run(lambda t: tf.reduce_sum(a @ a) + tf.cast(tf.reduce_sum(t), tf.float32),
                                              args=(b,)))
    if via == "bert_mgpu":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from bert_mgpu.parallel.distribute import distribute_dataset

        it = iter(distribute_dataset(strategy, ds))
    else:
        it = iter(strategy.experimental_distribute_dataset(ds))
    for batch in it:
        [v.numpy() for v in strategy.experimental_local_results(step(batch))]
    start = time.perf_counter()
    del it
    print(f"dropping the exhausted distributed iterator: {1000 * (time.perf_counter() - start):.0f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--towers", type=int, default=1, help="logical CPU devices, one tower each")
    ap.add_argument("--via", choices=("tf", "bert_mgpu"), default="tf")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one_run(args.towers, args.via)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, __file__, "--one", "--towers", str(args.towers), "--via", args.via],
                             capture_output=True, text=True, env=env)
        print(next((line for line in out.stdout.splitlines() if line.startswith("dropping")), out.stderr[-300:]))


if __name__ == "__main__":
    main()
