"""How much a training step's peak memory moves from step to step on CPU towers (benchmarks/NOTES.md, item 39).

Runs the same batch through the same traced step of 2 logical CPU towers again and again, reading the
allocator's peak (`memory.AllocatorPeak`, reset before each step), and prints for each per-tower batch the
median, the largest over the smallest, and the largest over the lowest of the 2-step trials the steps
make in pairs (a trial's peak is its higher step): how far a run's steps can peak above a short trial.
`--model test` is the memory tests' model, `--model larger` 4 layers of hidden size 256 with BERT's
vocabulary. Set TF_ENABLE_ONEDNN_OPTS=0 to see a
CPU without AVX512/AMX; `--inter_op 1` runs each step's ops in one order.

Usage: python benchmarks/step_peak_spread.py [--model test|larger] [--steps 40] [--batches 4,8,12,16,24]
"""

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = {  # BertConfig overrides, sequence length
    "test": (dict(vocab_size=38, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64), 64),
    "larger": (dict(vocab_size=30522, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                    num_attention_heads=4, max_position_embeddings=128), 128),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="test")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batches", default="4,8,12,16,24", help="per-tower batch sizes, comma-separated")
    ap.add_argument("--inter_op", type=int, default=0, help="TensorFlow's inter-op threads (0: its default)")
    args = ap.parse_args()
    from bert_mgpu.parallel import devices

    devices.keep_cpu_memory_statistics()  # before TensorFlow starts: its BFC allocator where oneDNN is off
    import tensorflow as tf

    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    from bert_mgpu.model import modeling
    from bert_mgpu.model.config import BertConfig
    from bert_mgpu.parallel import distribute
    from bert_mgpu.train import memory, optimization, training

    plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(plan)
    overrides, length = MODELS[args.model]
    with strategy.scope():
        model = modeling.build_classifier(BertConfig(**overrides), 2)
        trainer = training.Trainer(strategy, model, optimization.create_optimizer(0.0, 10, 0))
    meter = memory.peak_meter(plan)
    print(f"model {args.model}, length {length}, 2 CPU towers, oneDNN "
          f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}, {args.steps} steps a batch")
    for per_tower in (int(b) for b in args.batches.split(",")):
        batch = memory.classifier_batch(2 * per_tower, length)
        dist = next(iter(distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(batch))))
        trainer.train_step(dist)  # traces
        peaks = []
        for _ in range(args.steps):
            meter.reset()
            trainer.train_step(dist)
            peaks.append(meter.read_mb())
        trials = [max(peaks[i:i + 2]) for i in range(0, len(peaks) - 1, 2)]
        print(f"batch {per_tower:3d}: median {statistics.median(peaks):8.2f} MiB, largest / smallest "
              f"{max(peaks) / min(peaks):.3f}, largest / lowest 2-step trial {max(peaks) / min(trials):.3f}")


if __name__ == "__main__":
    main()
