"""Distillation (issue 69, classification): the soft loss against NumPy; a student that is the teacher scores the
teacher's entropy (the fixed point); a student from the teacher's layers holds them; a distilled run leaves the
teacher's weights bit-identical and is an ordinary classifier run; on the GPU run's strategy the teacher adds no
collective."""

import dataclasses
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import WORDS, ner_sentences, sentiment_rows, tiny_config, write_google_release
from test_allreduce import collectives, gpu_strategy

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.model import modeling
from bert_mgpu.model.distillation import (
    Intermediate,
    attention_kl,
    hidden_mse,
    hidden_projection,
    soft_cross_entropy,
    with_teacher,
)
from bert_mgpu.model.fused_encoder import tapped
from bert_mgpu.model.objectives import Classification
from bert_mgpu.model.tagging_objectives import TokenClassification
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import memory, optimization, training

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_the_soft_loss_is_the_tempered_cross_entropy_times_t_squared():
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(6, 4)).astype(np.float32) * 3, rng.normal(size=(6, 4)).astype(np.float32) * 3
    for temperature in (1.0, 2.0, 4.0):
        want = -(np.exp(np_log_softmax(t.astype(np.float64) / temperature))
                 * np_log_softmax(s.astype(np.float64) / temperature)).sum(-1) * temperature ** 2
        np.testing.assert_allclose(soft_cross_entropy(s, t, temperature).numpy(), want, rtol=1e-5)
    got = soft_cross_entropy(tf.cast(s, tf.bfloat16), tf.cast(t, tf.bfloat16), 2.0)
    assert got.dtype == tf.float32


@pytest.fixture(scope="module")
def teacher(google_release):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    keras.utils.set_random_seed(1)
    return bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                    max_seq_length=32)


def batch(n=8, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 38, size=(n, length)).astype(np.int32)
    ids[:, 0] = 2
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}, \
        rng.integers(0, 2, n).astype(np.int32)


def test_a_student_that_is_the_teacher_scores_the_teachers_entropy(teacher):
    """The fixed point: every layer taken, temperature 1, no dropout: the student's logits are the teacher's
    and the soft loss is the entropy of the teacher's softmax; the total adds the hard cross-entropy."""
    student = bert_mgpu.Distiller.student_from_layers(teacher, range(teacher.config.num_hidden_layers))
    features, labels = batch()
    logits = teacher.model(features, training=False).numpy().astype(np.float64)
    np.testing.assert_array_equal(student.model(features, training=False).numpy(), logits.astype(np.float32))
    kind = Classification()
    loss, stats = with_teacher(kind.loss, teacher.model, kind, 1.0, 0.5, 2.0)(student.model, features, labels,
                                                                               training=False)
    log_p = np_log_softmax(logits)
    entropy = -(np.exp(log_p) * log_p).sum(-1).mean()
    hard = -log_p[np.arange(len(labels)), labels].mean()
    assert float(stats["distill_soft"]) == pytest.approx(entropy, rel=1e-5) and entropy > 0.1
    assert float(stats["distill_hard"]) == pytest.approx(hard, rel=1e-5)
    assert float(loss) == pytest.approx(0.5 * entropy + 2.0 * hard, rel=1e-5)


def test_an_unlabelled_row_adds_its_soft_term_alone(teacher):
    """Rows labelled -1 (unlabelled text) count in the mean with their soft term only; where every row has a
    label the hard term is the head's own loss, bit for bit."""
    student = bert_mgpu.Distiller.student_from_layers(teacher, [0])
    features, labels = batch(seed=3)
    s = student.model(features, training=False).numpy().astype(np.float64)
    t = teacher.model(features, training=False).numpy().astype(np.float64)
    soft = -(np.exp(np_log_softmax(t / 2.0)) * np_log_softmax(s / 2.0)).sum(-1) * 4.0
    hard = -np_log_softmax(s)[np.arange(len(labels)), labels]
    unlabelled = labels.copy()
    unlabelled[[1, 4, 5]] = -1
    kept = unlabelled >= 0
    fn = with_teacher(Classification().loss, teacher.model, Classification(), 2.0, 0.5, 2.0)
    loss, stats = fn(student.model, features, unlabelled, training=False)
    assert float(stats["distill_hard"]) == pytest.approx(hard[kept].sum() / len(labels), rel=1e-5)
    assert float(stats["distill_soft"]) == pytest.approx(soft.mean(), rel=1e-5)
    assert float(loss) == pytest.approx(2.0 * hard[kept].sum() / len(labels) + 0.5 * soft.mean(), rel=1e-5)
    _, stats = fn(student.model, features, labels, training=False)
    alone, _ = Classification().loss(student.model, features, labels, training=False)
    assert stats["distill_hard"].numpy() == alone.numpy()


@pytest.fixture(scope="module")
def teachers(google_release, teacher):
    """An untrained regression and multi-label head on the classifier teacher's encoder and towers."""
    keras.utils.set_random_seed(2)
    return {kind: bert_mgpu.BertClassifier.from_pretrained(google_release, labels, teacher.towers, "float32",
                                                           max_seq_length=32, task_type=kind)
            for kind, labels in (("regression", []), ("multi_label", ["a", "b", "c"]))}


def np_sigmoid_xent(logits, targets):
    return np.maximum(logits, 0) - logits * targets + np.log1p(np.exp(-np.abs(logits)))


