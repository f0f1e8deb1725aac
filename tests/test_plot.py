"""learning_curves.png from a run's TensorBoard events and eval_results.txt, read without TensorFlow's
deprecated record iterator."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("matplotlib")
from bert_mgpu.io import plot  # noqa: E402


def write_run(out, steps=10, evaluate_every=None):
    """A run directory as the loop leaves it: train/ scalars every step, eval/ every `evaluate_every` steps,
    and eval_results.txt from the evaluation after training at the last step."""
    writers = {run: tf.summary.create_file_writer(os.path.join(out, run)) for run in ("train", "eval")}
    for step in range(1, steps + 1):
        with writers["train"].as_default(step=step):
            tf.summary.scalar("loss", 1.0 / step)
            tf.summary.scalar("learning_rate", 1e-4 * (1 - step / steps))
            tf.summary.scalar("examples_per_second", 50.0 + step)
        if evaluate_every and step % evaluate_every == 0:
            with writers["eval"].as_default(step=step):
                tf.summary.scalar("accuracy", 0.5 + step / 100)
                tf.summary.scalar("loss", 0.9 - step / 100)
    for writer in writers.values():
        writer.close()
    with open(os.path.join(out, "eval_results.txt"), "w") as f:
        f.write(f"eval_accuracy = 0.8125\neval_examples = 32\neval_loss = 0.4375\nglobal_step = {steps}\n")


def test_the_final_evaluation_is_drawn_when_none_was_logged_while_training(tmp_path, caplog):
    import matplotlib.image

    write_run(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        path, series = plot.learning_curves(str(tmp_path))
    assert "deprecated" not in caplog.text
    assert matplotlib.image.imread(path).shape == (800, 1200, 4)
    steps, losses = series["train/loss"]
    assert list(steps) == list(range(1, 11))
    np.testing.assert_allclose(losses, 1.0 / np.arange(1, 11), rtol=1e-6)
    assert [(list(s), list(v)) for s, v in [series["final/accuracy"], series["final/loss"]]] == [
        ([10], [0.8125]), ([10], [0.4375])]


def test_evaluations_while_training_are_the_curve_and_the_final_one_is_not_added(tmp_path):
    write_run(str(tmp_path), evaluate_every=5)
    _, series = plot.learning_curves(str(tmp_path))
    steps, accuracy = series["eval/accuracy"]
    assert list(steps) == [5, 10] and not any(k.startswith("final/") for k in series)
    np.testing.assert_allclose(accuracy, [0.55, 0.6], rtol=1e-6)


def test_a_run_without_evaluation_says_so_on_its_dev_panel(tmp_path):
    write_run(str(tmp_path))
    os.remove(tmp_path / "eval_results.txt")
    plt = plot._pyplot()
    drawn = []
    original = plt.subplots

    def keep(*args, **kwargs):
        fig, axes = original(*args, **kwargs)
        drawn.append(axes)
        return fig, axes

    plt.subplots = keep
    try:
        plot.learning_curves(str(tmp_path))
    finally:
        plt.subplots = original
    dev = drawn[0].flat[1]
    assert not dev.lines and "no dev evaluation" in dev.texts[0].get_text()
