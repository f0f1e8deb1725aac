"""Where a bert_mgpu training step goes: TensorFlow profiler trace of a few steps, time summed by op type.

Ops run one at a time (`inter_op_parallelism_threads=1`), so the sums add up to the step's wall time and
no op's time is counted twice.

Usage: python benchmarks/profile_step.py CASE [--steps 3] [--top 25]   (CASE: a, b, c, d, t, eb or et; see common.py)

For eb and et a "step" is one whole prediction pass over the case's set (after a warm-up pass).
"""

import argparse
import collections
import glob
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def op_times(logdir):
    """{event name: exclusive ms} on the op-running threads, and the traced span in ms.

    Events nest (a function's executor > an op > XLA's ParallelFor), so each event's time is its own
    minus its children's. XLA kernels show as their HLO fusions, plus ParallelFor / BlockUntilReady
    while the calling thread waits for XLA's worker threads.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb"))[0], "rb") as f:
        space.ParseFromString(f.read())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    own, first, last = collections.Counter(), None, 0
    for line in plane.lines:
        if not line.name.startswith("tf_Compute"):
            continue
        events = sorted(((e.offset_ps, e.offset_ps + e.duration_ps, plane.event_metadata[e.metadata_id].name)
                         for e in line.events), key=lambda e: (e[0], -e[1]))
        stack = []
        for start, end, name in events:
            while stack and stack[-1][1] <= start:
                stack.pop()
            kind = name.split(":")[-1]
            own[kind] += end - start
            if stack:
                own[stack[-1][2]] -= end - start
            stack.append((start, end, kind))
            first = start if first is None else min(first, start)
            last = max(last, end)
    return {k: v / 1e9 for k, v in own.items()}, (last - (first or 0)) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["a", "b", "c", "d", "t", "eb", "et"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    import bench_bert_mgpu

    predicting = args.case in ("eb", "et")
    if predicting:
        trainer = bench_bert_mgpu.build(args.case)[2]
        step = lambda: trainer.predict_logits(bench_bert_mgpu.case_dataset(args.case))  # noqa: E731
    else:
        trainer, dist = bench_bert_mgpu.setup(args.case)
        step = lambda: trainer.train_step(next(dist))  # noqa: E731
    import common

    for _ in range(1 if predicting else max(3, common.CASES[args.case]["warmup"])):
        step()  # (b): every length bucket traced and compiled before the profile
    logdir = tempfile.mkdtemp(prefix="bert_mgpu_profile_")
    tf.profiler.experimental.start(logdir)
    for _ in range(args.steps):
        step()
    tf.profiler.experimental.stop()
    totals, span = op_times(logdir)
    ops = sum(totals.values())
    print(f"{args.steps} steps traced: {span / args.steps:.0f} ms a step, {ops / args.steps:.0f} ms of it in events")
    for kind, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {kind:40s} {ms / args.steps:8.1f} ms  {100 * ms / ops:5.1f}%")


if __name__ == "__main__":
    main()