@pytest.mark.parametrize("kind", ["regression", "multi_label"])
def test_each_head_kind_has_its_soft_term_and_skips_the_hard_one_of_unlabelled_rows(teachers, kind):
    """A score's soft term is the squared difference (no temperature); a label set's is each label's tempered
    binary cross-entropy, averaged over labels, x T^2; a row without a label (NaN, a row of -1) adds only it."""
    teacher = teachers[kind]
    student = bert_mgpu.Distiller.student_from_layers(teacher, [1])
    assert (student.task_type, student.labels, student.model.head.kernel.shape[-1]) == (
        kind, teacher.labels, 1 if kind == "regression" else 3)
    features, _ = batch(seed=4)
    rng = np.random.default_rng(4)
    kernel = student.model.head.kernel
    kernel.assign(rng.normal(size=kernel.shape).astype(np.float32))  # outputs apart from the teacher's
    s = student.model(features, training=False).numpy().astype(np.float64)
    t = teacher.model(features, training=False).numpy().astype(np.float64)
    if kind == "regression":
        labels = rng.normal(size=8).astype(np.float32)
        labels[[0, 3]] = np.nan
        soft, hard = (s[:, 0] - t[:, 0]) ** 2, (s[:, 0] - labels) ** 2
        kept = ~np.isnan(labels)
    else:
        labels = rng.integers(0, 2, (8, 3)).astype(np.float32)
        labels[[0, 3]] = -1
        soft = np_sigmoid_xent(s / 2, 1 / (1 + np.exp(-t / 2))).mean(-1) * 4
        hard = np_sigmoid_xent(s, labels).mean(-1)
        kept = labels[:, 0] >= 0
    loss, stats = with_teacher(student.objective.loss, teacher.model, student.objective, 2.0, 0.5, 2.0)(
        student.model, features, labels, training=False)
    assert float(stats["distill_soft"]) == pytest.approx(soft.mean(), rel=1e-5) and soft.mean() > 1e-3
    assert float(stats["distill_hard"]) == pytest.approx(hard[kept].sum() / 8, rel=1e-5)
    assert float(loss) == pytest.approx(0.5 * soft.mean() + 2.0 * hard[kept].sum() / 8, rel=1e-5)


@pytest.mark.parametrize("kind", ["regression", "multi_label"])
def test_a_regression_and_a_multi_label_head_distil_into_runs_of_their_kind(teachers, kind, tmp_path):
    teacher = teachers[kind]
    student = bert_mgpu.Distiller.student_from_layers(teacher, [0])
    rows = sentiment_rows(48, 5)
    label = (lambda y: str(1.0 if y == "pos" else -1.0)) if kind == "regression" else (
        lambda y: "a,c" if y == "pos" else "b")
    train = [bert_mgpu.Example(str(i), text, label=label(y)) for i, (y, text) in enumerate(rows)]
    out = str(tmp_path / kind)
    history = bert_mgpu.Distiller(teacher, student, temperature=2.0, unlabeled=["good fun", "dull"] * 8).fit(
        train, out, epochs=1, learning_rate=1e-3, verbose=False, log_every=1)
    assert history["step"][-1] == 4 and all(np.isfinite(history["loss"])) and min(history["distill_soft"]) > 0
    one = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)
    again = bert_mgpu.BertClassifier.from_pretrained(out, towers=one, precision="float32", max_seq_length=32)
    assert (again.task_type, again.labels, again.global_step) == (kind, teacher.labels, 4)
    dev = [text for _, text in sentiment_rows(8, 6)]
    np.testing.assert_allclose(again.predict(dev, 4), student.predict(dev, 4), atol=1e-6)


def test_a_student_of_another_width_from_a_checkpoint_learns_from_the_teacher(teacher, tmp_path):
    """--init_checkpoint's way: a pretrained BERT half the teacher's width and one layer, with the teacher's
    vocabulary. Logits and attention meet as they are; its hidden states through a learnt projection
    (TinyBERT's), trained, saved in the run's checkpoints and restored by a rerun, but not part of the student."""
    narrow, _ = write_google_release(str(tmp_path / "narrow"), tiny_config(10 + len(WORDS), hidden_size=16,
                                                                            num_hidden_layers=1, intermediate_size=32))

    def open_student():
        return bert_mgpu.BertClassifier.from_pretrained(narrow, teacher.labels, teacher.towers, "float32",
                                                        max_seq_length=32)

    student = open_student()
    assert (student.config.hidden_size, teacher.config.hidden_size) == (16, 32)
    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(32, 7))]
    distiller = bert_mgpu.Distiller(teacher, student, temperature=2.0, hidden_weight=1.0, attention_weight=1.0)
    assert distiller.intermediate.layer_map == (1,) and tuple(distiller.projection.kernel.shape) == (16, 32)
    start = distiller.projection.kernel.numpy()
    out = str(tmp_path / "out")
    history = distiller.fit(train, out, epochs=1, learning_rate=1e-3, verbose=False, log_every=1)
    assert history["step"][-1] == 2 and all(np.isfinite(history["loss"])) and min(history["distill_soft"]) > 0
    assert min(history["distill_hidden"]) > 0 and min(history["distill_attention"]) > 0
    trained = distiller.projection.kernel.numpy()
    assert not np.array_equal(trained, start)
    saved = {name: tf.train.load_checkpoint(os.path.join(out, "ckpt-2")).get_tensor(name)
             for name, _ in tf.train.list_variables(os.path.join(out, "ckpt-2"))
             if name.startswith("distillation_projection/") and "kernel" in name and "OPTIMIZER" not in name}
    (kernel,) = saved.values()
    np.testing.assert_array_equal(kernel, trained)
    assert not any("projection" in v.path for v in student.model.weights)
    again = bert_mgpu.Distiller(teacher, open_student(), temperature=2.0, hidden_weight=1.0, attention_weight=1.0)
    assert not np.array_equal(again.projection.kernel.numpy(), trained)
    again.fit(train, out, epochs=1, learning_rate=1e-3, verbose=False)  # the finished run: restored, not trained
    np.testing.assert_array_equal(again.projection.kernel.numpy(), trained)


