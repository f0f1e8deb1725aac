"""--ema_decay (issue 70 item 3): the moving averages of the weights (their steps against Keras' use_ema:
test_optimization) are what a run evaluates, keeps in best/ and ends with; its checkpoints before the end hold
the weights themselves; the GPU run's step adds no collective."""

import os

import numpy as np
import pytest
from conftest import sentiment_rows, tiny_config
from test_allreduce import collectives, gpu_strategy

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.model import modeling
from bert_mgpu.model.objectives import Classification
from bert_mgpu.train import evaluation, memory, optimization, training
from bert_mgpu.train.train_config import TrainConfig


def test_the_config_checks_the_decay_and_a_resumed_run_compares_it():
    with pytest.raises(UserError, match=r"--ema_decay=1.5: must be 0 \(no average\) or more, and below 1"):
        TrainConfig(ema_decay=1.5).check()
    settings = TrainConfig(ema_decay=0.999, ema_for_eval=False).settings(8)
    assert (settings["ema_decay"], settings["ema_for_eval"]) == (0.999, False)
    assert "ema_decay" not in TrainConfig().settings(8)  # runs from before it resume as they were


def test_the_gpu_step_keeps_the_averages_on_every_tower_with_no_collective_more():
    """NCCL collectives, mixed_float16: the step with an EMA all-reduces what the step without one does; both
    towers' averages stay bit-equal and lag the weights."""
    import tensorflow as tf

    _, strategy = gpu_strategy()
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(500, hidden_size=64, intermediate_size=256), 3,
                                          "mixed_float16")
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=True, ema_decay=0.9)
        plain = optimization.create_optimizer(1e-2, 10, 0, float16=True)
    objective = Classification()
    trainer = training.Trainer(strategy, model, opt, loss_fn=objective.loss, bytes_per_pack=2**14)
    features, _ = memory.classifier_batch(8, 16)
    labels = (np.arange(8) % 3).astype(np.int32)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(3))
    sent = collectives(trainer.step_graph(trainer.input_spec))
    without = collectives(training.Trainer(strategy, model, plain, loss_fn=objective.loss, bytes_per_pack=2**14)
                          .step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"} and sent == without and len(sent) > 10
    losses = [trainer.train_step(next(batches))[0] for _ in range(3)]
    assert all(np.isfinite(losses)) and trainer.applied_steps == 3, losses
    averages = opt.inner_optimizer._model_variables_moving_average
    for v, a in zip(model.trainable_variables, averages):
        x, y = strategy.experimental_local_results(a.value)
        assert np.array_equal(x.numpy(), y.numpy()), v.path
    assert any(not np.allclose(v.numpy(), a.numpy()) for v, a in zip(model.trainable_variables, averages))


def test_a_run_evaluates_keeps_and_ends_with_the_averages(google_release, tmp_path):
    """Decay 0.5 over 6 steps, a checkpoint each step, evaluation every 3: the evaluation at step 3 scores the
    NumPy average of the weights of checkpoints 1-3 (W1/4 + W2/4 + W3/2), not checkpoint 3's own weights;
    best/ and the run's last checkpoint score what their evaluations did, and so does the classifier after
    fit."""
    def rows(n, seed):
        return [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in
                enumerate(sentiment_rows(n, seed=seed))]

    train, dev = rows(96, 1), rows(24, 2)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                   max_seq_length=32)
    out = str(tmp_path / "run")
    history = clf.fit(train, out, epochs=1, learning_rate=5e-3, verbose=False, dev=dev, eval_every_steps=3,
                      eval_batch_size=4, save_checkpoints_steps=1, save_total_limit=6, ema_decay=0.5,
                      num_warmup_steps=0)  # every step learns: ceil(0.1 x 6) = 1 warmup step would not
    rows_logged = evaluation.read_history(out)
    assert [r["step"] for r in rows_logged] == [3, 6] == history["eval_step"]
    one = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)

    def opened(path):
        return bert_mgpu.BertClassifier.from_pretrained(path, towers=one, precision="float32", max_seq_length=32)

    live = [opened(os.path.join(out, f"ckpt-{step}")) for step in (1, 2, 3)]
    third = live[2]
    at_3 = rows_logged[0]["eval_loss"]
    assert third.evaluate(dev, 4)["eval_loss"] != pytest.approx(at_3, rel=1e-4)  # not the weights themselves
    for v, w1, w2 in zip(third.model.weights, live[0].model.weights, live[1].model.weights):
        v.assign(w1.numpy() / 4 + w2.numpy() / 4 + v.numpy() / 2)
    assert third.evaluate(dev, 4)["eval_loss"] == pytest.approx(at_3, rel=1e-4)

    at_6 = rows_logged[1]["eval_loss"]
    assert opened(os.path.join(out, "ckpt-6")).evaluate(dev, 4)["eval_loss"] == pytest.approx(at_6, rel=1e-4)
    assert clf.evaluate(dev, 4)["eval_loss"] == pytest.approx(at_6, rel=1e-4)
    best = opened(os.path.join(out, "best"))
    row = next(r for r in rows_logged if r["step"] == best.global_step)
    assert best.evaluate(dev, 4)["eval_loss"] == pytest.approx(row["eval_loss"], rel=1e-4)


def test_with_ema_for_eval_off_the_run_evaluates_and_ends_with_the_weights_themselves(google_release, tmp_path):
    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(96, 1))]
    dev = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(24, 2))]
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                   max_seq_length=32)
    out = str(tmp_path / "run")
    clf.fit(train, out, epochs=1, learning_rate=5e-3, verbose=False, dev=dev, eval_every_steps=3, eval_batch_size=4,
            save_checkpoints_steps=3, ema_decay=0.5, ema_for_eval=False)
    one = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)
    for row in evaluation.read_history(out):
        at = bert_mgpu.BertClassifier.from_pretrained(os.path.join(out, f"ckpt-{row['step']}"), towers=one,
                                                      precision="float32", max_seq_length=32)
        assert at.evaluate(dev, 4)["eval_loss"] == pytest.approx(row["eval_loss"], rel=1e-4), row
    assert clf.evaluate(dev, 4)["eval_loss"] == pytest.approx(row["eval_loss"], rel=1e-4)
