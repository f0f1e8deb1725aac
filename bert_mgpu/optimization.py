"""Optimizer and learning-rate schedule as google-research/bert's `optimization.create_optimizer`.

AdamW with weight decay 0.01 except on LayerNorm and biases, epsilon 1e-6, linear warmup then linear
decay to 0, and clipping of the global gradient norm to 1.0. (Keras' AdamW applies Adam's bias
correction, which google-bert's AdamWeightDecayOptimizer omits; it only changes the first few steps.)

The training step averages gradients over towers itself, so the optimizer here must not all-reduce them
again: Keras' TF optimizer sums per-replica gradients inside `apply()` and clips each tower's gradient
before that sum, which would clip partial gradients instead of the global one google-bert clips.
"""

import keras


class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr = peak * step / warmup during warmup, then peak * (1 - step / total) down to 0."""

    def __init__(self, peak, total_steps, warmup_steps):
        self.peak, self.total_steps, self.warmup_steps = float(peak), int(total_steps), int(warmup_steps)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        decay = self.peak * keras.ops.maximum(0.0, 1.0 - step / max(1, self.total_steps))
        if self.warmup_steps <= 0:
            return decay
        warm = self.peak * step / self.warmup_steps
        return keras.ops.where(step < self.warmup_steps, warm, decay)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps}


class TowerAveragedAdamW(keras.optimizers.AdamW):
    """Keras AdamW fed gradients that are already the mean over towers (see the module docstring)."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


def create_optimizer(learning_rate, num_train_steps, num_warmup_steps, weight_decay=0.01,
                     float16=False):
    """google-bert's optimizer, wrapped for loss scaling.

    Every precision gets Keras' LossScaleOptimizer, because it is also what skips a step whose
    gradients are not finite: under mixed_float16 its scale is dynamic (starting at 2**15); otherwise
    the scale starts at 1 and the wrapper only guards against NaN/Inf.
    """
    inner = TowerAveragedAdamW(
        learning_rate=WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps),
        weight_decay=weight_decay, beta_1=0.9, beta_2=0.999, epsilon=1e-6, global_clipnorm=1.0,
    )
    inner.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    if float16:
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**15)
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=1.0, dynamic_growth_steps=2**30)