TAGS = ["O", "B-LOC", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def tagger(google_release, teacher):
    keras.utils.set_random_seed(3)
    return bert_mgpu.BertTagger.from_pretrained(google_release, TAGS, teacher.towers, "float32", max_seq_length=32)


def test_a_taggers_soft_term_covers_every_words_first_piece_and_its_loss_the_tagged_ones(tagger):
    """Per token: the tempered cross-entropy x T^2 over each word's first piece, tagged (>= 0) or in unlabelled
    text (-2); the head's loss over the tagged ones only; later pieces and padding (-1) in neither."""
    student = bert_mgpu.Distiller.student_from_layers(tagger, [1])
    assert isinstance(student, bert_mgpu.BertTagger) and student.labels == TAGS
    rng = np.random.default_rng(6)
    kernel = student.model.head.kernel
    kernel.assign(rng.normal(size=kernel.shape).astype(np.float32))
    features, _ = batch(4, 10, seed=6)
    labels = rng.integers(0, 4, (4, 10)).astype(np.int32)
    labels[:, 0] = labels[:, -1] = labels[0, 3] = -1  # [CLS], [SEP], a word's second piece
    labels[2, 1:-1] = -2  # an unlabelled sentence
    s = student.model(features, training=False).numpy().astype(np.float64)
    t = tagger.model(features, training=False).numpy().astype(np.float64)
    words, tagged = labels != -1, labels >= 0
    soft = -(np.exp(np_log_softmax(t / 2)) * np_log_softmax(s / 2)).sum(-1) * 4
    hard = -np.take_along_axis(np_log_softmax(s), np.maximum(labels, 0)[..., None], -1)[..., 0]
    kind = TokenClassification()
    loss, stats = with_teacher(kind.loss, tagger.model, kind, 2.0, 0.5, 2.0)(student.model, features, labels,
                                                                              training=False)
    assert float(stats["distill_soft"]) == pytest.approx(soft[words].mean(), rel=1e-5)
    assert float(stats["distill_hard"]) == pytest.approx(hard[tagged].mean(), rel=1e-5)
    assert float(loss) == pytest.approx(0.5 * soft[words].mean() + 2.0 * hard[tagged].mean(), rel=1e-5)


def test_a_tagger_distils_on_tagged_and_unlabelled_sentences_into_a_tagger_run(tagger, teacher, google_release,
                                                                               tmp_path):
    student = bert_mgpu.Distiller.student_from_layers(tagger, [0])
    train = ner_sentences(48, 4, 9, seed=1)
    unlabelled = [" ".join(s.tokens) for s in ner_sentences(16, 4, 9, seed=2)]
    distiller = bert_mgpu.Distiller(tagger, student, temperature=2.0, unlabeled=unlabelled)
    assert [s.guid for s in distiller.unlabeled[:2]] == ["unlabeled-0", "unlabeled-1"]
    out = str(tmp_path / "tagger")
    history = distiller.fit(train, out, epochs=1, learning_rate=1e-3, verbose=False, log_every=1)
    assert history["step"][-1] == 4 and min(history["distill_soft"]) > 0, history  # (48 + 16) / 16 windows
    one = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)
    again = bert_mgpu.BertTagger.from_pretrained(out, towers=one, precision="float32")
    assert (again.labels, again.global_step, again.config.num_hidden_layers) == (TAGS, 4, 1)
    dev = ner_sentences(8, 4, 9, seed=3, split="dev")
    assert again.evaluate(dev, 4)["eval_loss"] == pytest.approx(student.evaluate(dev, 4)["eval_loss"], rel=1e-5)
    with pytest.raises(UserError, match=r"unlabeled sentence train-0 has tags: tagged sentences are fit's"):
        bert_mgpu.Distiller(tagger, student, unlabeled=train[:1])
    crf = bert_mgpu.BertTagger.from_pretrained(google_release, TAGS, tagger.towers, "float32", max_seq_length=32,
                                               crf=True)
    with pytest.raises(UserError, match=r"the teacher is a tagger \(CRF\) head, which has no soft"):
        bert_mgpu.Distiller(crf, student)
    with pytest.raises(UserError, match=r"the student is a tagger head, the teacher a classification"):
        bert_mgpu.Distiller(teacher, student)


def distilled_weights(strategy, steps=3, width=32):
    """A 1-layer student's weights after `steps` distillation steps from a 2-layer teacher (float32, no
    dropout), the intermediate losses too, on one global batch of 8 rows, 3 of them unlabelled, some padded;
    a student of another `width` with its hidden states' projection, whose weights come last."""
    keras.utils.set_random_seed(1)
    config = tiny_config(38, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    small = dataclasses.replace(config, num_hidden_layers=1, hidden_size=width)
    with strategy.scope():
        teacher = modeling.build_classifier(config, 2, "float32")
        student = modeling.build_classifier(small, 2, "float32")
        teacher.trainable = False
        opt = optimization.create_optimizer(1e-2, 10, 0)
        projection = hidden_projection(small, config, "float32")
    start = projection.kernel.numpy() if projection else None
    kind = Classification()
    loss_fn = with_teacher(kind.loss, teacher, kind, temperature=2.0, intermediate=Intermediate((1,), 0.5, 2.0),
                           projection=projection)
    trainer = training.Trainer(strategy, student, opt, bytes_per_pack=2**14, loss_fn=loss_fn)
    features, labels = batch(seed=5)
    labels[[1, 4, 6]] = -1  # unlabelled rows on both towers
    features["padding_mask"][[0, 5], 7:] = False
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(steps))
    losses = [trainer.train_step(next(batches))[0] for _ in range(steps)]
    return losses, [v.numpy() for v in trainer.trained_variables], start


@pytest.mark.parametrize("width", [32, 16])
def test_two_towers_of_the_gpu_run_distil_as_one_tower(width):
    """The GPU run's strategy (NCCL collectives on 2 CPU devices), each tower 4 of the rows, gives the 1-tower
    student to 1e-6, unlabelled rows and all; a narrower student's projection too, all-reduced with it."""
    one_losses, one, start = distilled_weights(distribute.make_strategy(devices.plan_devices(0, 1, ())),
                                                    width=width)
    two_losses, two, _ = distilled_weights(gpu_strategy()[1], width=width)
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-6)
    assert len(one_losses) == 3 and one_losses[0] != one_losses[2]
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, atol=1e-6)
    assert len(one) == len(two) == 25 + 2 * (width != 32)  # the projection's kernel and bias, trained
    if width != 32:
        assert one[-2].shape == (16, 32) and np.abs(one[-2] - start).max() > 1e-3


