"""Adversarial training, FGM and PGD (issue 70 item 2): the last pass's loss against a reference that moves the
embedding matrix's rows instead; the first and last passes' losses summed; on the GPU run's strategy 2 towers =
1 tower with no collective added; the config checks its numbers and a resume compares them."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_config
from test_allreduce import collectives, gpu_strategy

from bert_mgpu.core.errors import UserError
from bert_mgpu.model import modeling
from bert_mgpu.model.adversarial import fgm_perturbation, project, with_adversarial, with_fgm
from bert_mgpu.model.objectives import Classification
from bert_mgpu.model.tagging_objectives import TokenClassification
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import optimization, training
from bert_mgpu.train.train_config import TrainConfig

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

CONFIG = tiny_config(60, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def distinct_ids_batch(n=6, length=10, seed=0):
    """Rows whose tokens are all different: each row's embedding rows are then its own rows of the matrix."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(np.arange(5, 60))[:length] for _ in range(n)]).astype(np.int32)
    ids[:, 0] = 2
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}, \
        rng.integers(0, 3, n).astype(np.int32)


def test_the_perturbation_is_epsilon_along_each_examples_gradient():
    g = np.random.default_rng(1).normal(size=(3, 4, 5)).astype(np.float32)
    g[2] = 0
    r = fgm_perturbation(g, 0.5).numpy()
    np.testing.assert_allclose(np.sqrt((r[:2] ** 2).sum(axis=(1, 2))), 0.5, rtol=1e-6)
    np.testing.assert_allclose(r[0] / np.linalg.norm(r[0]), g[0] / np.linalg.norm(g[0]), rtol=1e-5)
    assert not r[2].any()  # no gradient: no step, not NaN


def test_a_move_outside_the_ball_is_scaled_back_onto_it():
    r = np.random.default_rng(2).normal(size=(3, 4, 5)).astype(np.float32)
    r[1] *= 0.01
    r[2] = 0
    got = project(r, 1.0).numpy()
    assert np.linalg.norm(got[0]) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_array_equal(got[1:], r[1:])  # inside (or 0): as it was


@pytest.mark.parametrize("steps, alpha", [(1, None), (3, 0.3)])
def test_the_last_pass_is_the_loss_with_each_examples_embedding_rows_moved(steps, alpha):
    """Reference: for each example alone, its loss's gradient on the word-embedding matrix (its tokens are
    distinct, so the rows are its own), a step along it added to the matrix (FGM: one of epsilon; PGD: 3 of
    alpha, each from the gradient at the moved matrix, kept within epsilon), its loss again; their mean is the
    adversarial loss, and the total is the clean loss plus it."""
    keras.utils.set_random_seed(3)
    model = modeling.build_classifier(CONFIG, 3, "float32")
    objective = Classification()
    features, labels = distinct_ids_batch()
    table = model.backbone.token_embedding.embeddings
    original = table.numpy()
    epsilon, size = 0.7, alpha or 0.7
    losses = []
    for i in range(len(labels)):
        one = {k: v[i:i + 1] for k, v in features.items()}
        r = np.zeros_like(original)
        for _ in range(steps):
            table.assign(original + r)
            with tf.GradientTape() as tape:
                value, _ = objective.loss(model, one, labels[i:i + 1])
            grad = tf.convert_to_tensor(tape.gradient(value, table)).numpy()
            r = r + size * grad / np.linalg.norm(grad)
            r = r * min(1.0, epsilon / np.linalg.norm(r))
        table.assign(original + r)
        losses.append(float(objective.loss(model, one, labels[i:i + 1])[0]))
        table.assign(original)
    total, stats = with_adversarial(objective.loss, epsilon, steps, alpha)(model, features, labels, training=True)
    clean, _ = objective.loss(model, features, labels)
    assert float(stats["adversarial_loss"]) == pytest.approx(np.mean(losses), rel=1e-5)
    assert float(total) == pytest.approx(float(clean) + np.mean(losses), rel=1e-5)
    assert np.mean(losses) > float(clean) + 1e-3  # uphill: the move raises the loss
    plain, _ = with_adversarial(objective.loss, epsilon, steps, alpha)(model, features, labels, training=False)
    assert float(plain) == float(clean)  # evaluation: one pass


