"""FusedAdamW takes exactly Keras AdamW's steps, alone and on mirrored towers."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu import devices, optimization


def _steps(opt_class, towers=None, steps=3):
    rng = np.random.default_rng(0)
    init = [rng.normal(size=(5, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32")]
    grads = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(steps)]
    strategy = devices.make_strategy(devices.plan_devices(0, towers, 1, ())) if towers else tf.distribute.get_strategy()
    with strategy.scope():
        variables = [keras.Variable(w) for w in init]
        opt = opt_class(learning_rate=0.01, weight_decay=0.1, epsilon=1e-6)
        opt.exclude_from_weight_decay(var_names=["bias"])
        opt.build(variables)

    @tf.function
    def apply(g):
        strategy.run(lambda: opt.apply(list(g), variables))

    for g in grads:
        apply([tf.constant(x) for x in g])
    copies = [strategy.experimental_local_results(v.value) for v in variables]
    for c in copies:
        for other in c[1:]:
            np.testing.assert_array_equal(other.numpy(), c[0].numpy())
    return [v.numpy() for v in variables]


@pytest.mark.parametrize("opt_class,towers", [(optimization.FusedAdamW, None),
                                              (optimization.TowerAveragedAdamW, 2)])
def test_fused_adamw_equals_keras_adamw(opt_class, towers):
    """On towers, every tower's copy must take the update (each is fed the same, already averaged grads)."""
    ref = _steps(keras.optimizers.AdamW)
    got = _steps(opt_class, towers)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # float32 rounding of a reordered formula
    assert not np.allclose(ref[0], _steps(keras.optimizers.AdamW, steps=0)[0])  # the steps moved them