def test_a_student_from_layers_holds_them_and_the_teachers_embeddings_and_head(teacher):
    student = bert_mgpu.Distiller.student_from_layers(teacher, [1])
    assert student.config.num_hidden_layers == 1 and teacher.config.num_hidden_layers == 2
    source = {v.path: v.numpy() for v in teacher.model.weights}
    for v in student.model.weights:
        path = v.path.replace("transformer_layer_0/", "transformer_layer_1/")
        np.testing.assert_array_equal(v.numpy(), source[path], err_msg=v.path)
    assert any("classifier" in v.path for v in student.model.weights)
    for bad in ([2], [0, 0], []):
        with pytest.raises(UserError, match=r"teacher_layers=.*: distinct layers of the teacher's 0-1"):
            bert_mgpu.Distiller.student_from_layers(teacher, bad)


def test_what_cannot_be_distilled_is_one_line(teacher, google_release):
    student = bert_mgpu.Distiller.student_from_layers(teacher, [0])
    with pytest.raises(UserError, match=r"--temperature=0.0: must be a finite number above 0"):
        bert_mgpu.Distiller(teacher, student, temperature=0.0)
    with pytest.raises(UserError, match=r"--soft_weight and --hard_weight are both 0"):
        bert_mgpu.Distiller(teacher, student, soft_weight=0, hard_weight=0)
    other = bert_mgpu.BertClassifier.from_pretrained(google_release, ["pos", "neg"], teacher.towers, "float32",
                                                     max_seq_length=32)
    with pytest.raises(UserError, match=r"the student's labels \(pos, neg\) are not the teacher's \(neg, pos\)"):
        bert_mgpu.Distiller(teacher, other)
    regression = bert_mgpu.BertClassifier.from_pretrained(google_release, [], teacher.towers, "float32",
                                                          max_seq_length=32, task_type="regression")
    with pytest.raises(UserError, match=r"the student is a regression head, the teacher a classification one"):
        bert_mgpu.Distiller(teacher, regression)
    with pytest.raises(UserError, match=r"unlabeled example 1 has a label \('pos'\): labelled rows are fit's"):
        bert_mgpu.Distiller(teacher, student, unlabeled=["a", bert_mgpu.Example("1", "b", label="pos")])
    with pytest.raises(UserError, match=r"unlabeled example 0 is a pair; the teacher reads one text"):
        bert_mgpu.Distiller(teacher, student, unlabeled=[("a", "b")])
    student.unlabelled = bert_mgpu.Distiller(teacher, student, unlabeled=["a"]).unlabeled
    with pytest.raises(UserError, match=r"1 unlabelled training rows and no teacher to label them"):
        student.fit([bert_mgpu.Example("0", "good", label="pos")], "never-written", epochs=1)


def test_a_distilled_run_leaves_the_teacher_as_it_was_and_is_an_ordinary_run(teacher, tmp_path):
    before = [v.numpy() for v in teacher.model.weights]
    student = bert_mgpu.Distiller.student_from_layers(teacher, [0])
    start = [v.numpy() for v in student.model.trainable_variables]
    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(64, 1))]
    dev = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(16, 2))]
    unlabelled = [text for _, text in sentiment_rows(16, 3)]
    out = str(tmp_path / "student")
    history = bert_mgpu.Distiller(teacher, student, temperature=2.0, unlabeled=unlabelled).fit(
        train, out, epochs=1, learning_rate=1e-3, verbose=False, log_every=1)
    assert history["step"][-1] == 5 and all(np.isfinite(history["distill_soft"])), history  # (64 + 16) / 16
    assert all(s > 0 for s in history["distill_soft"]) and len(history["distill_hard"]) == 5
    for v, w in zip(teacher.model.weights, before):
        np.testing.assert_array_equal(v.numpy(), w, err_msg=v.path)
    assert all(not np.array_equal(v.numpy(), w) for v, w in zip(student.model.trainable_variables, start)
               if "pooled" not in v.path)
    assert student.loss_wrapper is None and not student.unlabelled  # the student trains alone again after
    import json

    run = json.load(open(os.path.join(out, "bert_mgpu.json")))
    distillation = run["settings"]["distillation"]
    assert (distillation["temperature"], distillation["soft_weight"], distillation["hard_weight"],
            distillation["unlabeled_examples"]) == (2.0, 1.0, 1.0, 16)
    assert len(distillation["teacher_sha256"]) == 64
    one = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1, train_batch_size=8)
    again = bert_mgpu.BertClassifier.from_pretrained(out, towers=one, precision="float32", max_seq_length=32)
    assert again.config.num_hidden_layers == 1 and again.global_step == 5
    np.testing.assert_allclose(again.predict(dev, 4), student.predict(dev, 4), atol=1e-6)


