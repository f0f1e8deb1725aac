"""The largest per-tower batch that fits (`--auto_batch_size`), found by trying real training steps.

A batch size fits when a training step on sequences of max_seq_length real tokens, the worst case, with
the optimizer's slots and the evaluation copies of the weights allocated, runs without
ResourceExhaustedError and its peak memory stays under the limit. Each trial runs once to trace and
compile, then MEASURED_STEPS times to be measured, and the largest peak counts: on CPUs the peak moves
with the order in which TensorFlow's threads run independent ops. A trial fits when its peak leaves 2%
of the limit free for what a run holds beyond one step (its input iterators, the loop's own traced
functions) and for steps that peak higher than any measured one. On CPUs the trial is
the real training step (all-reduce and update) of an optimizer whose learning rate is 0, so no weight
changes. On GPUs it is forward and backward on the first tower alone with every gradient held in one
buffer, as a collective's pack holds them, then the optimizer's update on that tower's device, and no collective
(`find_batch_size`). The input pipeline's buffers (a few batches of token ids) are not in any trial.

The peak is TensorFlow's allocator statistic (`get_memory_info`, reset before each trial), so a smaller
trial after a larger one still reads its own peak. GPUs always keep it. On CPUs, where TensorFlow leaves
oneDNN off its default allocator keeps none: `devices.keep_cpu_memory_statistics` (run by `Towers`
before TensorFlow starts) chooses TensorFlow's BFC allocator there, which does. XLA-compiled CPU kernels
take their buffers from the same allocator.
- GPU: the limit defaults to 95% of what TensorFlow's allocator may take on a tower (its logical-device
  split, or what the GPU had free before the run took any, less TensorFlow's reserve), on the GPU with
  the least, so 5% stays free for cuDNN and fragmentation.
- CPU: nothing fails before the machine swaps, so the user gives the limit (`memory_limit_mb`, for the
  memory of all towers together).

Example:
    best = find_for_model(towers, model, "float32", lambda n: classifier_batch(n, 128), memory_limit_mb=4096)
"""

import gc
import logging

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.model import fused_encoder
from bert_mgpu.parallel import agree, devices, distribute
from bert_mgpu.train import optimization, training

log = logging.getLogger("bert_mgpu")


RUN_MARGIN = 0.98  # of the limit, what a trial step may peak at
MEASURED_STEPS = 3  # a trial's peak is the largest of this many steps


def largest_fitting(fits, cap=4096, guess=None):
    """Largest b in [1, cap] with `fits(b)`, for a predicate that is true up to some size and false after:
    doubling from 1, then bisection (about 2 log2(b) trials). 0 when not even 1 fits.

    `guess(low, high)`, optional: the size the caller expects to be the edge, from what the trials so far
    measured (`high` None while no size has failed). It is tried instead of the doubling or bisection step,
    kept inside the bracket (at most 4x `low` while doubling). A guess that did not halve the bracket is
    followed by a bisection step, so a poor guesser costs at most about twice the trials of bisection."""
    if not fits(1):
        return 0
    low, high, bisect = 1, None, False
    while high is None or high - low > 1:
        if high is None and low >= cap:
            return low
        step = min(low * 2, cap) if high is None else (low + high) // 2
        edge = None if bisect or guess is None else guess(low, high)
        if edge is not None:
            step = int(min(max(edge, low + 1), high - 1 if high is not None else min(4 * low, cap)))
        before = (high or 2 * low) - low
        low, high = (step, high) if fits(step) else (low, step)
        bisect = edge is not None and high is not None and high - low > before // 2
    return low


def linear_edge(trials, usable):
    """The largest batch whose peak stays under `usable` on the line through the two measured trials nearest
    the edge, or None when they give no rising line. `trials`: [(batch, peak MiB, or None: out of memory)].
    A step's memory is its weights and slots plus activations linear in the batch, so a trial or two land
    on the edge where bisection takes log2 of the bracket."""
    measured = sorted((b, p) for b, p in trials if p is not None)
    under = [(b, p) for b, p in measured if p <= usable]
    over = [(b, p) for b, p in measured if p > usable]
    if not under:
        return None
    points = [under[-1], over[0]] if over else under[-2:]
    if len(points) < 2:
        return None
    (b0, p0), (b1, p1) = points
    if p1 <= p0:
        return None
    return b0 + int((usable - p0) * (b1 - b0) / (p1 - p0))


class AllocatorPeak:
    """Peak bytes TensorFlow's allocator held since `reset()`: the largest over the GPU towers' devices, or
    the host allocator all CPU towers share."""

    def __init__(self, plan):
        gpus = plan.device_type == "GPU"
        self.names = [f"GPU:{i}" for i in range(len(plan.physical_ids))] if gpus else ["CPU:0"]

    def reset(self):
        gc.collect()
        for name in self.names:
            tf.config.experimental.reset_memory_stats(name)

    def read_mb(self):
        return max(tf.config.experimental.get_memory_info(n)["peak"] for n in self.names) / 2**20


def peak_meter(plan):
    """The allocator statistics a trial reads, or UserError where TensorFlow keeps none."""
    meter = AllocatorPeak(plan)
    if plan.device_type == "CPU":
        try:
            meter.reset()
        except ValueError:
            raise UserError("--auto_batch_size: TensorFlow's CPU allocator keeps no memory statistics in this "
                            "process (it started before bert_mgpu could choose one that does): create "
                            "bert_mgpu.Towers before any TensorFlow op, or set TF_CPU_ALLOCATOR_USE_BFC=true "
                            "before starting Python") from None
    return meter


