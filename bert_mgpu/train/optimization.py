"""Optimizers: google-research/bert's AdamW, and LAMB, as one straight-line program per device.

`create_optimizer` returns a `TowerOptimizer`: Keras' dynamic loss scaling around a plain Keras AdamW or
Lamb. The Keras optimizer holds the state (iterations, moments, learning rate, hyperparameters) and
checkpoints it; its `apply` is never called. `TowerOptimizer.apply` instead takes gradients already
averaged over towers (the training step all-reduces them; Keras' own `apply` would sum them again and
clip each tower's part rather than the global gradient), and on each device runs one XLA program that
unscales, clips the global norm, decays and updates every variable. A step whose gradients are not all
finite changes no weight, no moment and not the schedule: its updates are multiplied by 0, not skipped
by `tf.cond`, whose traced branches TensorFlow keeps for the life of the process
(tensorflow/tensorflow#62854).

The formulas are Keras': AdamW with bias correction and epsilon outside the square root, decoupled
weight decay `w -= w * wd * lr` before the update, none on LayerNorm and biases (google-bert's
AdamWeightDecayOptimizer omits the bias correction; it changes only the first steps); LAMB with the
per-layer trust ratio ||w|| / ||update||.

An exponential moving average of the weights (`ema_decay`) is Keras' own (`use_ema`): its averages are the
inner optimizer's variables, so every checkpoint holds them and a resumed run goes on with them; a third
program per device updates them after each applied step, with Keras' formula.
"""

import contextlib
import re

import keras
import tensorflow as tf

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.core.xla import compiled
from bert_mgpu.train.schedules import WarmupLinearDecay
from bert_mgpu.train.train_config import check_ema_decay, check_layerwise_lr_decay

OPTIMIZERS = {"adamw": keras.optimizers.AdamW, "lamb": keras.optimizers.Lamb}