@pytest.mark.parametrize("head", ["classifier", "tagger"])
def test_the_gpu_step_runs_the_teacher_and_all_reduces_only_the_student(head):
    """NCCL collectives, mixed_float16: the distillation step's collectives, intermediate losses and all, are the
    student's own step's (the teacher's variables are neither trained nor all-reduced), the teacher's weights
    stay as they were and both towers' student weights stay bit-equal; a tagger's with unlabelled words (-2)
    in the batch."""
    _, strategy = gpu_strategy()
    build = modeling.build_classifier if head == "classifier" else modeling.build_tagger
    with strategy.scope():
        teacher = build(tiny_config(500, hidden_size=64, intermediate_size=256), 3, "mixed_float16")
        student = build(tiny_config(500, hidden_size=64, intermediate_size=256, num_hidden_layers=1), 3,
                        "mixed_float16")
        teacher.trainable = False
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=True)
    objective = Classification() if head == "classifier" else TokenClassification()
    inside = Intermediate((1,), 1.0, 1.0)  # the hidden states' and attention's terms too
    trainer = training.Trainer(strategy, student, opt, bytes_per_pack=2**14,
                               loss_fn=with_teacher(objective.loss, teacher, objective, 2.0, intermediate=inside))
    alone = training.Trainer(strategy, student, opt, loss_fn=objective.loss, bytes_per_pack=2**14)
    features, _ = memory.classifier_batch(8, 16)
    labels = (np.arange(8) % 3).astype(np.int32)
    if head == "tagger":
        labels = (np.arange(8 * 16).reshape(8, 16) % 3).astype(np.int32)
        labels[:, 0] = labels[:, 5] = -1
        labels[3, 1:] = labels[6, 1:] = -2
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((features, labels)).repeat(2))
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"} and len(sent) > 10
    assert sent == collectives(alone.step_graph(trainer.input_spec))
    before = [v.numpy() for v in teacher.weights]
    losses = [trainer.train_step(next(batches))[0] for _ in range(2)]
    assert all(np.isfinite(losses)) and trainer.applied_steps == 2, losses
    assert min(trainer.stats[k] for k in ("distill_soft", "distill_hidden", "distill_attention")) > 0, trainer.stats
    for v, w in zip(teacher.weights, before):
        for copy in strategy.experimental_local_results(v.value):
            np.testing.assert_array_equal(copy.numpy(), w, err_msg=v.path)
    for v in student.trainable_variables:
        a, b = strategy.experimental_local_results(v.value)
        assert np.array_equal(a.numpy(), b.numpy()), v.path
    assert not {id(v) for v in teacher.weights} & {id(v) for v in opt.inner_optimizer._trainable_variables}


def np_softmax(x):
    return np.exp(np_log_softmax(x))


def test_the_intermediate_terms_are_the_hidden_mse_and_attention_kl_over_real_tokens():
    rng = np.random.default_rng(7)
    mask = np.ones((3, 5), bool)
    mask[1, 3:] = mask[2, 1:] = False
    s, t = rng.normal(size=(2, 3, 5, 8)).astype(np.float32)
    per_token = ((s.astype(np.float64) - t) ** 2).mean(-1)
    want = [(per_token[i] * mask[i]).sum() / mask[i].sum() for i in range(3)]
    np.testing.assert_allclose(hidden_mse(s, t, mask).numpy(), want, rtol=1e-6)
    bias = np.where(mask, 0.0, -1e9)[:, None, None, :]
    s, t = (rng.normal(size=(2, 3, 2, 5, 5)) * 2 + bias).astype(np.float32)
    p, q = np_softmax(t.astype(np.float64)), np_softmax(s.astype(np.float64))
    kl = np.where(p > 0, p * (np.log(np.maximum(p, 1e-300)) - np.log(np.maximum(q, 1e-300))), 0).sum(-1).mean(1)
    want = [(kl[i] * mask[i]).sum() / mask[i].sum() for i in range(3)]
    np.testing.assert_allclose(attention_kl(s, t, mask).numpy(), want, rtol=1e-5)
    assert attention_kl(tf.cast(t, tf.bfloat16), tf.cast(t, tf.bfloat16), mask).dtype == tf.float32
    np.testing.assert_array_equal(attention_kl(t, t, mask).numpy(), 0)


def padded_batch(seed):
    features, labels = batch(seed=seed)
    features["padding_mask"][[2, 5], 6:] = False
    features["token_ids"][~features["padding_mask"]] = 0
    return features, labels


def test_the_fused_encoder_hands_out_its_hidden_states_and_attention_scores(teacher):
    """Within tapped(): the embeddings' and each layer's output, and each layer's scores; layer 0's scores are
    its query and key projections of the embeddings' output; the classifier's logits stay as they were."""
    features, _ = padded_batch(11)
    plain = teacher.model(features, training=False).numpy()
    with tapped(scores=True) as calls:
        logits = teacher.model(features, training=False).numpy()
    np.testing.assert_allclose(logits, plain, atol=1e-6)
    (tap,) = calls
    assert len(tap.hidden) == 3 and len(tap.scores) == 2
    assert tap.hidden[0].shape == (8, 12, 32) and tap.scores[0].shape == (8, 4, 12, 12)
    layer = teacher.model.backbone.transformer_layers[0]._self_attention_layer
    h = tap.hidden[0].numpy().astype(np.float64)

    def project(dense):
        return np.einsum("blh,hnd->bnld", h, dense.kernel.numpy()) + dense.bias.numpy()[None, :, None, :]

    q, k = project(layer._query_dense), project(layer._key_dense)
    want = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + np.where(features["padding_mask"], 0.0, -1e9)[:, None, None]
    real = np.broadcast_to(features["padding_mask"][:, None, None, :], want.shape)
    np.testing.assert_allclose(tap.scores[0].numpy()[real], want[real], rtol=1e-4, atol=1e-5)
    with tapped() as calls:
        teacher.model(features, training=False)
    assert not calls[0].scores and len(calls[0].hidden) == 3


