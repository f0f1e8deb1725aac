"""Evaluation while fine-tuning: the schedule, eval_history.tsv, best/, early stopping, resume."""

import os

import numpy as np
import pytest
from conftest import sentiment_rows, write_tsv

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.train import evaluation
from bert_mgpu.train.evaluation import BestModel, DevEvaluation

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


class FakeLoop:
    """What DevEvaluation uses of a Loop: the step, log, save, end_epoch and stop."""

    def __init__(self, step=0):
        self.step = self.first_step = step
        self.stop, self.saved, self.logged = None, [], []

    def log(self, record, writer=None):
        self.logged.append(record)

    def save(self):
        self.saved.append(self.step)

    def end_epoch(self, logs):
        pass


def planted(values):
    """An evaluate() returning the next planted accuracy (and a loss) at each call."""
    values = iter(values)
    return lambda: {"eval_accuracy": next(values), "eval_loss": 1.0}


def fake_save(directory, step):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{step}"\n')
    with open(os.path.join(directory, f"ckpt-{step}.index"), "w") as f:
        f.write("")
    with open(os.path.join(directory, "bert_mgpu.json"), "w") as f:
        f.write(f'{{"global_step": {step}}}')


def run_evaluations(watch, loop, steps):
    for step in steps:
        loop.step = step
        watch.after_step(loop, None)
        if loop.stop:
            return step
    return None


ACCURACIES = [0.50, 0.60, 0.605, 0.65, 0.64, 0.655, 0.62]


def test_early_stopping_stops_where_the_patience_and_threshold_say(tmp_path):
    """Improvements above 0.01 count: 0.50, 0.60, (0.605: +0.005 no), 0.65, (0.64), (0.655: +0.005 is not
    above 0.01): the third evaluation without one, at step 70, stops the run with patience 3."""
    watch = DevEvaluation(planted(ACCURACIES), 10, str(tmp_path), BestModel("accuracy", patience=3, threshold=0.01),
                          fake_save)
    watch.resume(0)
    loop = FakeLoop()
    stopped = run_evaluations(watch, loop, range(10, 101, 10))
    assert stopped == 70
    assert loop.stop == ("early stopping: accuracy has not improved by more than 0.01 in 3 evaluation(s); best "
                         "0.65 at step 40")
    assert loop.saved == [10, 20, 30, 40, 50, 60, 70]  # each evaluation's step is checkpointed
    assert evaluation._step_of(str(tmp_path / "best")) == 40
    assert not os.path.exists(tmp_path / "best.pending")
    rows = evaluation.read_history(str(tmp_path))
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50, 60, 70]
    assert [r["eval_accuracy"] for r in rows] == ACCURACIES
    assert (tmp_path / "eval_history.tsv").read_text().splitlines()[0] == "step\tloss\taccuracy"


def test_a_rerun_keeps_the_best_and_the_patience_count_of_the_step_it_resumes_from(tmp_path):
    choice = BestModel("accuracy", patience=3, threshold=0.01)
    first = DevEvaluation(planted(ACCURACIES), 10, str(tmp_path), choice, fake_save)
    first.resume(0)
    run_evaluations(first, FakeLoop(), [10, 20, 30, 40, 50, 60])
    # Killed after step 60's row but before its checkpoint: the rerun resumes from step 50.
    again = DevEvaluation(planted(ACCURACIES[5:]), 10, str(tmp_path), choice, fake_save)
    again.resume(50)
    assert (again.best["step"], again.since) == (40, 1)
    assert [r["step"] for r in again.rows] == [10, 20, 30, 40, 50]
    loop = FakeLoop(50)
    assert run_evaluations(again, loop, [60, 70]) == 70  # as the uninterrupted run
    assert [r["step"] for r in evaluation.read_history(str(tmp_path))] == [10, 20, 30, 40, 50, 60, 70]