class TowerOptimizer(keras.optimizers.LossScaleOptimizer):
    """Dynamic loss scaling and global-norm clipping around a Keras AdamW or Lamb, for gradients already
    averaged over towers.

    What `training.Trainer` uses: `scale_loss`, `apply(grads, variables)` called once per replica with
    the same averaged gradients, `inner_optimizer.iterations` (applied steps), `learning_rate`,
    `dynamic_scale`. Same rule as Keras' LossScaleOptimizer: a non-finite step halves the scale and
    changes nothing else; `dynamic_growth_steps` finite steps in a row double it.

    Args:
        inner_optimizer: a `keras.optimizers.AdamW` or `keras.optimizers.Lamb` without clipping.
        clipnorm: clip the global norm of the unscaled gradients to this (None: no clipping).
        layerwise_lr_decay: each encoder layer's learning rate is the one above it times this
            (`layerwise_rates`); 1: one rate for all.
        **kwargs: `initial_scale`, `dynamic_growth_steps` (Keras' LossScaleOptimizer).

    Example:
        opt = TowerOptimizer(keras.optimizers.AdamW(WarmupLinearDecay(5e-5, 1000, 100)), clipnorm=1.0)
    """

    def __init__(self, inner_optimizer, clipnorm=None, layerwise_lr_decay=1.0, **kwargs):
        if type(inner_optimizer) not in OPTIMIZERS.values():
            raise ValueError(f"TowerOptimizer runs keras.optimizers.AdamW or Lamb, not {type(inner_optimizer)}")
        if inner_optimizer.global_clipnorm or inner_optimizer.clipnorm or inner_optimizer.clipvalue:
            raise ValueError("clip in TowerOptimizer(clipnorm=...), not in the inner optimizer")
        if inner_optimizer.ema_overwrite_frequency or inner_optimizer.gradient_accumulation_steps or getattr(
                inner_optimizer, "amsgrad", False):
            raise ValueError("TowerOptimizer does not run ema_overwrite_frequency, gradient accumulation or AMSGrad")
        super().__init__(inner_optimizer, **kwargs)
        self.clip_global_norm = clipnorm
        self.layerwise_lr_decay = check_layerwise_lr_decay(layerwise_lr_decay)

    def apply(self, grads, trainable_variables=None):
        """Apply the towers' averaged (loss-scaled) gradients, from inside a replica."""
        if trainable_variables is None:
            raise ValueError("TowerOptimizer.apply needs the variables the gradients belong to")
        variables = list(trainable_variables)
        if not self.built:
            self.build(variables)
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        tf.distribute.get_replica_context().merge_call(self._apply_on_every_device, args=(grads, variables))

    def apply_on_first_device(self, grads, variables):
        """`apply` with the program run on the first device only (its copies of the variables), from inside a
        replica: an auto-batch trial on a GPU measures the update's memory on one tower alone."""
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        tf.distribute.get_replica_context().merge_call(self._apply_on_every_device, args=(grads, list(variables)),
                                                       kwargs={"devices": 1})

    def _apply_on_every_device(self, distribution, grads, variables, devices=None):
        inner = self.inner_optimizer
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        local = distribution.experimental_local_results
        raw = lambda v: v.value if isinstance(v, keras.Variable) else v  # noqa: E731
        slots = [_compat.optimizer_moments(inner, v) for _, v in pairs]
        decay = tuple(bool(inner.weight_decay) and _compat.uses_weight_decay(inner, v) for _, v in pairs)
        rates = layerwise_rates([getattr(v, "path", v.name) for _, v in pairs], self.layerwise_lr_decay)
        scalars = dict(inv_scale=1.0 / self.dynamic_scale, lr=tf.cast(_compat.current_learning_rate(inner), tf.float32),
                       step=tf.cast(inner.iterations + 1, tf.float32))
        hyper = dict(clipnorm=self.clip_global_norm, weight_decay=float(inner.weight_decay or 0.0),
                     beta_1=float(inner.beta_1), beta_2=float(inner.beta_2), epsilon=float(inner.epsilon))
        program = _adamw_program if isinstance(inner, keras.optimizers.AdamW) else _lamb_program
        # One norm for all devices: taken on each, the same sum came out one bit apart on two logical
        # CPUs, and the towers' copies of the weights drifted apart.
        squares = tf.add_n([2.0 * tf.nn.l2_loss(tf.cast(local(g)[0], tf.float32)) for g, _ in pairs])
        finite = []
        for d, weights in enumerate(list(zip(*(local(raw(v)) for _, v in pairs)))[:devices]):
            with tf.device(weights[0].device):
                finite.append(program(
                    _handles(weights), _handles(local(raw(m))[d] for m, _ in slots),
                    _handles(local(raw(s))[d] for _, s in slots), [local(g)[d] for g, _ in pairs], decay, rates,
                    squares, **scalars, **hyper))
        finite = finite[0]
        if inner.use_ema:  # Keras' first-step rule: the first applied step's weights are the average
            momentum = tf.where(finite, tf.where(inner.iterations > 0, float(inner.ema_momentum), 0.0), 1.0)
            weights = [local(raw(v)) for v in inner._trainable_variables]  # all: one without a gradient too
            averages = [local(raw(a)) for a in inner._model_variables_moving_average]
            for d in range(len(weights[0]))[:devices]:
                with tf.device(weights[0][d].device):
                    _ema_program(_handles(w[d] for w in weights), _handles(a[d] for a in averages), momentum)
        inner.iterations.assign_add(tf.cast(finite, inner.iterations.dtype))
        count = tf.where(finite, self.step_counter + 1, 0)
        grow = tf.logical_and(finite, count >= self.dynamic_growth_steps)
        self.dynamic_scale.assign(self.dynamic_scale * tf.where(grow, 2.0, tf.where(finite, 1.0, 0.5)))
        self.step_counter.assign(tf.where(grow, tf.zeros_like(count), count))


    @contextlib.contextmanager
    def averaged_weights(self):
        """Inside the block the weights are their moving averages (evaluation, `best/`); after it, what they
        were. Nothing happens without an EMA, or before the first step. Holds one more copy of the weights."""
        inner = self.inner_optimizer
        if not (inner.use_ema and inner.built):
            yield
            return
        live = [tf.identity(v.value) for v in inner._trainable_variables]
        inner.finalize_variable_values(inner._trainable_variables)
        try:
            yield
        finally:
            for v, value in zip(inner._trainable_variables, live):
                v.assign(value)

    def finalize_averages(self):
        """The weights become their moving averages for good, as Keras' `fit` leaves a model with `use_ema`
        (the end of a run: its last checkpoint, what it evaluates, predicts and exports)."""
        inner = self.inner_optimizer
        if inner.use_ema and inner.built:
            inner.finalize_variable_values(inner._trainable_variables)