def test_the_intermediate_losses_follow_the_layer_map_and_vanish_at_the_fixed_point(teacher):
    """A student of the teacher's layer 1 against the teacher's layer 1: the hidden term is the mean over the
    embeddings' pair and that layer's, the attention term that layer's KL, both as NumPy computes them from
    the two models' taps; a student that is the teacher (every layer, no dropout) scores 0 for both."""
    features, labels = padded_batch(12)
    kind = Classification()
    teacher = teacher.with_encoder(teacher.config)  # kernels of some size: attention far from uniform
    rng = np.random.default_rng(3)
    for v in teacher.model.weights:
        if v.path.endswith("kernel"):
            v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32))
    student = bert_mgpu.Distiller.student_from_layers(teacher, [1])
    with tapped(scores=True) as calls:
        student.model(features, training=False)
        teacher.model(features, training=False)
    s, t = calls
    mask = features["padding_mask"]

    def np_mse(a, b):
        per = ((a.numpy().astype(np.float64) - b.numpy()) ** 2).mean(-1)
        return ((per * mask).sum(-1) / mask.sum(-1)).mean()

    def np_kl(a, b):
        log_q, log_p = np_log_softmax(a.numpy().astype(np.float64)), np_log_softmax(b.numpy().astype(np.float64))
        per = (np.exp(log_p) * (log_p - log_q)).sum(-1).mean(1)
        return ((per * mask).sum(-1) / mask.sum(-1)).mean()

    hidden = (np_mse(s.hidden[0], t.hidden[0]) + np_mse(s.hidden[1], t.hidden[2])) / 2
    attention = np_kl(s.scores[0], t.scores[1])
    assert np_mse(s.hidden[0], t.hidden[0]) == 0 and hidden > 0.1 and attention > 0.01, (hidden, attention)
    fn = with_teacher(kind.loss, teacher.model, kind, 2.0, 1.0, 1.0, Intermediate((1,), 0.5, 3.0))
    loss, stats = fn(student.model, features, labels, training=False)
    base, plain = with_teacher(kind.loss, teacher.model, kind, 2.0, 1.0, 1.0)(student.model, features, labels,
                                                                               training=False)
    assert float(stats["distill_hidden"]) == pytest.approx(hidden, rel=1e-5)
    assert float(stats["distill_attention"]) == pytest.approx(attention, rel=1e-4)
    assert float(loss) == pytest.approx(float(base) + 0.5 * hidden + 3.0 * attention, rel=1e-5)
    assert plain["distill_soft"].numpy() == stats["distill_soft"].numpy()
    same = bert_mgpu.Distiller.student_from_layers(teacher, [0, 1])
    _, stats = with_teacher(kind.loss, teacher.model, kind, 1.0, 1.0, 1.0, Intermediate((0, 1), 1.0, 1.0))(
        same.model, features, labels, training=False)
    assert abs(float(stats["distill_hidden"])) < 1e-10 and abs(float(stats["distill_attention"])) < 1e-6


def test_the_layer_map_and_the_intermediate_weights_are_checked_in_one_line(teacher, google_release, tmp_path):
    student = bert_mgpu.Distiller.student_from_layers(teacher, [1])
    assert bert_mgpu.Distiller(teacher, student, hidden_weight=1.0).intermediate.layer_map == (1,)
    plain = teacher.with_encoder(dataclasses.replace(teacher.config, num_hidden_layers=1))
    assert bert_mgpu.Distiller(teacher, plain).intermediate.layer_map == (1,)  # the last from the last
    assert Intermediate.uniform(3, 12) == (3, 7, 11) and Intermediate.uniform(2, 2) == (0, 1)
    with pytest.raises(UserError, match=r"--layer_map=0,1: one teacher layer \(0-1\) for each of the student's 1"):
        bert_mgpu.Distiller(teacher, student, attention_weight=1.0, layer_map=[0, 1])
    with pytest.raises(UserError, match=r"--layer_map=2: one teacher layer \(0-1\)"):
        bert_mgpu.Distiller(teacher, student, hidden_weight=1.0, layer_map=[2])
    with pytest.raises(UserError, match=r"--hidden_weight=-1.0: must be a finite number, 0 or more"):
        bert_mgpu.Distiller(teacher, student, hidden_weight=-1.0)
    wide = teacher.with_encoder(dataclasses.replace(teacher.config, num_hidden_layers=1, hidden_size=64))
    assert bert_mgpu.Distiller(teacher, wide, attention_weight=1.0).projection is None  # only the hidden term's
    assert tuple(bert_mgpu.Distiller(teacher, wide, hidden_weight=1.0).projection.kernel.shape) == (64, 32)
    heads = teacher.with_encoder(dataclasses.replace(teacher.config, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(UserError, match=r"--attention_weight: the student has 2 attention heads, the teacher 4"):
        bert_mgpu.Distiller(teacher, heads, attention_weight=1.0)
    plain = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], teacher.towers, "float32",
                                                     max_seq_length=32, fused_encoder=False)
    with pytest.raises(UserError, match=r"--hidden_weight and --attention_weight need the fused encoder in the"):
        bert_mgpu.Distiller(plain, student, hidden_weight=1.0)
    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(16, 1))]
    with pytest.raises(UserError, match=r"^--attention_weight and --recompute: the recomputed layers cannot"):
        bert_mgpu.Distiller(teacher, student, attention_weight=1.0).fit(train, str(tmp_path / "out"), epochs=1,
                                                                        verbose=False, recompute=True)


def test_a_student_learns_the_teachers_hidden_states_and_attention(teacher, tmp_path):
    """Fitting with the intermediate losses alone (next to a small soft one) brings the student's layer 0
    closer to the teacher's layer 1 in both measures, on rows it did not train on; the run records them."""
    teacher = teacher.with_encoder(teacher.config)
    rng = np.random.default_rng(4)
    for v in teacher.model.weights:
        if v.path.endswith("kernel"):
            v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32))
    student = bert_mgpu.Distiller.student_from_layers(teacher, [0])
    distiller = bert_mgpu.Distiller(teacher, student, soft_weight=0.01, hard_weight=0.0, hidden_weight=1.0,
                                    attention_weight=1.0, layer_map=[1])
    kind = Classification()
    measure = with_teacher(kind.loss, teacher.model, kind, 1.0, 1.0, 0.0, distiller.intermediate)
    features, labels = padded_batch(13)

    def terms():
        _, stats = measure(student.model, features, labels, training=False)
        return float(stats["distill_hidden"]), float(stats["distill_attention"])

    before = terms()
    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(96, 1))]
    history = distiller.fit(train, str(tmp_path / "student"), epochs=2, learning_rate=3e-3, verbose=False,
                            log_every=1)
    after = terms()
    assert after[0] < 0.85 * before[0] and after[1] < 0.5 * before[1], (before, after)  # measured: 0.68x, 0.32x
    assert len(history["distill_hidden"]) == len(history["distill_attention"]) == 12
    import json

    settings = json.load(open(tmp_path / "student" / "bert_mgpu.json"))["settings"]["distillation"]
    assert (settings["layer_map"], settings["hidden_weight"], settings["attention_weight"]) == ([1], 1.0, 1.0)


def read_cache(path):
    """A --teacher_logits file -> (logits, the metadata: what they were made from)."""
    import safetensors

    with safetensors.safe_open(str(path), framework="numpy") as f:
        return f.get_tensor("logits"), f.metadata()


