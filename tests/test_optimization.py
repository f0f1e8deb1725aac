"""TowerOptimizer takes Keras' AdamW and Lamb steps, alone and on mirrored towers, as one XLA program per
device; a non-finite step leaves every weight and slot bit-identical, with no tf.cond in the graph."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import optimization
from bert_mgpu.train.schedules import WarmupLinearDecay


def _steps(opt_class, towers=None, steps=3, poison=(), drop=(), graphs=None):
    """Weights after `steps` updates with random gradients; steps in `poison` get a NaN and an Inf, steps
    in `drop` are left out.
    `opt_class` is an optimizer class, or a function of a learning rate making a wrapped one."""
    rng = np.random.default_rng(0)
    init = [rng.normal(size=(5, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32")]
    grads = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(steps)]
    for i in poison:
        grads[i][0][1, 2], grads[i][1][0] = np.nan, np.inf
    grads = [g for i, g in enumerate(grads) if i not in drop]
    plan = devices.plan_devices(0, towers, ()) if towers else None
    strategy = distribute.make_strategy(plan) if towers else tf.distribute.get_strategy()
    with strategy.scope():
        variables = [keras.Variable(w) for w in init]
        if isinstance(opt_class, type):
            opt = opt_class(learning_rate=0.01, weight_decay=0.1, epsilon=1e-6)
            opt.exclude_from_weight_decay(var_names=["bias"])
        else:
            opt = opt_class(0.01)
        opt.build(variables)

    scale = getattr(opt, "dynamic_scale", 1.0)  # what the loss (so the gradients) would be multiplied by

    @tf.function
    def apply(g):
        strategy.run(lambda: opt.apply([x * scale for x in g], variables))

    for g in grads:
        apply([tf.constant(x) for x in g])
    if graphs is not None:
        graphs.append(apply.get_concrete_function([tf.constant(x) for x in grads[0]]).graph)
    copies = [strategy.experimental_local_results(v.value) for v in variables]
    for c in copies:
        for other in c[1:]:
            np.testing.assert_array_equal(other.numpy(), c[0].numpy())
    return [v.numpy() for v in variables], opt


def _keras(name):
    """Keras' own optimizer with create_optimizer's schedule and hyperparameters, applied directly."""
    def make(lr):
        cls = {"adamw": keras.optimizers.AdamW, "lamb": keras.optimizers.Lamb}[name]
        opt = cls(WarmupLinearDecay(lr, 10, 2), weight_decay=0.01, epsilon=1e-6)
        opt.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
        return opt
    return make


@pytest.mark.parametrize("name,towers", [("adamw", None), ("adamw", 2), ("lamb", None), ("lamb", 2)])
def test_tower_optimizer_takes_keras_steps(name, towers):
    """On towers, every tower's copy must take the update (each is fed the same, already averaged grads)."""
    ref, _ = _steps(_keras(name))
    got, _ = _steps(lambda lr: optimization.create_optimizer(lr, 10, 2, optimizer=name, clipnorm=None), towers)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # float32 rounding of a reordered formula
    assert not np.allclose(ref[0], _steps(_keras(name), steps=0)[0][0])  # the steps moved them


def _wrapped(name, float16=True):
    return lambda lr: optimization.create_optimizer(lr, 10, 2, optimizer=name, float16=float16)


def _keras_reference(clipnorm):
    """Keras' own loss scaling around Keras' AdamW clipping the global norm: what create_optimizer fuses."""
    def make(lr):
        inner = keras.optimizers.AdamW(WarmupLinearDecay(lr, 10, 2), weight_decay=0.01,
                                       epsilon=1e-6, global_clipnorm=clipnorm)
        inner.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
        return keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**15)
    return make


@pytest.mark.parametrize("clipnorm,towers", [(1.0, None), (1.0, 2), (None, None)])
def test_unscale_and_clip_in_one_multiply_equal_keras(clipnorm, towers):
    """The gradients' global norm is about 4 (18 normal draws) and the loss scale 2**15: clipping acts."""
    make = lambda lr: optimization.create_optimizer(lr, 10, 2, float16=True, clipnorm=clipnorm)  # noqa: E731
    got, opt = _steps(make, towers)
    assert float(opt.dynamic_scale.numpy()) == 2.0**15
    ref, _ = _steps(_keras_reference(clipnorm))
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    other, _ = _steps(_keras_reference(None if clipnorm else 1.0))
    assert not np.allclose(got[0], other[0], rtol=1e-3)  # clipping or not changes the result


