"""Does the input of step k+1 overlap step k? (issue: "The host waits for every step's all-reduce")

Two CPU towers train a small classifier (the real Trainer, collectives, update) on a dataset whose every
batch takes `--input_ms` of host time (a sleep in the pipeline: reading, tokenizing). The step's call
returns only when every tower is done, so with batches prepared in the caller's thread (`ahead=0`) a
step costs input + step; with bert_mgpu's thread preparing them ahead (`ahead=2`) it should cost about
max(input, step). Prints steps/s of each, the step alone and the input alone, and the ratio.

Usage: python benchmarks/input_overlap.py [--steps 40] [--input_ms auto]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--input_ms", default="auto", help="host time per batch; auto: the step's own time")
    args = ap.parse_args()

    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from bert_mgpu.model import modeling
    from bert_mgpu.model.config import BertConfig
    from bert_mgpu.parallel import devices, distribute
    from bert_mgpu.train import memory, optimization, training

    plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(plan)
    config = BertConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=128)
    with strategy.scope():
        model = modeling.build_classifier(config, 2, "float32")
        opt = optimization.create_optimizer(1e-4, 10_000, 0)
    trainer = training.Trainer(strategy, model, opt)
    features, _ = memory.classifier_batch(32, 128)
    labels = np.arange(32, dtype=np.int32) % 2

    def data(delay_s):
        def slow(i):
            time.sleep(delay_s)
            return i

        ds = tf.data.Dataset.range(10_000).map(lambda i: tf.py_function(slow, [i], tf.int64))
        return ds.map(lambda i: (features, labels))

    def rate(delay_s, ahead):
        batches = distribute.distribute_dataset(strategy, data(delay_s), ahead=ahead)
        trainer.input_spec = batches.element_spec
        it = iter(batches)
        for _ in range(3):
            trainer.train_step(next(it))
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step(next(it))
        took = time.perf_counter() - start
        getattr(it, "close", lambda: None)()
        return args.steps / took

    step_alone = rate(0.0, 2)
    delay = 1.0 / step_alone if args.input_ms == "auto" else float(args.input_ms) / 1000
    input_alone = 1.0 / delay
    inline, ahead = rate(delay, 0), rate(delay, 2)
    best = min(step_alone, input_alone)
    print(f"step alone {step_alone:.2f} steps/s; input alone {input_alone:.2f} batches/s ({1000 * delay:.0f} ms)")
    print(f"ahead=0 (prepared between steps): {inline:.2f} steps/s, {inline / best:.0%} of max(input, step)")
    print(f"ahead=2 (prepared while a step runs): {ahead:.2f} steps/s, {ahead / best:.0%} of max(input, step)")
    print(f"ratio ahead/inline: {ahead / inline:.2f}x (sum model: {1 / (1 / step_alone + delay) / best:.0%})")


if __name__ == "__main__":
    main()