def test_cached_teacher_logits_teach_as_the_teacher_does_and_are_read_back(teacher, tmp_path, caplog):
    """--teacher_logits: the teacher predicts the training rows once (unlabelled ones too) into the file; the run
    that reads its batches' rows from it trains the student as the run whose teacher runs in each step (to
    float32 round-off), and a second run reads the file and repeats the first bit for bit; a file made for
    other rows or a teacher of other weights is refused in one line, as is the cache with the intermediate
    losses."""
    import logging

    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(48, 4))]
    unlabelled = [text for _, text in sentiment_rows(16, 5)]
    cache = str(tmp_path / "logits.safetensors")

    def run(name, path):
        keras.utils.set_random_seed(7)
        student = bert_mgpu.Distiller.student_from_layers(teacher, [1])
        history = bert_mgpu.Distiller(teacher, student, temperature=2.0, unlabeled=unlabelled,
                                      teacher_logits=path).fit(train, str(tmp_path / name), epochs=2,
                                                               learning_rate=1e-3, verbose=False, log_every=1)
        return history, [v.numpy() for v in student.model.trainable_variables]

    live, live_weights = run("live", None)
    with caplog.at_level(logging.INFO, logger="bert_mgpu"):
        cached, cached_weights = run("cached", cache)
        assert "teacher logits: predicted 64 rows, kept in " + cache in caplog.text
        caplog.clear()
        again, again_weights = run("again", cache)
        assert "teacher logits: read 64 rows from " + cache in caplog.text
    assert len(live["step"]) == 8 and live["step"][-1] == 8  # (48 + 16) / 16 rows x 2 epochs
    for key in ("loss", "distill_soft", "distill_hard"):
        np.testing.assert_allclose(cached[key], live[key], rtol=2e-5, err_msg=key)
        if key != "loss":
            assert again[key] == cached[key], key
    # The logged total, a mean over towers reduced apart from its two terms, differed in its last bit in 3 of 13
    # repeats of one run on an AMD EPYC (weights and both terms equal): one float32 ulp.
    np.testing.assert_allclose(again["loss"], cached["loss"], rtol=2.0 ** -23, atol=0)
    for a, b, c in zip(live_weights, cached_weights, again_weights):
        np.testing.assert_allclose(b, a, atol=2e-5)
        np.testing.assert_array_equal(c, b)
    logits, made = read_cache(cache)  # the teacher's logits of every training row, unlabelled last, in order
    np.testing.assert_allclose(logits[:48], teacher._logits(train, 8, "predict", False)[0], atol=1e-6)
    np.testing.assert_allclose(logits[48:], teacher._logits(bert_mgpu.Distiller(
        teacher, teacher, unlabeled=unlabelled).unlabeled, 8, "predict", False)[0], atol=1e-6)
    assert (made["precision"], made["max_seq_length"]) == ("float32", "32")
    student = bert_mgpu.Distiller.student_from_layers(teacher, [1])
    with pytest.raises(UserError, match=r"--teacher_logits=.*logits\.safetensors: made for another train_data_sha256 "
                       r"\([0-9a-f]{64}, this run [0-9a-f]{64}\); delete it or name a new file"):
        bert_mgpu.Distiller(teacher, student, teacher_logits=cache).fit(train[:32], str(tmp_path / "other"),
                                                                        epochs=1, verbose=False)
    other = bert_mgpu.Distiller.student_from_layers(student, [0])  # the same rows, another teacher
    with pytest.raises(UserError, match=r"logits\.safetensors: made for another teacher_sha256 \([0-9a-f]{64}, this "
                       r"run [0-9a-f]{64}\); delete"):
        bert_mgpu.Distiller(student, other, unlabeled=unlabelled, teacher_logits=cache).fit(
            train, str(tmp_path / "other"), epochs=1, verbose=False)
    with pytest.raises(UserError, match=r"--teacher_logits and --hidden_weight or --attention_weight: the "):
        bert_mgpu.Distiller(teacher, student, hidden_weight=1.0, teacher_logits=cache)
    (tmp_path / "bad.safetensors").write_text("not numbers")
    with pytest.raises(UserError, match=r"--teacher_logits=.*bad\.safetensors: not a teacher-logits file of bert_mgpu"):
        bert_mgpu.Distiller(teacher, student, teacher_logits=str(tmp_path / "bad.safetensors")).fit(
            train, str(tmp_path / "bad"), epochs=1, verbose=False)


def test_a_taggers_cached_logits_teach_each_word_as_the_teacher_does(tagger, tmp_path):
    """A tagger's cache holds each window's logits a token; each batch takes its rows' at its own width: the
    student learns as with the teacher in the step, windows of long sentences (doc_stride) and all."""
    train = ner_sentences(40, 4, 40, seed=8)  # some longer than a window of 32 pieces

    def run(name, path):
        keras.utils.set_random_seed(7)
        student = bert_mgpu.Distiller.student_from_layers(tagger, [0])
        history = bert_mgpu.Distiller(tagger, student, temperature=2.0, teacher_logits=path).fit(
            train, str(tmp_path / name), epochs=1, learning_rate=1e-3, verbose=False, log_every=1)
        return history, [v.numpy() for v in student.model.trainable_variables]

    live, live_weights = run("live", None)
    cached, cached_weights = run("cached", str(tmp_path / "tags.safetensors"))
    logits, _ = read_cache(tmp_path / "tags.safetensors")
    windows = tagger._windows(train)
    assert len(windows) > len(train) and logits.shape == (len(windows), 32, 4)  # a long sentence's windows
    assert len(live["step"]) == len(windows) // 16 and min(live["distill_soft"]) > 0
    for key in ("loss", "distill_soft", "distill_hard"):
        np.testing.assert_allclose(cached[key], live[key], rtol=2e-5, err_msg=key)
    for a, b in zip(live_weights, cached_weights):
        np.testing.assert_allclose(b, a, atol=2e-5)