def test_clipping_in_the_inner_optimizer_is_refused():
    inner = keras.optimizers.AdamW(learning_rate=0.1, global_clipnorm=1.0)
    with pytest.raises(ValueError, match="not in the inner optimizer"):
        optimization.TowerOptimizer(inner, 1.0)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_a_non_finite_step_changes_nothing_and_halves_the_scale(name):
    """Steps 1, NaN, 2 == steps 1, 2, bit for bit: weights, Adam/LAMB slots, schedule; and no tf.cond."""
    graphs = []
    clean, clean_opt = _steps(_wrapped(name), towers=2, steps=3, drop=[1])
    skipped, opt = _steps(_wrapped(name), towers=2, steps=3, poison=[1], graphs=graphs)
    for a, b in zip(clean, skipped):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(clean_opt.inner_optimizer.variables, opt.inner_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # iterations, m, v
    assert int(opt.iterations.numpy()) == 2 and float(opt.dynamic_scale.numpy()) == 2.0**14
    ops = {op.type for op in graphs[0].get_operations()}
    assert "AssignVariableOp" in ops and not ops & {"If", "StatelessIf", "While", "StatelessWhile"}, ops


def test_the_scale_doubles_after_growth_steps_finite_steps_in_a_row():
    grown, opt = _steps(lambda lr: optimization.TowerOptimizer(
        keras.optimizers.AdamW(lr), initial_scale=8.0, dynamic_growth_steps=2), towers=2, steps=5, poison=[2])
    # steps 0, 1 finite: 8 -> 16; step 2 skipped: 8; steps 3, 4 finite: 16
    assert float(opt.dynamic_scale.numpy()) == 16.0 and int(opt.step_counter.numpy()) == 0
    assert int(opt.iterations.numpy()) == 4


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_each_step_is_one_xla_program_per_tower_traced_once(name):
    """create_optimizer's step: one XLA-compiled call on each tower's device, no per-variable kernel; its
    trace takes the variables' handles as arguments, so other variables reuse it, and it keeps none alive
    (test_memory.py: a model and its optimizer leave no memory behind)."""
    graphs = []
    program = {"adamw": optimization._adamw_program, "lamb": optimization._lamb_program}[name]
    _steps(_wrapped(name), towers=2, steps=1, graphs=graphs)
    ops = graphs[0].get_operations()
    calls = [op for op in ops if op.type == "StatefulPartitionedCall" and op.node_def.attr["_XlaMustCompile"].b]
    assert sorted(op.device.rsplit("/", 1)[-1] for op in calls) == ["device:CPU:0", "device:CPU:1"]
    assert not {"ResourceApplyAdam", "AssignSubVariableOp"} & {op.type for op in ops}
    traces = program.experimental_get_tracing_count()
    _steps(_wrapped(name), towers=2, steps=2)  # new variables, optimizer and step function
    assert program.experimental_get_tracing_count() == traces


def test_a_schedule_and_a_learning_rate_together_are_refused():
    """The schedule carries its own learning rate: one given beside it used to be ignored without a word."""
    schedule = optimization.WarmupLinearDecay(1e-3, 10, 0)
    with pytest.raises(ValueError, match="give learning_rate or schedule, not both"):
        optimization.create_optimizer(5e-5, schedule=schedule)
    with pytest.raises(ValueError, match="give learning_rate"):
        optimization.create_optimizer()
    assert float(optimization.create_optimizer(schedule=schedule).inner_optimizer.learning_rate) == pytest.approx(1e-3)


def test_warmup_steps_travel_as_steps():
    """--num_warmup_steps=13 --num_train_steps=23: a proportion 13/23 turned back into steps gives 12."""
    from bert_mgpu.train.budget import Budget

    assert int(23 * (13 / 23)) == 12  # the round trip the script used to make
    budget = Budget(num_train_steps=23, warmup_proportion=13 / 23, num_warmup_steps=13)
    assert budget.warmup_steps() == 13
    schedule = optimization.WarmupLinearDecay(1.0, 23, budget.warmup_steps())
    assert float(schedule(12)) == pytest.approx(12 / 13) and float(schedule(13)) == pytest.approx(1 - 13 / 23)
    assert Budget(num_train_steps=200, warmup_proportion=0.1).warmup_steps() == 20  # google-bert's int(n * p)