def adversarial_weights(strategy, pgd_steps, steps=3):
    """A tagger's weights after `steps` steps of FGM (pgd_steps 1) or PGD (float32, no dropout) on 8 rows, some
    padded."""
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = modeling.build_tagger(CONFIG, 4, "float32")
        opt = optimization.create_optimizer(1e-2, 10, 0)
    objective = TokenClassification()
    trainer = training.Trainer(strategy, model, opt, loss_fn=with_adversarial(objective.loss, 1.0, pgd_steps, 0.4),
                               bytes_per_pack=2**14)
    features, _ = distinct_ids_batch(8, 12, seed=4)
    features["padding_mask"][[1, 6], 8:] = False
    features["token_ids"][~features["padding_mask"]] = 0
    labels = np.where(features["padding_mask"], np.arange(8 * 12).reshape(8, 12) % 4, -1).astype(np.int32)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(steps))
    losses = [trainer.train_step(next(batches))[0] for _ in range(steps)]
    return losses, [v.numpy() for v in model.trainable_variables], trainer


@pytest.mark.parametrize("pgd_steps", [1, 2])
def test_two_towers_of_the_gpu_run_take_the_one_tower_step(pgd_steps):
    """Each example's norm is its own: on the NCCL strategy each tower's half of the rows gives the 1-tower
    weights to 1e-6, FGM and PGD, and the step's collectives are the plain step's (both counted passes'
    gradients summed first)."""
    one_losses, one, _ = adversarial_weights(distribute.make_strategy(devices.plan_devices(0, 1, ())), pgd_steps)
    two_losses, two, trainer = adversarial_weights(gpu_strategy()[1], pgd_steps)
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-6)
    assert one_losses[0] != one_losses[2] and trainer.stats["adversarial_loss"] > 0
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, atol=1e-6)
    plain = training.Trainer(trainer.strategy, trainer.model, trainer.optimizer, bytes_per_pack=2**14,
                             loss_fn=TokenClassification().loss)
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"} and sent == collectives(plain.step_graph(trainer.input_spec))


def test_the_gpu_step_in_float16_moves_every_example():
    """mixed_float16 on the NCCL strategy: the perturbation's gradient is each example's own loss's, which
    float16 holds, so the second pass's loss is above the first on every step; towers stay bit-equal."""
    _, strategy = gpu_strategy()
    with strategy.scope():
        model = modeling.build_classifier(dataclasses.replace(CONFIG, hidden_size=64, intermediate_size=256), 3,
                                          "mixed_float16")
        opt = optimization.create_optimizer(1e-3, 10, 0, float16=True)
    trainer = training.Trainer(strategy, model, opt, loss_fn=with_fgm(Classification().loss, 1.0),
                               bytes_per_pack=2**14)
    features, labels = distinct_ids_batch(8, 16, seed=6)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(2))
    for _ in range(2):
        total = trainer.train_step(next(batches))[0]  # clean + adversarial: the second above half of it
        assert np.isfinite(total) and trainer.stats["adversarial_loss"] > total / 2 + 1e-4, (total, trainer.stats)
    assert trainer.applied_steps == 2
    for v in model.trainable_variables:
        a, b = strategy.experimental_local_results(v.value)
        assert np.array_equal(a.numpy(), b.numpy()), v.path


def test_the_config_checks_it_and_a_resumed_run_compares_it():
    with pytest.raises(UserError, match=r"--adversarial=vat: expected fgm, pgd or none"):
        TrainConfig(adversarial="vat").check()
    with pytest.raises(UserError, match=r"--adv_epsilon=-1.0: must be a finite number above 0"):
        TrainConfig(adversarial="fgm", adv_epsilon=-1.0).check()
    with pytest.raises(UserError, match=r"--pgd_steps=0: must be a whole number, 1 or more"):
        TrainConfig(adversarial="pgd", pgd_steps=0).check()
    with pytest.raises(UserError, match=r"--pgd_alpha=nan: must be a finite number above 0"):
        TrainConfig(adversarial="pgd", pgd_alpha=float("nan")).check()
    TrainConfig(adversarial="fgm", pgd_steps=0).check()  # PGD's numbers are not FGM's
    assert TrainConfig(adversarial="fgm", adv_epsilon=0.5).settings(8)["adv_epsilon"] == 0.5
    assert "pgd_steps" not in TrainConfig(adversarial="fgm").settings(8)
    assert TrainConfig(adversarial="pgd", adv_epsilon=0.5).adversarial_steps == (0.5, 3, 0.02)
    assert {k: v for k, v in TrainConfig(adversarial="pgd", pgd_steps=2).settings(8).items() if "pgd" in k} == {
        "pgd_steps": 2, "pgd_alpha": 0.02}
    assert "adversarial" not in TrainConfig(adversarial="none").settings(8)  # earlier runs resume as they were
