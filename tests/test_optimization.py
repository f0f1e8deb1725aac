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
    traces = program.traces[True].experimental_get_tracing_count()  # core/xla.py: the XLA-compiled form
    _steps(_wrapped(name), towers=2, steps=2)  # new variables, optimizer and step function
    assert program.traces[True].experimental_get_tracing_count() == traces


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


def test_layerwise_rates_decay_from_the_head_down_to_the_embeddings():
    """--layerwise_lr_decay=0.5 on 2 layers: the head and pooler at the learning rate, the top layer at half
    of it, the layer below at a quarter, the embeddings (and their LayerNorm) at an eighth."""
    from conftest import tiny_config

    from bert_mgpu.core.errors import UserError
    from bert_mgpu.model import modeling

    paths = [v.path for v in modeling.build_classifier(tiny_config(38), 2).trainable_variables]
    rates = dict(zip(paths, optimization.layerwise_rates(paths, 0.5)))
    assert rates["classifier/kernel"] == rates["pooled_dense/bias"] == 1.0
    assert rates["transformer_layer_1/self_attention_layer/query/kernel"] == 0.5
    assert rates["transformer_layer_0/feedforward_output_dense/bias"] == 0.25
    assert rates["token_embedding/embeddings"] == rates["embeddings_layer_norm/gamma"] == 0.125
    assert sorted(set(rates.values())) == [0.125, 0.25, 0.5, 1.0]
    assert sum(r == 0.125 for r in rates.values()) == 5 and sum(r == 1.0 for r in rates.values()) == 4
    assert optimization.layerwise_rates(paths, 1.0) == (1.0,) * len(paths)
    for bad in (1.5, 0.0):
        with pytest.raises(UserError, match=f"--layerwise_lr_decay={bad}: must be above 0 and at most 1"):
            optimization.create_optimizer(1e-3, 10, 0, layerwise_lr_decay=bad)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_layerwise_decay_steps_as_keras_optimizers_one_per_rate_on_the_gpu_path(name):
    """Each variable steps as Keras' own optimizer would with the learning rate times its rate (its weight
    decay too, as a torch parameter group's): one Keras optimizer per rate as the reference. On the strategy
    a 2-GPU run builds (NCCL collectives), on two CPU towers, which stay bit-equal."""
    from conftest import tiny_config
    from test_allreduce import gpu_strategy

    from bert_mgpu.model import modeling

    _, strategy = gpu_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38), 2)
        opt = optimization.create_optimizer(1e-2, 10, 2, optimizer=name, clipnorm=None, layerwise_lr_decay=0.5)
        opt.build(model.trainable_variables)
    variables = model.trainable_variables
    init = [v.numpy() for v in variables]
    rng = np.random.default_rng(0)
    grads = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(3)]

    @tf.function
    def apply(g):
        strategy.run(lambda g: opt.apply([tf.identity(x) for x in g], variables), args=(g,))

    for g in grads:
        apply([tf.constant(x) for x in g])
    rates = optimization.layerwise_rates([v.path for v in variables], 0.5)
    reference = [keras.Variable(w, name=v.name) for w, v in zip(init, variables)]
    for rate in sorted(set(rates)):
        group = [i for i, r in enumerate(rates) if r == rate]
        keras_opt = _keras(name)(1e-2 * rate)
        keras_opt.build([reference[i] for i in group])
        for g in grads:
            keras_opt.apply([tf.constant(g[i]) for i in group], [reference[i] for i in group])
    for v, ref, start in zip(variables, reference, init):
        a, b = strategy.experimental_local_results(v.value)
        assert np.array_equal(a.numpy(), b.numpy()), v.path
        np.testing.assert_allclose(a.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6, err_msg=v.path)
        assert not np.allclose(a.numpy(), start), v.path  # every variable moved, at its own rate
    # The embeddings moved an eighth as far as the rate alone would take them (AdamW's steps scale with it).
    i = next(i for i, v in enumerate(variables) if v.path == "token_embedding/embeddings")
    undecayed = keras.Variable(init[i], name="embeddings")
    keras_opt = _keras(name)(1e-2)
    for g in grads:
        keras_opt.apply([tf.constant(g[i])], [undecayed])
    moved, full = np.abs(variables[i].numpy() - init[i]).mean(), np.abs(undecayed.numpy() - init[i]).mean()
    assert rates[i] == 0.125 and (0.1 < moved / full < 0.15 if name == "adamw" else moved < full), (moved, full)