@compiled
def _ema_program(weights, averages, momentum):
    """One device's moving averages after its step: average <- m x average + (1 - m) x weight, Keras'
    formula (m: the decay; 0 on the first applied step; 1 on a skipped one, which changes nothing)."""
    for hw, ha in zip(weights, averages):
        _write(ha, momentum * _read(ha) + (1.0 - momentum) * _read(hw))


def _handles(variables):
    """The programs take variables' resource handles, not the variables: a trace keeps what it was traced
    with, and handles are traced as placeholders, variables as themselves (their memory then lived as long
    as the program, the life of the process)."""
    return [v.handle for v in variables]


def _read(handle):
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)


def _write(handle, value):
    tf.raw_ops.AssignVariableOp(resource=handle, value=value)


def _unscale_factor(squares, inv_scale, clipnorm):
    """What multiplies the gradients: 1/scale, times the clip factor of their global norm."""
    factor = inv_scale
    if clipnorm:
        factor = factor * clipnorm / tf.maximum(tf.sqrt(squares) * inv_scale, clipnorm)
    return factor


@compiled
def _adamw_program(weights, ms, vs, grads, decay, rates, squares, inv_scale, lr, step, clipnorm, weight_decay,
                   beta_1, beta_2, epsilon):
    """One device's AdamW step over all its variables -> whether the gradients were finite.

    `squares`: the gradients' sum of squares (not finite: every update is multiplied by 0). `decay`, `rates`
    (each variable's learning-rate multiplier, its weight decay's too), `clipnorm` and the hyperparameters are
    trace-time constants; the variables' handles are arguments,
    so one trace serves every device and model.
    """
    finite = tf.math.is_finite(squares)
    factor = _unscale_factor(squares, inv_scale, clipnorm)
    keep = tf.cast(finite, tf.float32)
    lr = lr * keep
    rate_1, rate_2 = (1.0 - beta_1) * keep, (1.0 - beta_2) * keep
    alpha = lr * tf.sqrt(1.0 - tf.pow(beta_2, step)) / (1.0 - tf.pow(beta_1, step))
    for hw, hm, hv, g, d, r in zip(weights, ms, vs, grads, decay, rates):
        w, m, v = _read(hw), _read(hm), _read(hv)
        g = tf.where(finite, tf.cast(g, tf.float32) * factor, 0.0)
        m_new = m + (g - m) * rate_1
        v_new = v + (tf.square(g) - v) * rate_2
        shrink = 1.0 - weight_decay * lr * r  # r = 1.0: the same bits as without it
        _write(hw, (w * shrink if d else w) - alpha * r * m_new / (tf.sqrt(v_new) + epsilon))
        _write(hm, m_new)
        _write(hv, v_new)
    return finite


@compiled
def _lamb_program(weights, ms, vs, grads, decay, rates, squares, inv_scale, lr, step, clipnorm, weight_decay,
                  beta_1, beta_2, epsilon):
    """One device's LAMB step over all its variables (Keras' Lamb, after its decoupled decay) -> finite."""
    finite = tf.math.is_finite(squares)
    factor = _unscale_factor(squares, inv_scale, clipnorm)
    keep = tf.cast(finite, tf.float32)
    lr = lr * keep
    rate_1, rate_2 = (1.0 - beta_1) * keep, (1.0 - beta_2) * keep
    correct_1, correct_2 = 1.0 - tf.pow(beta_1, step), 1.0 - tf.pow(beta_2, step)
    for hw, hm, hv, g, d, r in zip(weights, ms, vs, grads, decay, rates):
        w, m, v = _read(hw), _read(hm), _read(hv)
        g = tf.where(finite, tf.cast(g, tf.float32) * factor, 0.0)
        lr_here = lr * r  # r = 1.0: the same bits as without it
        w_decayed = w - w * weight_decay * lr_here if d else w
        m_new = m + (g - m) * rate_1
        v_new = v + (tf.square(g) - v) * rate_2
        update = (m_new / correct_1) / (tf.sqrt(v_new / correct_2) + epsilon)
        w_norm, u_norm = tf.norm(w_decayed), tf.norm(update)
        ratio = tf.where(w_norm > 0, tf.where(u_norm > 0, w_norm / u_norm, 1.0), 1.0)
        _write(hw, w_decayed - ratio * lr_here * update)
        _write(hm, m_new)
        _write(hv, v_new)
    return finite


