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


class _Skippable:
    """An optimizer whose step can be made a no-op by arithmetic: while `_keep` is 0.0 (set by
    `SkippingLossScaleOptimizer` around `apply`), the learning rate is 0 and the moments do not move, so
    weights, slots and weight decay come out bit-identical; while it is 1.0 the step is the usual one."""

    _keep = None

    def _get_current_learning_rate(self):
        lr = super()._get_current_learning_rate()
        return lr if self._keep is None else lr * tf.cast(self._keep, tf.float32)

    def _moment_rate(self, beta, dtype):
        """1 - beta, or 0 while the step is skipped."""
        rate = 1.0 - tf.cast(beta, dtype)
        return rate if self._keep is None else rate * tf.cast(self._keep, dtype)


class FusedAdamW(_Skippable, keras.optimizers.AdamW):
    """Keras' AdamW with each variable's Adam update in one kernel (TensorFlow's ResourceApplyAdam).

    Keras writes the update as seven elementwise ops, each a pass over the variable and its two slots;
    the fused kernel makes one. Same formula (Adam with bias correction and epsilon outside the square
    root); the decoupled weight decay stays Keras' own. Sparse gradients take Keras' path. Under
    `create_optimizer`'s loss-scale wrapper the whole step runs instead as one XLA program per device
    (`SkippingLossScaleOptimizer._fused_adamw_apply`); this per-variable path is for other uses.
    """

    def _apply_weight_decay(self, variables):
        """Keras' decoupled decay `var -= var * wd * lr` as `var *= 1 - wd * lr`: one multiply of each
        variable instead of two and a subtract (benchmarks/NOTES.md, item 15). lr is 0 on a skipped
        step, so the factor is exactly 1."""
        if self.weight_decay is None:
            return

        def decay(variable):
            if self._use_weight_decay(variable):
                rate = tf.cast(self.weight_decay, variable.dtype) * tf.cast(self.learning_rate, variable.dtype)
                variable.assign(variable * (1.0 - rate))

        def apply(distribution, variables):
            for variable in variables:
                variable = variable.value if isinstance(variable, keras.Variable) else variable
                distribution.extended.update(variable, decay, group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(apply, self._distribution_strategy, variables)

    def update_step(self, gradient, variable, learning_rate):
        if isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            if self._keep is not None:
                raise NotImplementedError("sparse or AMSGrad updates under SkippingLossScaleOptimizer")
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        step = tf.cast(self.iterations + 1, dtype)
        handle = lambda t: t.handle  # noqa: E731  (inside a strategy update: this device's copy)
        # The kernel moves m by (g - m) * (1 - beta1): beta = 1 - rate keeps m (and v) where they are.
        tf.raw_ops.ResourceApplyAdam(
            var=handle(variable.value if isinstance(variable, keras.Variable) else variable),
            m=handle(m), v=handle(v),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype), beta1=1.0 - self._moment_rate(self.beta_1, dtype),
            beta2=1.0 - self._moment_rate(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype), use_locking=False)


class SkippableLamb(_Skippable, keras.optimizers.Lamb):
    """Keras' Lamb (the same formula, line for line), with moments that stand still on a skipped step."""

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr, gradient = tf.cast(learning_rate, dtype), tf.cast(gradient, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, (gradient - m) * self._moment_rate(self.beta_1, dtype))
        self.assign_add(v, (tf.square(gradient) - v) * self._moment_rate(self.beta_2, dtype))
        m_hat = m / (1.0 - tf.pow(tf.cast(self.beta_1, dtype), step))
        update = m_hat / (tf.sqrt(v / (1.0 - tf.pow(tf.cast(self.beta_2, dtype), step))) + self.epsilon)
        w_norm, u_norm = tf.norm(variable), tf.norm(update)
        ratio = tf.where(w_norm > 0, tf.where(u_norm > 0, w_norm / u_norm, 1.0), 1.0)
        self.assign_sub(variable, ratio * lr * update)


class SkippingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' dynamic loss scaling, with the skip of a non-finite step done without `tf.cond`.

    Same rule as Keras: a step whose gradients are not all finite changes no weight, no slot and not
    the schedule, and halves the scale; `dynamic_growth_steps` finite steps in a row double it. Keras
    branches with `tf.cond`, and TensorFlow keeps every traced branch function for the life of the
    process (tensorflow/tensorflow#62854), a leak per new model in a notebook. Here the gradients are
    unscaled with `multiply_no_nan` by 1/scale or 0, and the inner optimizer's step is multiplied away
    (see `_Skippable`), so the step is one straight-line graph.

    `clipnorm` clips the global norm of the unscaled gradients here, not in the inner optimizer: one
    sum of squares gives the norm and the finiteness (a sum with an Inf or NaN in it is not finite),
    and one multiply unscales and clips. Keras spends four passes over every gradient on that (a
    finiteness check, the unscale, the norm, the clip); on the memory-bound optimizer of a short-
    sequence step they cost more than the multiply (benchmarks/NOTES.md, item 15). Around FusedAdamW
    the whole step is one XLA program per device (`_fused_adamw_apply`).
    """

    def __init__(self, inner_optimizer, clipnorm=None, **kwargs):
        super().__init__(inner_optimizer, **kwargs)
        if inner_optimizer.global_clipnorm or inner_optimizer.clipnorm or inner_optimizer.clipvalue:
            raise ValueError("clip in SkippingLossScaleOptimizer(clipnorm=...), not in the inner optimizer")
        self.clip_global_norm = clipnorm

    def _tf_apply(self, grads, trainable_variables=None):
        def cross_replica(distribution, grads, variables):
            if self._fusable(grads):
                finite = self._fused_adamw_apply(distribution, grads, variables)
            else:
                finite = distribution.experimental_local_results(
                    distribution.extended.call_for_each_replica(self._guarded_apply, args=(grads, variables)))[0]
            count = tf.where(finite, self.step_counter + 1, 0)
            grow = tf.logical_and(finite, count >= self.dynamic_growth_steps)
            self.dynamic_scale.assign(self.dynamic_scale * tf.where(grow, 2.0, tf.where(finite, 1.0, 0.5)))
            self.step_counter.assign(tf.where(grow, tf.zeros_like(count), count))

        tf.distribute.get_replica_context().merge_call(cross_replica, args=(grads, trainable_variables))

    def _guarded_apply(self, grads, variables):
        """Apply the unscaled, clipped gradients, or change nothing if any is not finite; -> finite."""
        inner, scale = self.inner_optimizer, self.dynamic_scale
        squares = tf.add_n([2.0 * tf.nn.l2_loss(tf.cast(g, tf.float32)) for g in grads if g is not None])
        finite = tf.math.is_finite(squares)
        factor = 1.0 / scale
        if self.clip_global_norm:
            norm = tf.sqrt(squares) / scale
            factor = factor * self.clip_global_norm / tf.maximum(norm, self.clip_global_norm)
        factor = tf.where(finite, factor, 0.0)
        grads = [None if g is None else tf.math.multiply_no_nan(g, tf.cast(factor, g.dtype)) for g in grads]
        inner._keep = tf.cast(finite, tf.float32)
        try:
            inner.apply(grads, variables)
        finally:
            inner._keep = None
        inner.iterations.assign_sub(1 - tf.cast(finite, inner.iterations.dtype))  # apply() counted it
        return finite

    def _fusable(self, grads):
        """Whether `_fused_adamw_apply` computes what `_guarded_apply` would (else the latter runs)."""
        inner = self.inner_optimizer
        return (type(inner).update_step is FusedAdamW.update_step and not inner.amsgrad
                and inner.use_ema is False and inner.gradient_accumulation_steps is None
                and not any(isinstance(g, tf.IndexedSlices) for g in tf.nest.flatten(grads)))

    def _fused_adamw_apply(self, distribution, grads, variables):
        """`_guarded_apply` for FusedAdamW: on each device, one XLA program updates all variables -> finite.

        The per-variable path launches four kernels a variable (about 400 for MiniLM-L6) and passes
        over every gradient four times and every decayed weight twice. Here the sum of squares stays
        TensorFlow's L2Loss (inside the program XLA wrote each squared gradient out before reducing it,
        and the step took 32.3 ms against the per-variable 28.0), and unscale, clip, skip, decay and
        Adam run as one program: 29.5 -> 22.9 ms for MiniLM's 22.7 M parameters (benchmarks/NOTES.md,
        item 24). Each device updates its own copies of the mirrored variables with the same all-reduced
        gradients, as `extended.update` does.
        """
        inner = self.inner_optimizer
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        local = distribution.experimental_local_results
        raw = lambda v: v.value if isinstance(v, keras.Variable) else v  # noqa: E731
        slots = [(inner._momentums[i], inner._velocities[i])
                 for i in (inner._get_variable_index(v) for _, v in pairs)]
        decay = tuple(bool(inner.weight_decay) and inner._use_weight_decay(v) for _, v in pairs)
        lr = tf.cast(inner._get_current_learning_rate(), tf.float32)
        scalars = dict(inv_scale=1.0 / self.dynamic_scale, lr=lr, step=tf.cast(inner.iterations + 1, tf.float32))
        hyper = dict(clipnorm=self.clip_global_norm, weight_decay=float(inner.weight_decay or 0.0),
                     beta_1=float(inner.beta_1), beta_2=float(inner.beta_2), epsilon=float(inner.epsilon))
        # One norm for all devices: taken on each, the same sum came out one bit apart on two logical
        # CPUs (23.6999283 and 23.6999302), and the towers' copies of the weights drifted apart.
        squares = tf.add_n([2.0 * tf.nn.l2_loss(local(g)[0]) for g, _ in pairs])
        finite = []
        for d, weights in enumerate(zip(*(local(raw(v)) for _, v in pairs))):
            with tf.device(weights[0].device):
                finite.append(_adamw_program(
                    list(weights), [local(raw(m))[d] for m, _ in slots], [local(raw(s))[d] for _, s in slots],
                    [local(g)[d] for g, _ in pairs], decay, squares, **scalars, **hyper))
        inner.iterations.assign_add(tf.cast(finite[0], inner.iterations.dtype))
        return finite[0]


@tf.function(jit_compile=True)
def _adamw_program(weights, ms, vs, grads, decay, squares, inv_scale, lr, step, clipnorm, weight_decay,
                   beta_1, beta_2, epsilon):
    """One device's AdamW step over all its variables, as `_guarded_apply` with FusedAdamW takes it.

    `squares`: the gradients' sum of squares. Gradients are multiplied by 1/scale (and the clip
    factor), or every update is multiplied away when `squares` is not finite; decoupled decay
    `w *= 1 - wd * lr` on the `decay` variables; then Adam with bias correction and epsilon outside the
    square root (ResourceApplyAdam's formula). `decay`, `clipnorm` and the hyperparameters are
    trace-time constants; the variables are arguments, so one trace serves every device and model.
    """
    finite = tf.math.is_finite(squares)
    factor = inv_scale
    if clipnorm:
        factor = factor * clipnorm / tf.maximum(tf.sqrt(squares) * inv_scale, clipnorm)
    keep = tf.cast(finite, tf.float32)
    lr = lr * keep
    rate_1, rate_2 = (1.0 - beta_1) * keep, (1.0 - beta_2) * keep
    alpha = lr * tf.sqrt(1.0 - tf.pow(beta_2, step)) / (1.0 - tf.pow(beta_1, step))
    shrink = 1.0 - weight_decay * lr
    for w, m, v, g, d in zip(weights, ms, vs, grads, decay):
        g = tf.where(finite, g * factor, 0.0)
        m_new = m + (g - m) * rate_1
        v_new = v + (tf.square(g) - v) * rate_2
        w.assign((w * shrink if d else w) - alpha * m_new / (tf.sqrt(v_new) + epsilon))
        m.assign(m_new)
        v.assign(v_new)
    return finite


TowerAveragedAdamW = _tower_averaged(FusedAdamW)
TowerAveragedLamb = _tower_averaged(SkippableLamb)
OPTIMIZERS = {"adamw": TowerAveragedAdamW, "lamb": TowerAveragedLamb}


def create_optimizer(learning_rate, num_train_steps=None, num_warmup_steps=0, weight_decay=0.01,
                     float16=False, optimizer="adamw", beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                     schedule=None, clipnorm=1.0, initial_scale=None):
    """google-bert's optimizer (or LAMB), wrapped for loss scaling.

    `schedule` overrides the step-based warmup + linear decay (e.g. a TimeBasedDecay). Every precision
    gets the loss-scale wrapper, because it is also what skips a step whose gradients are not finite:
    under mixed_float16 its scale is dynamic (starting at 2**15, or `initial_scale`); otherwise the scale
    starts at 1 and the wrapper only guards against NaN/Inf.
    """
    if optimizer not in OPTIMIZERS:
        raise UserError(f"--optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    if schedule is None:
        schedule = WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps)
    inner = OPTIMIZERS[optimizer](
        learning_rate=schedule, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
    )
    inner.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    if float16:
        return SkippingLossScaleOptimizer(inner, clipnorm, initial_scale=initial_scale or 2.0**15)
    return SkippingLossScaleOptimizer(inner, clipnorm, initial_scale=initial_scale or 1.0,
                                      dynamic_growth_steps=2**30)