def test_a_pending_best_is_kept_only_if_its_step_was_checkpointed(tmp_path):
    choice = BestModel("accuracy")
    for resumed, best in ((40, 40), (30, 20)):
        fake_save(str(tmp_path / "best"), 20)
        fake_save(str(tmp_path / "best.pending"), 40)
        evaluation.write_history(str(tmp_path), [{"step": s, "eval_accuracy": a} for s, a in
                                                 ((20, 0.6), (30, 0.5), (40, 0.7))])
        watch = DevEvaluation(planted([]), 10, str(tmp_path), choice, fake_save)
        watch.resume(resumed)
        assert evaluation._step_of(str(tmp_path / "best")) == best == watch.best["step"]
        assert not os.path.exists(tmp_path / "best.pending")


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy="sometimes"), "--evaluation_strategy='sometimes': expected no, steps or epoch"),
    (dict(strategy="steps"), "--evaluation_strategy=steps needs --eval_every_steps"),
    (dict(every_steps=0), "--eval_every_steps=0: expected 1 or more"),
])
def test_bad_evaluation_schedules_are_one_clear_error(kwargs, message):
    with pytest.raises(UserError) as e:
        evaluation.evaluation_every(**kwargs)
    assert str(e.value) == message


def test_schedules_and_what_is_better():
    assert evaluation.evaluation_every("epoch", None, 12.5) == 12
    assert evaluation.evaluation_every("no", 30) == 30 and evaluation.evaluation_every() is None
    assert not BestModel("loss").greater_is_better and BestModel("f1").metric == "eval_f1"
    with pytest.raises(UserError, match="--early_stopping_patience=0: expected 1 or more evaluations"):
        BestModel(patience=0)


@pytest.fixture(scope="module")
def examples():
    def make(n, seed):
        return [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in
                enumerate(sentiment_rows(n, seed=seed))]
    return make(96, 1), make(24, 2)


def test_evaluations_while_training_equal_evaluating_their_checkpoints_on_one_tower(google_release, examples,
                                                                                    tmp_path):
    train, dev = examples
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                   max_seq_length=32)
    out = str(tmp_path / "run")
    history = clf.fit(train, out, epochs=3, learning_rate=2e-3, verbose=False, dev=dev, eval_every_steps=3,
                      eval_batch_size=4, load_best_model_at_end=True, save_checkpoints_steps=100, save_total_limit=3)
    rows = evaluation.read_history(out)
    assert [r["step"] for r in rows] == [3, 6, 9, 12, 15, 18] == history["eval_step"]  # 96 / 16 x 3 = 18
    assert history["eval_accuracy"] == pytest.approx([r["eval_accuracy"] for r in rows], abs=1e-6)
    assert history["step"][-1] == 18 and len(history["loss"]) == len(history["step"])
    best = max(rows, key=lambda r: (r["eval_accuracy"], -r["step"]))
    assert clf.best_step == best["step"] and clf.global_step == best["step"]
    # load_best_model_at_end: the classifier now holds best/, which scores what its evaluation did.
    assert clf.evaluate(dev, 4)["eval_accuracy"] == pytest.approx(best["eval_accuracy"], abs=1e-6)
    assert os.listdir(os.path.join(out, "eval")) and not os.path.exists(os.path.join(out, "best.pending"))
    # The pictures: decodable PNGs of the expected size, whose curves are the values the run logged.
    import matplotlib.image

    from bert_mgpu.io import plot

    path, series = plot.learning_curves(out)
    assert matplotlib.image.imread(path).shape == (800, 1200, 4)
    steps, losses = series["train/loss"]
    assert list(steps) == history["step"]
    np.testing.assert_allclose(losses, history["loss"], rtol=1e-6)
    steps, accuracies = series["eval/accuracy"]
    assert list(steps) == [r["step"] for r in rows]
    np.testing.assert_allclose(accuracies, [r["eval_accuracy"] for r in rows], atol=1e-6)
    assert "eval/loss" in series and "train/learning_rate" in series and "train/examples_per_second" in series
    assert plot.best_step(out) == best["step"]
    results = clf.evaluate(dev, 4)
    picture = plot.write_confusion(out, clf.confusion, clf.labels)
    assert matplotlib.image.imread(picture).shape[2] == 4 and clf.confusion.sum() == len(dev)
    assert np.trace(clf.confusion) / len(dev) == pytest.approx(results["eval_accuracy"])
    table = (tmp_path / "run" / "confusion_matrix.tsv").read_text().splitlines()
    assert table[0] == "true \\ predicted\tneg\tpos" and len(table) == 3

    # What a notebook has: plain strings, and a DataFrame with labels, give what Examples give.
    import pandas as pd

    probs = clf.predict(dev, 4)
    np.testing.assert_allclose(clf.predict([e.text_a for e in dev], 4, verbose=True), probs, atol=1e-6)
    frame = pd.DataFrame({"text": [e.text_a for e in dev], "label": [e.label for e in dev]})
    assert clf.evaluate(frame, 4)["eval_accuracy"] == pytest.approx(best["eval_accuracy"], abs=1e-6)

    one = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)
    kept = [int(p.split("-")[1].split(".")[0]) for p in os.listdir(out) if p.endswith(".index")]
    assert len(kept) >= 3
    for step in kept:  # the checkpoints still there (save_total_limit=3), each evaluated at its step
        again = bert_mgpu.BertClassifier.from_pretrained(os.path.join(out, f"ckpt-{step}"), towers=one,
                                                         precision="float32", max_seq_length=32)
        got = again.evaluate(dev, 4)
        row = next(r for r in rows if r["step"] == step)
        assert got["eval_accuracy"] == pytest.approx(row["eval_accuracy"], abs=1e-6)
        assert got["eval_loss"] == pytest.approx(row["eval_loss"], rel=1e-4)
    best_dir = bert_mgpu.BertClassifier.from_pretrained(os.path.join(out, "best"), towers=one, precision="float32",
                                                        max_seq_length=32)
    assert best_dir.global_step == best["step"]
    assert best_dir.evaluate(dev, 4)["eval_loss"] == pytest.approx(best["eval_loss"], rel=1e-4)