def default_limit_mb(plan, memory_per_tower_mb=None, gpus=None):
    """95% of TensorFlow's allocator cap on one tower (module docstring), on the GPU with the least free
    memory as `Towers` found it before the model took any (`towers.gpus`); on CPU there is no default."""
    if plan.device_type != "GPU":
        raise UserError("--auto_batch_size on CPU needs --memory_limit_mb (memory the training step of all "
                        "towers may take)")
    smallest = devices.smallest_gpu(plan, gpus) if not memory_per_tower_mb else None
    if plan.towers_per_device > 1 or memory_per_tower_mb:  # logical devices: their memory_limit is the cap
        cap = devices.tower_memory_limit_mb(plan, memory_per_tower_mb, gpus)
    else:
        cap = smallest.tensorflow_cap_mb
    name = smallest.name if smallest else plan.visible_names[0]
    log.info("auto batch size: TensorFlow's allocator may take %.0f MiB on a tower of CUDA device %s; the "
             "limit keeps 5%% of it free: %.0f MiB", cap, name, 0.95 * cap)
    return 0.95 * cap


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
                   memory_per_tower_mb=None, cap=4096, use_xla=False, recompute=False):
    """`find_batch_size` for a model on its towers, with a throwaway optimizer (the Trainer builds it, and its
    slots take memory during training too). Returns the largest per-tower batch that fits."""
    limit = memory_limit_mb
    if limit is None:
        limit = default_limit_mb(towers.plan, memory_per_tower_mb, getattr(towers, "gpus", None))
    with towers.strategy.scope():  # learning rate 0: trials run real steps and change no weight
        optimizer = optimization.create_optimizer(0.0, 10, 0, float16=policy == "mixed_float16")
    fused_encoder.set_recompute(model, recompute)  # trials step as the run will
    probe = training.Trainer(towers.strategy, model, optimizer, use_xla=use_xla,
                             loss_fn=loss_fn or training.classification_loss)
    best, _ = find_batch_size(probe, make_batch, towers.plan, limit, cap)
    every = agree.ChiefDecides(towers.strategy).every(best)
    if min(every) < best:
        log.info("auto batch size: %d per tower, the smallest any worker fits (workers: %s)", min(every),
                 ", ".join(str(int(b)) for b in every))
    return int(min(every))


def trial_step(trainer, make_batch, plan):
    """-> `measure(per_tower)`: the peak MiB of a trial step with that many sequences a tower, or None when
    it ran out of memory (see the module docstring and `find_batch_size`)."""
    strategy = trainer.strategy
    alone = plan.device_type == "GPU"
    if not alone and distribute.worker_of(strategy)[1] > 1:  # trials with collectives could differ by worker
        raise UserError("--auto_batch_size with several workers needs GPUs (each worker then tries its "
                        "towers alone, and all take the smallest that fits); on CPUs give "
                        "--train_batch_size")
    if not alone and trainer.learning_rate != 0.0:
        raise ValueError("find_batch_size runs real training steps on CPU: give the trainer an optimizer "
                         "with learning rate 0")
    with strategy.scope(), fused_encoder.frozen_weights(trainer.model):
        pass  # evaluation's copies of the weights: allocated once, held from then on, so counted
    meter = peak_meter(plan)
    trial = trainer.probe_step if alone else trainer.train_step

    def measure(per_tower):
        rows = per_tower if alone else per_tower * strategy.num_replicas_in_sync
        batch = make_batch(rows)
        dist = (distribute.first_tower_only(strategy, batch) if alone else
                next(iter(distribute.distribute_dataset(strategy, tf.data.Dataset.from_tensors(batch)))))
        try:
            trial(dist)  # traces and compiles
            meter.reset()
            for _ in range(MEASURED_STEPS):
                trial(dist)
        except tf.errors.ResourceExhaustedError:
            return None
        return meter.read_mb()

    return measure


def step_peaks(trainer, make_batch, plan, sizes):
    """{per-tower batch: peak MiB of its trial step, or None (out of memory)} for each of `sizes`."""
    measure = trial_step(trainer, make_batch, plan)
    return {size: measure(size) for size in sizes}


def find_batch_size(trainer, make_batch, plan, limit_mb, cap=4096):
    """Largest per-tower batch whose training step fits under `limit_mb` (see the module docstring).
    Returns it and the trials, [(per-tower batch, peak MiB or None: out of memory)].

    `make_batch(global_batch)` -> a (features, labels) batch of that many examples. CPU towers share one
    memory: a trial is a real training step of all of them, so the trainer's optimizer must have learning
    rate 0. On GPUs a trial runs on the first tower alone, with no collective: every tower needs the same
    memory, and an out-of-memory trial then aborts no collective of the others. After the first trials the
    next size is guessed from their peaks (`linear_edge`); the sizes on both sides of the edge are measured.
    """
    strategy, trials, usable = trainer.strategy, [], RUN_MARGIN * limit_mb
    alone = plan.device_type == "GPU"
    measure = trial_step(trainer, make_batch, plan)

    def fits(per_tower):
        peak = measure(per_tower)
        trials.append((per_tower, peak))
        return peak is not None and peak <= usable

    best = largest_fitting(fits, cap, guess=lambda low, high: linear_edge(trials, usable))
    shown = ", ".join(f"{b}: {'OOM' if p is None else f'{p:.2f} MiB' + (' over' if p > usable else '')}"
                      for b, p in sorted(trials))
    if not best:
        raise UserError(f"not even one sequence per tower fits in {limit_mb:.0f} MiB (peaks {shown}); "
                        "use a shorter --max_seq_length")
    log.info("auto batch size: %d per tower fits in %.1f MiB, %.0f%% of %.0f (trials %s; peaks of %s)", best, usable,
             100 * RUN_MARGIN, limit_mb, shown,
             "one tower alone" if alone else f"all {strategy.num_replicas_in_sync} tower(s) together")
    return best, trials