def test_the_gpu_step_with_cached_logits_runs_the_student_alone():
    """NCCL collectives, mixed_float16, the batch carrying `teacher_logits`: the step reads the student's
    variables alone (as many reads as the student's own step; the teacher's forward reads more), all-reduces
    as the student's own step does, and its soft term is the cached logits'."""
    _, strategy = gpu_strategy()
    with strategy.scope():
        teacher = modeling.build_classifier(tiny_config(500, hidden_size=64, intermediate_size=256), 3,
                                            "mixed_float16")
        student = modeling.build_classifier(tiny_config(500, hidden_size=64, intermediate_size=256,
                                                        num_hidden_layers=1), 3, "mixed_float16")
        teacher.trainable = False
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=True)
    kind = Classification()
    features, _ = memory.classifier_batch(8, 16)
    labels = (np.arange(8) % 3).astype(np.int32)
    cached_features = {**features, "teacher_logits": np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)}

    def graph(loss_fn, batch):
        trainer = training.Trainer(strategy, student, opt, bytes_per_pack=2**14, loss_fn=loss_fn)
        trainer.training_batches(tf.data.Dataset.from_tensors(batch))
        return trainer, trainer.step_graph(trainer.input_spec)

    def reads(g):
        return sum(op.type == "ReadVariableOp" for op in g.get_operations())

    trainer, cached = graph(with_teacher(kind.loss, teacher, kind, 2.0), (cached_features, labels))
    _, live = graph(with_teacher(kind.loss, teacher, kind, 2.0), (features, labels))
    _, alone = graph(kind.loss, (features, labels))
    assert reads(cached) == reads(alone) < reads(live) and collectives(cached) == collectives(alone)
    assert {hint for hint, _, _ in collectives(cached)} == {"nccl"}
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((cached_features, labels)))
    trainer.train_step(next(batches))
    s = student(features, training=True)  # no dropout in tiny_config: the step's own first pass
    want = soft_cross_entropy(s, cached_features["teacher_logits"], 2.0).numpy().mean()
    assert float(trainer.stats["distill_soft"]) == pytest.approx(want, rel=1e-2)  # float16 logits


def test_a_student_of_another_vocabulary_learns_the_teachers_cached_outputs(google_release, tagger, tmp_path):
    """A classifier of another vocabulary (the words in another order, and more of them): refused without
    --teacher_logits; with it the teacher reads each training text with its own tokenizer once, and the student,
    reading them with its own, moves towards the teacher's outputs (their KL divergence on the training texts
    falls to under a tenth). A tagger of another vocabulary is refused in one line (its words' pieces would not
    align)."""
    keras.utils.set_random_seed(4)
    teacher = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], tagger.towers, "float32",
                                                       max_seq_length=32)
    kernel = teacher.model.head.kernel
    kernel.assign(kernel.numpy() * 40)  # outputs far from even: something to learn
    other, _ = write_google_release(str(tmp_path / "other"), words=list(reversed(WORDS)) + ["twist", "scene"])
    student = bert_mgpu.BertClassifier.from_pretrained(other, ["neg", "pos"], teacher.towers, "float32",
                                                       max_seq_length=24)
    assert student.tokenizer.vocab != teacher.tokenizer.vocab
    with pytest.raises(UserError, match=r"only a classifier \(no --doc_stride\) is taught across vocabularies, "
                       r"by --teacher_logits"):
        bert_mgpu.Distiller(teacher, student)
    train = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(64, 6))]
    texts = [e.text_a for e in train]
    want = teacher._logits(train, 8, "predict", False)[0]

    def gap():  # KL(teacher || student) at temperature 1, the mean over the texts
        entropy = soft_cross_entropy(want, want).numpy()
        return float((soft_cross_entropy(student._logits(train, 8, "predict", False)[0], want).numpy()
                      - entropy).mean())

    before = gap()
    cache = str(tmp_path / "logits.safetensors")
    bert_mgpu.Distiller(teacher, student, hard_weight=0.0, teacher_logits=cache).fit(
        train, str(tmp_path / "student"), epochs=4, learning_rate=3e-3, verbose=False)
    logits, made = read_cache(cache)
    np.testing.assert_allclose(logits, want, atol=1e-6)  # the teacher's tokenization of each text
    assert len(made["teacher_vocab_sha256"]) == 64 and logits.shape == (64, 2)
    after = gap()
    assert before > 0.005 and after < 0.1 * before, (before, after)  # 0.0094 -> 0.0002 here
    assert len(texts) == 64 and student.global_step == 16
    words = bert_mgpu.BertTagger.from_pretrained(other, TAGS, tagger.towers, "float32", max_seq_length=32)
    with pytest.raises(UserError, match=r"only a classifier \(no --doc_stride\)"):
        bert_mgpu.Distiller(tagger, words, teacher_logits=str(tmp_path / "tags.safetensors"))


def test_workers_that_see_the_logits_file_differently_stop_in_one_line(teacher, tmp_path, monkeypatch):
    """Two workers without shared storage, the file on this one only: the one that would read it and the one
    that would predict (with collectives) stop in the same one line before either acts. The second worker is
    simulated: its answer through the coordination service says it has no file (test_multi_worker runs the
    exchange itself between real workers)."""
    from bert_mgpu.core import _compat
    from bert_mgpu.core.errors import RunError
    from bert_mgpu.parallel import agree

    cache = tmp_path / "logits.safetensors"
    cache.write_bytes(b"")
    monkeypatch.setattr(agree, "worker_of", lambda strategy: (0, 2))
    monkeypatch.setattr(_compat, "exchange_with_workers", lambda key, value, workers, index, timeout: [
        value, value.replace('"--teacher_logits file": true', '"--teacher_logits file": false')])
    from bert_mgpu.api.teacher_logits import TeacherLogits

    with pytest.raises(RunError, match=r"^the workers' plans differ \(--teacher_logits file: worker 0: True, worker "
                       r"1: False\); every worker must run the same plan"):
        TeacherLogits(str(cache), teacher, "sha").outputs(head=None, data=None, digest="sha")  # before any read
