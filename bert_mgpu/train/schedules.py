"""Learning-rate schedules: google-research/bert's warmup + linear decay (or polynomial), and the
time-based schedule of "How to Train BERT with an Academic Budget", where the learning rate follows the
share of a wall-clock budget spent rather than a step count.

Example:
    schedule = WarmupLinearDecay(5e-5, total_steps=1000, warmup_steps=100)
    float(schedule(50))    # 2.5e-05
"""

import math

import keras
import tensorflow as tf

from bert_mgpu.core.errors import UserError


class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr = peak * step / warmup during warmup, then a decay to 0 at total_steps.

    from_warmup=False: peak * (1 - step / total) ** power, google-bert's line (power 1), drawn from step 0, so
    the rate drops from the peak to peak * (1 - warmup / total) when warmup ends; other powers are the
    polynomial decay of academic-budget-bert. from_warmup=True: peak * ((total - step) / (total - warmup)) **
    power, from the peak at warmup's end, as transformers' get_linear_schedule_with_warmup (power 1): with
    power 1 the area under the rate is peak x total / 2, against (w + (1 - w)^2) / 2 of it from step 0 (w the
    warmup share: 9% less at 0.1; benchmarks/NOTES.md item 83).
    """

    def __init__(self, peak, total_steps, warmup_steps, power=1.0, from_warmup=False):
        self.peak, self.total_steps, self.warmup_steps = float(peak), int(total_steps), int(warmup_steps)
        self.power, self.from_warmup = float(power), bool(from_warmup)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        start = self.warmup_steps if self.from_warmup else 0
        left = 1.0 - (step - start) / max(1, self.total_steps - start)
        decay = self.peak * keras.ops.minimum(1.0, keras.ops.maximum(0.0, left)) ** self.power
        if self.warmup_steps <= 0:
            return decay
        warm = self.peak * step / self.warmup_steps
        return keras.ops.where(step < self.warmup_steps, warm, decay)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "power": self.power, "from_warmup": self.from_warmup}


def time_based_lr(progress, peak, warmup_proportion, curve="linear"):
    """The learning rate at `progress` (share of the time budget spent, 0..1); works on floats and tensors.

    Linear warmup over the first `warmup_proportion` of the budget, then `linear` decay to 0 at the
    budget, or `exp`: an exponential decay (rate 5 per remaining budget) shifted so it too reaches 0
    exactly at the budget rather than only approaching it.
    """
    ops = keras.ops
    p = ops.clip(ops.cast(progress, "float32"), 0.0, 1.0)
    after = ops.maximum(0.0, (p - warmup_proportion) / max(1e-9, 1.0 - warmup_proportion))
    if curve == "linear":
        decay = 1.0 - after
    elif curve == "exp":
        decay = (ops.exp(-5.0 * after) - math.exp(-5.0)) / (1.0 - math.exp(-5.0))
    else:
        raise UserError(f"--curve={curve!r}: expected linear or exp")
    if warmup_proportion <= 0:
        return peak * decay
    return peak * ops.where(p < warmup_proportion, p / warmup_proportion, decay)


class TimeBasedDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`time_based_lr` of `progress`, a variable the training loop sets from its clock before each step."""

    def __init__(self, peak, warmup_proportion, curve="linear", progress=None):
        self.peak, self.warmup_proportion, self.curve = float(peak), float(warmup_proportion), curve
        self.progress = progress if progress is not None else tf.Variable(0.0, trainable=False, name="progress")
        time_based_lr(0.0, 1.0, self.warmup_proportion, curve)  # reject a bad curve now, not mid-training

    def __call__(self, step):
        return time_based_lr(self.progress, self.peak, self.warmup_proportion, self.curve)

    def get_config(self):
        return {"peak": self.peak, "warmup_proportion": self.warmup_proportion, "curve": self.curve}
