"""How two CPU towers' gradients cross: TensorFlow's RING collectives (what bert_mgpu uses on CPUs, and
MirroredStrategy's own default there) against ReductionToOneDevice (what it used before) and the
NCCL-hinted collectives of a GPU run (which TensorFlow runs as RING on CPUs). MiniLM-L6's shape, sequence
128, 16 per tower, mixed_bfloat16, the real Trainer; examples/s over 6 steps after 2, alternated, 2 rounds.

Usage: python benchmarks/ab_cross_device.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from bert_mgpu.cli import check_models
    from bert_mgpu.core import _compat

    devices = ["/cpu:0", "/cpu:1"]
    kinds = {
        "ReductionToOneDevice": lambda: tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice(devices[0])),
        "RING collectives": lambda: _compat.mirrored_with_collectives(devices, "RING"),
        "NCCL-hinted collectives": lambda: _compat.mirrored_with_collectives(devices, "NCCL"),
    }
    rates = {k: [] for k in kinds}
    for _ in range(2):
        for kind, make in kinds.items():
            strategy = make()
            trainer = check_models.classifier_trainer(strategy, "demo", "mixed_bfloat16")
            batches = trainer.training_batches(check_models.random_batches(32, 128, 8))
            for _ in range(2):
                trainer.train_step(next(batches))
            start = time.perf_counter()
            for _ in range(6):
                trainer.train_step(next(batches))
            rates[kind].append(6 * 32 / (time.perf_counter() - start))
    base = np.mean(rates["ReductionToOneDevice"])
    for kind, r in rates.items():
        print(f"{kind}: {', '.join(f'{x:.1f}' for x in r)} ex/s, mean {np.mean(r) / base:.2f}x ReductionToOneDevice")


if __name__ == "__main__":
    main()