@pytest.mark.process
def test_kill_9_mid_run_then_rerun_ends_as_the_uninterrupted_run(google_release, tmp_path):
    """The script stops early and evaluates its best model; killed mid-run and rerun, it ends with the same
    history, best model, early stop and results as a run never killed (deterministic ops)."""
    import signal
    import time

    import tensorflow as tf
    from conftest import ROOT, run_script, start_python

    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(320, seed=1))
    write_tsv(data / "dev.tsv", sentiment_rows(24, seed=2))

    def args(out):
        return [os.path.join(ROOT, "run_classifier_mgpu.py"), "--task_name=tsv", f"--data_dir={data}",
                f"--init_checkpoint={google_release}", f"--output_dir={out}", "--do_train", "--n_gpus=0",
                "--towers_per_gpu=2", "--train_batch_size=8", "--max_seq_length=32", "--precision=float32",
                "--num_train_epochs=6", "--learning_rate=1e-3", "--eval_every_steps=10", "--deterministic",
                "--metric_for_best_model=loss", "--early_stopping_patience=3", "--early_stopping_threshold=0.01",
                "--do_eval", "--load_best_model_at_end"]

    whole = run_script(*args(tmp_path / "whole"), check=False)
    assert whole.returncode == 0, whole.stderr[-2000:]
    reference = evaluation.read_history(str(tmp_path / "whole"))
    assert len(reference) >= 4, reference  # it evaluates several times before it ends
    best = BestModel("loss", threshold=0.01).replay(reference)[0]  # a loss must fall by more than 0.01
    assert "(early stopping: loss has not improved by more than 0.01 in 3 evaluation(s); best " in whole.stderr
    results = (tmp_path / "whole" / "eval_results.txt").read_text()
    assert f"global_step = {best['step']}\n" in results  # the best model was evaluated, and says its step
    trained = int(whole.stderr.split("trained to step ")[1].split(" ")[0])
    assert trained > best["step"] and f"{trained} steps (early stopping" in whole.stdout, whole.stdout  # summary

    out = tmp_path / "killed"
    proc = start_python(args(out), tmp_path / "killed.out", tmp_path / "killed.err")
    try:
        deadline = time.monotonic() + 600
        while len(evaluation.read_history(str(out))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    rerun = run_script(*args(out), check=False)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "resuming from" in rerun.stderr
    rows = evaluation.read_history(str(out))
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    for got, want in zip(rows, reference):
        assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-6)
    stop = lambda err: err.split("trained to step ")[1].split("; checkpoint")[0]  # noqa: E731
    assert stop(rerun.stderr) == stop(whole.stderr)
    assert (out / "eval_results.txt").read_text() == results
    best = [tf.train.load_checkpoint(str(tmp_path / run / "best")) for run in ("whole", "killed")]
    names = [n for n in best[0].get_variable_to_shape_map() if n.startswith(("encoder", "head"))]
    assert names
    for name in names:
        np.testing.assert_allclose(best[1].get_tensor(name), best[0].get_tensor(name), atol=1e-6, err_msg=name)
