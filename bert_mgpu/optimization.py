"""Optimizers and learning-rate schedules: google-research/bert's, plus LAMB and time-based schedules.

Default (the classifier): AdamW with weight decay 0.01 except on LayerNorm and biases, epsilon 1e-6,
linear warmup then linear decay to 0, and clipping of the global gradient norm to 1.0. (Keras' AdamW
applies Adam's bias correction, which google-bert's AdamWeightDecayOptimizer omits; it only changes the
first few steps.) Pretraining adds LAMB (Keras' Lamb: decoupled weight decay, per-layer trust ratio),
polynomial decay, and the time-based schedule of "How to Train BERT with an Academic Budget", where the
learning rate follows the share of a wall-clock budget spent rather than a step count.

The training step averages gradients over towers itself, so the optimizer here must not all-reduce them
again: Keras' TF optimizer sums per-replica gradients inside `apply()` and clips each tower's gradient
before that sum, which would clip partial gradients instead of the global one google-bert clips.
"""

import math

import keras
import tensorflow as tf

from bert_mgpu.errors import UserError


class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr = peak * step / warmup during warmup, then peak * (1 - step / total) ** power down to 0.

    power=1 is google-bert's linear decay; other powers are the polynomial decay of academic-budget-bert.
    """

    def __init__(self, peak, total_steps, warmup_steps, power=1.0):
        self.peak, self.total_steps, self.warmup_steps = float(peak), int(total_steps), int(warmup_steps)
        self.power = float(power)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        decay = self.peak * keras.ops.maximum(0.0, 1.0 - step / max(1, self.total_steps)) ** self.power
        if self.warmup_steps <= 0:
            return decay
        warm = self.peak * step / self.warmup_steps
        return keras.ops.where(step < self.warmup_steps, warm, decay)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "power": self.power}


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


def _tower_averaged(base):
    """`base` fed gradients that are already the mean over towers (see the module docstring)."""

    class TowerAveraged(base):
        def _all_reduce_sum_gradients(self, grads_and_vars):
            return list(grads_and_vars)

    TowerAveraged.__name__ = TowerAveraged.__qualname__ = "TowerAveraged" + base.__name__
    return TowerAveraged


class FusedAdamW(keras.optimizers.AdamW):
    """Keras' AdamW with each variable's Adam update in one kernel (TensorFlow's ResourceApplyAdam).

    Keras writes the update as seven elementwise ops, each a pass over the variable and its two slots;
    the fused kernel makes one. Same formula (Adam with bias correction and epsilon outside the square
    root); the decoupled weight decay stays Keras' own. Sparse gradients take Keras' path.
    """

    def update_step(self, gradient, variable, learning_rate):
        if isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        step = tf.cast(self.iterations + 1, dtype)
        handle = lambda t: t.handle  # noqa: E731  (inside a strategy update: this device's copy)
        tf.raw_ops.ResourceApplyAdam(
            var=handle(variable.value if isinstance(variable, keras.Variable) else variable),
            m=handle(m), v=handle(v),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype), beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype), use_locking=False)


TowerAveragedAdamW = _tower_averaged(FusedAdamW)
TowerAveragedLamb = _tower_averaged(keras.optimizers.Lamb)
OPTIMIZERS = {"adamw": TowerAveragedAdamW, "lamb": TowerAveragedLamb}


def create_optimizer(learning_rate, num_train_steps=None, num_warmup_steps=0, weight_decay=0.01,
                     float16=False, optimizer="adamw", beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                     schedule=None, clipnorm=1.0):
    """google-bert's optimizer (or LAMB), wrapped for loss scaling.

    `schedule` overrides the step-based warmup + linear decay (e.g. a TimeBasedDecay). Every precision
    gets Keras' LossScaleOptimizer, because it is also what skips a step whose gradients are not finite:
    under mixed_float16 its scale is dynamic (starting at 2**15); otherwise the scale starts at 1 and the
    wrapper only guards against NaN/Inf.
    """
    if optimizer not in OPTIMIZERS:
        raise UserError(f"--optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    if schedule is None:
        schedule = WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps)
    inner = OPTIMIZERS[optimizer](
        learning_rate=schedule, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
        global_clipnorm=clipnorm,
    )
    inner.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    if float16:
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**15)
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=1.0, dynamic_growth_steps=2**30)
