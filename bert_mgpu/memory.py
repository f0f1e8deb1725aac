"""The largest per-tower batch that fits (`--auto_batch_size`), found by trying real training steps.

A batch size fits when one training step (forward, backward, all-reduce; no weight changes) on sequences
of max_seq_length real tokens, the worst case, runs without ResourceExhaustedError and its peak memory
stays under the limit. The peak is TensorFlow's own allocator statistic (`get_memory_info`, reset before
each trial), so a smaller trial after a larger one still reads its own peak; it works on GPUs and, with
one allocator shared by all logical CPU towers, on the host.
- GPU: the limit defaults to 98% of each tower's memory: the "fill the card" people do when training BERT
  on an 8 GB GPU, with 2% left for cuDNN workspaces and fragmentation.
- CPU: nothing fails before the machine swaps, so the user gives the limit (`memory_limit_mb`, for the
  step's working memory of all towers together). XLA-compiled kernels (the fused encoder) take their
  buffers from the same allocator, so they are counted; steps under ~1 MiB read 0 (TensorFlow's CPU
  statistics skip them), which only toy models notice.

Example:
    per_tower = find_batch_size(trainer, lambda b: synthetic_batch(...), plan, limit_mb=4096)
"""

import gc
import logging

import numpy as np
import tensorflow as tf

from bert_mgpu import devices
from bert_mgpu.errors import UserError

log = logging.getLogger("bert_mgpu")


def largest_fitting(fits, cap=4096):
    """Largest b in [1, cap] with `fits(b)`, for a predicate that is true up to some size and false after:
    doubling from 1, then bisection (about 2 log2(b) trials). 0 when not even 1 fits."""
    if not fits(1):
        return 0
    low, high = 1, None
    while high is None:
        step = min(low * 2, cap)
        if step == low:
            return low
        low, high = (step, None) if fits(step) else (low, step)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def peak_mb(plan):
    """Peak allocator memory (MiB) since the last reset: the largest over the GPU towers' devices, or the
    host allocator all CPU towers share."""
    names = [f"GPU:{i}" for i in range(plan.towers)] if plan.device_type == "GPU" else ["CPU:0"]
    return max(tf.config.experimental.get_memory_info(n)["peak"] for n in names) / 2**20


def reset_peak(plan):
    gc.collect()
    names = [f"GPU:{i}" for i in range(plan.towers)] if plan.device_type == "GPU" else ["CPU:0"]
    for n in names:
        tf.config.experimental.reset_memory_stats(n)


def default_limit_mb(plan, memory_per_tower_mb=None):
    """98% of a tower's GPU memory; on CPU there is no default (UserError)."""
    if plan.device_type != "GPU":
        raise UserError("--auto_batch_size on CPU needs --memory_limit_mb (memory the training step of all "
                        "towers may take)")
    from bert_mgpu.devices import gpu_memory_mb

    total = memory_per_tower_mb or gpu_memory_mb(plan.visible_names[0])
    if total is None:
        raise UserError(f"cannot read the memory of CUDA device {plan.visible_names[0]}; pass --memory_limit_mb")
    if memory_per_tower_mb is None:
        total /= plan.towers_per_device
    return 0.98 * total


def classifier_batch(global_batch, seq_length, token_id=5):
    """A worst-case classifier batch: every sequence max_seq_length real tokens."""
    ids = np.full((global_batch, seq_length), token_id, np.int32)
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}
    return features, np.zeros(global_batch, np.int32)


def pretraining_batch(global_batch, seq_length, max_predictions, token_id=5):
    """A worst-case pretraining batch: full sequences, every prediction slot used."""
    ids = np.full((global_batch, seq_length), token_id, np.int32)
    positions = np.tile(np.arange(1, max_predictions + 1, dtype=np.int32) % seq_length, (global_batch, 1))
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool),
                "mask_positions": positions}
    labels = {"masked_lm_ids": np.full_like(positions, token_id), "masked_lm_weights": np.ones(positions.shape,
              np.float32), "next_sentence_labels": np.zeros(global_batch, np.int32)}
    return features, labels


def find_for_model(towers, model, policy, make_batch, loss_fn=None, memory_limit_mb=None,
                   memory_per_tower_mb=None, cap=4096):
    """`find_batch_size` for a model on its towers, with a throwaway optimizer (the Trainer builds it, and its
    slots take memory during training too). Returns the largest per-tower batch that fits."""
    from bert_mgpu import optimization, training

    limit = memory_limit_mb if memory_limit_mb is not None else default_limit_mb(towers.plan, memory_per_tower_mb)
    with towers.strategy.scope():
        optimizer = optimization.create_optimizer(1e-5, 10, 0, float16=policy == "mixed_float16")
    probe = training.Trainer(towers.strategy, model, optimizer, loss_fn=loss_fn or training.classification_loss)
    best, _ = find_batch_size(probe, make_batch, towers.plan, limit, cap)
    return best


def find_batch_size(trainer, make_batch, plan, limit_mb, cap=4096):
    """Largest per-tower batch whose training step fits under `limit_mb` (see the module docstring).

    `make_batch(global_batch)` -> a (features, labels) batch of that many examples.
    """
    strategy, trials = trainer.strategy, []

    def fits(per_tower):
        batch = make_batch(per_tower * trainer.strategy.num_replicas_in_sync)
        dist = next(iter(devices.distribute_dataset(strategy, tf.data.Dataset.from_tensors(batch))))
        reset_peak(plan)
        try:
            trainer.probe_step(dist)
        except tf.errors.ResourceExhaustedError:
            trials.append((per_tower, None))
            return False
        peak = peak_mb(plan)
        trials.append((per_tower, peak))
        return peak <= limit_mb

    best = largest_fitting(fits, cap)
    shown = ", ".join(f"{b}: {'OOM' if p is None else f'{p:.1f} MiB'}" for b, p in sorted(trials))
    if not best:
        raise UserError(f"not even one sequence per tower fits in {limit_mb:.0f} MiB (peaks {shown}); "
                        "use a shorter --max_seq_length")
    log.info("auto batch size: %d per tower fits in %.0f MiB (trials %s)", best, limit_mb, shown)
    return best, trials