def test_moving_averages_step_as_keras_use_ema_on_the_gpu_path():
    """--ema_decay: the averages TowerOptimizer keeps are Keras' (AdamW(use_ema=True) applied directly), a
    variable without a gradient included and a non-finite step left out, on the strategy a 2-GPU run builds,
    each tower's copy bit-equal; evaluation swaps them in and puts the weights back to the bit."""
    from conftest import tiny_config
    from test_allreduce import gpu_strategy

    from bert_mgpu.model import modeling

    _, strategy = gpu_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38), 2)
        opt = optimization.create_optimizer(1e-2, 10, 2, clipnorm=None, ema_decay=0.9)
        opt.build(model.trainable_variables)
    variables = model.trainable_variables
    frozen = 1  # no gradient reaches it (as a tagger's pooler)
    init = [v.numpy() for v in variables]
    rng = np.random.default_rng(0)
    grads = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(4)]
    grads[2][0][0, 0] = np.nan  # skipped: no weight, moment or average moves

    @tf.function
    def apply(g):
        strategy.run(lambda g: opt.apply([None if i == frozen else x * opt.dynamic_scale  # as a loss is scaled
                                          for i, x in enumerate(g)], variables), args=(g,))

    for g in grads:
        apply([tf.constant(x) for x in g])
    reference = [keras.Variable(w, name=v.name) for w, v in zip(init, variables)]
    keras_opt = keras.optimizers.AdamW(WarmupLinearDecay(1e-2, 10, 2), weight_decay=0.01, epsilon=1e-6,
                                       use_ema=True, ema_momentum=0.9)
    keras_opt.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    keras_opt.build(reference)
    for g in grads[:2] + grads[3:]:
        keras_opt.apply([None if i == frozen else tf.constant(x) for i, x in enumerate(g)], reference)
    averages = opt.inner_optimizer._model_variables_moving_average
    assert int(opt.inner_optimizer.iterations.numpy()) == 3
    for v, a, ref_w, ref_a in zip(variables, averages, reference, keras_opt._model_variables_moving_average):
        copies = [c.numpy() for c in strategy.experimental_local_results(a.value)]
        assert np.array_equal(copies[0], copies[1]), v.path
        np.testing.assert_allclose(v.numpy(), ref_w.numpy(), rtol=1e-5, atol=1e-6, err_msg=v.path)
        np.testing.assert_allclose(copies[0], ref_a.numpy(), rtol=1e-5, atol=1e-6, err_msg=v.path)
    np.testing.assert_array_equal(averages[frozen].numpy(), init[frozen])  # its average is itself, never 0
    moved = next(i for i in range(len(variables)) if i != frozen)
    assert not np.allclose(averages[moved].numpy(), variables[moved].numpy())  # an average lags the weights
    live = [v.numpy() for v in variables]
    with opt.averaged_weights():
        for v, a in zip(variables, averages):
            for copy in strategy.experimental_local_results(v.value):
                np.testing.assert_array_equal(copy.numpy(), a.numpy(), err_msg=v.path)
    for v, w in zip(variables, live):
        for copy in strategy.experimental_local_results(v.value):
            np.testing.assert_array_equal(copy.numpy(), w, err_msg=v.path)
    opt.finalize_averages()
    for v, a in zip(variables, averages):
        np.testing.assert_array_equal(v.numpy(), a.numpy(), err_msg=v.path)


def test_an_ema_decay_outside_0_to_1_is_refused():
    from bert_mgpu.core.errors import UserError

    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(UserError, match=rf"--ema_decay={bad}: must be 0 \(no average\) or more, and below 1"):
            optimization.create_optimizer(1e-3, 10, 0, ema_decay=bad)