def layerwise_rates(paths, decay):
    """Each variable's learning-rate multiplier under layer-wise decay (Sun et al. 2019, "How to Fine-Tune BERT
    for Text Classification?"): encoder layer i of L gets decay ** (L - i), the embeddings decay ** (L + 1),
    the rest (pooler, heads, a CRF's transitions) 1. `paths`: Keras variable paths (`transformer_layer_3/...`,
    `token_embedding/embeddings`), as keras-hub's BertBackbone and the fused encoder name them."""
    layers = [re.match(r"(?:.*/)?transformer_layer_(\d+)/", p) for p in paths]
    depth = max((int(m.group(1)) for m in layers if m), default=-1) + 1
    if decay == 1.0 or depth == 0:
        return tuple(1.0 for _ in paths)
    embedding = re.compile(r"(?:.*/)?(token_embedding|position_embedding|segment_embedding|embeddings_layer_norm|"
                           r"embeddings_projection)/")
    return tuple(float(decay ** (depth - int(m.group(1)))) if m else
                 float(decay ** (depth + 1)) if embedding.match(p) else 1.0 for p, m in zip(paths, layers))


def create_optimizer(learning_rate: float | None = None, num_train_steps: int | None = None, num_warmup_steps: int = 0,
                     weight_decay: float = 0.01, float16: bool = False, optimizer: str = "adamw", beta_1: float = 0.9,
                     beta_2: float = 0.999, epsilon: float = 1e-6, schedule=None, clipnorm: float | None = 1.0,
                     initial_scale: float | None = None, layerwise_lr_decay: float = 1.0,
                     decay_from_warmup: bool = False, ema_decay: float = 0.0) -> TowerOptimizer:
    """google-bert's optimizer (or LAMB) as a `TowerOptimizer`.

    `schedule` replaces the step-based warmup + linear decay (e.g. a TimeBasedDecay) and carries its own
    learning rate: give `learning_rate` and the steps, or `schedule`, not both. Every precision
    gets loss scaling, because it is also what skips a step whose gradients are not finite: under
    mixed_float16 the scale is dynamic (starting at 2**15, or `initial_scale`); otherwise it stays 1.
    `layerwise_lr_decay`: lower layers learn slower (`layerwise_rates`). `decay_from_warmup`: the linear
    decay starts from the peak at warmup's end (transformers'), not on google-bert's line from step 0
    (`WarmupLinearDecay`). `ema_decay`: keep an exponential moving average of the weights (0: none;
    `TowerOptimizer.averaged_weights`).

    Example:
        with strategy.scope():
            opt = create_optimizer(5e-5, num_train_steps=1000, num_warmup_steps=100)
    """
    if optimizer not in OPTIMIZERS:
        raise UserError(f"--optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    if schedule is not None and learning_rate is not None:
        raise ValueError("create_optimizer: give learning_rate or schedule, not both (a schedule carries its own "
                         "learning rate)")
    if schedule is None:
        if learning_rate is None:
            raise ValueError("create_optimizer: give learning_rate (or a schedule)")
        schedule = WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps, from_warmup=decay_from_warmup)
    ema = {"use_ema": True, "ema_momentum": check_ema_decay(ema_decay)} if ema_decay else {}
    inner = OPTIMIZERS[optimizer](learning_rate=schedule, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
                                  epsilon=epsilon, **ema)
    inner.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    if float16:
        return TowerOptimizer(inner, clipnorm, layerwise_lr_decay, initial_scale=initial_scale or 2.0**15)
    return TowerOptimizer(inner, clipnorm, layerwise_lr_decay, initial_scale=initial_scale or 1.0,
                          dynamic_growth_steps=2**30)
