"""Pretraining on 2 logical CPU towers: learning, accumulation, resume, time budget, markers, heads."""

import logging
import os

import keras
import keras_hub
import numpy as np
import pytest
from conftest import tiny_config, write_google_release, write_vocab

import bert_mgpu
from bert_mgpu.api.pretraining import BertPretrainer
from bert_mgpu.data.pretraining_input import PretrainingData
from bert_mgpu.io import checkpoints
from bert_mgpu.model import kernels, pretraining_model
from bert_mgpu.model.modeling import build_backbone
from bert_mgpu.train import schedules
from bert_mgpu.train.budget import Budget, Validation

TEMPLATES = ["the movie was good and fun .", "the film was bad and dull .", "it is a great story of love .",
             "this actor was awful but the plot was brilliant .", "that story is boring and not fun ."]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """Documents of sentences from a few templates: masked words are predictable from their context."""
    d = tmp_path_factory.mktemp("text")
    rng = np.random.default_rng(0)
    with open(d / "train.txt", "w", encoding="utf-8") as f:
        for _ in range(60):
            f.write("".join(s + "\n" for s in rng.choice(TEMPLATES, 6)) + "\n")
    tokens = write_vocab(str(d / "vocab.txt"))
    return str(d), len(tokens)


def new_pretrainer(text, micro=8, nsp=False, seed=0, precision="auto", **config):
    keras.utils.set_random_seed(seed)
    config = tiny_config(text[1], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **config)
    return BertPretrainer.from_config(config, os.path.join(text[0], "vocab.txt"),
                                      towers=bert_mgpu.Towers(0, 2, micro), precision=precision, nsp=nsp)


def text_data(pre, text):
    return PretrainingData("text", [os.path.join(text[0], "train.txt")], pre.tokenizer, max_seq_length=32,
                           max_predictions_per_seq=6)


class FakeClock:
    """Each reading is `tick` seconds after the previous one."""

    def __init__(self, tick=1.0):
        self.t, self.tick = 0.0, tick

    def __call__(self):
        self.t += self.tick
        return self.t


@pytest.mark.learning
def test_masked_lm_accuracy_rises_on_two_towers(text, tmp_path):
    pre = new_pretrainer(text, micro=16)
    data = text_data(pre, text)
    before = pre.evaluate(data, 32, max_steps=4)
    pre.fit(data, str(tmp_path), Budget(num_train_steps=400, warmup_proportion=0.05), learning_rate=1e-2,
            log_every=50, verbose=False)
    after = pre.evaluate(data, 32, max_steps=4)
    assert before["masked_lm_accuracy"] < 0.1
    assert after["masked_lm_accuracy"] > 0.6, after
    assert after["masked_lm_loss"] < before["masked_lm_loss"] - 2.0


def test_accumulation_equals_one_larger_micro_batch(text, tmp_path):
    weights = []
    for micro in (8, 4):  # global batch 16 on 2 towers: 8 x 1 step, or 4 x 2 accumulated
        pre = new_pretrainer(text, micro=micro, precision="float32")  # bf16 rounding differs by batch shape
        pre.fit(text_data(pre, text), str(tmp_path / str(micro)), Budget(num_train_steps=2), train_batch_size=16,
                learning_rate=1e-3, verbose=False)
        assert pre.trainer.accum_steps == 8 // micro
        weights.append(checkpoints.encoder_weights(pre.model.backbone))
    for name, value in weights[0].items():
        np.testing.assert_allclose(weights[1][name], value, atol=2e-6, err_msg=name)


def test_resume_continues_from_saved_step_on_same_data(text, tmp_path):
    budget = Budget(num_train_steps=8, warmup_proportion=0.25)
    full = new_pretrainer(text)
    full.fit(text_data(full, text), str(tmp_path / "full"), budget, learning_rate=1e-3, log_every=1, verbose=False)
    first = new_pretrainer(text)
    first.fit(text_data(first, text), str(tmp_path / "cut"), budget, learning_rate=1e-3, log_every=1,
              verbose=False, steps=5)
    assert first.stop == "ran the 5 steps asked for"
    resumed = new_pretrainer(text)
    for v in resumed.model.weights:  # other weights: the checkpoint must replace them
        v.assign(np.full(v.shape, 0.5, v.dtype))
    resumed.fit(text_data(resumed, text), str(tmp_path / "cut"), budget, learning_rate=1e-3, log_every=1,
                verbose=False)
    assert [h["step"] for h in resumed.history] == [6, 7, 8]
    expected = {h["step"]: h["loss"] for h in full.history}
    for h in resumed.history:
        assert h["loss"] == pytest.approx(expected[h["step"]], abs=1e-5)
        assert h["learning_rate"] == pytest.approx(full.history[h["step"] - 1]["learning_rate"])


def test_time_based_learning_rate_shape():
    lr = lambda p, curve="linear": float(schedules.time_based_lr(p, 1e-3, 0.1, curve))  # noqa: E731
    assert lr(0.05) == pytest.approx(0.5e-3)
    assert lr(0.1) == pytest.approx(1e-3)
    assert lr(0.55) == pytest.approx(0.5e-3)
    assert lr(1.0) == 0.0 and lr(1.5) == 0.0
    exp = [lr(p, "exp") for p in (0.1, 0.3, 0.6, 1.0)]
    assert exp[0] == pytest.approx(1e-3) and exp[-1] == pytest.approx(0.0, abs=1e-9)
    assert exp[1] < 0.45e-3 and all(a > b for a, b in zip(exp, exp[1:]))  # faster than linear, monotone


def test_time_budget_fake_clock_warmup_markers_and_zero_at_end(text, tmp_path):
    pre = new_pretrainer(text)
    clock = FakeClock()
    budget = Budget(total_training_time=60 / 3600, lr_schedule="time", warmup_proportion=0.2,
                    finetune_time_markers=(0.5, 1.0))
    pre.fit(text_data(pre, text), str(tmp_path), budget, learning_rate=1e-3, log_every=1, clock=clock,
            verbose=False)
    assert pre.stop.startswith("time budget")
    lrs = np.array([h["learning_rate"] for h in pre.history])
    progress = np.array([h["progress"] for h in pre.history])
    # Warmup over the first 20% of the time, then down to 0 when the budget is spent.
    np.testing.assert_allclose(lrs, [float(schedules.time_based_lr(p, 1e-3, 0.2)) for p in progress],
                               rtol=1e-5, atol=1e-9)
    assert progress[0] < 0.1 and progress[-1] > 0.9 and (np.diff(progress) > 0).all()
    assert lrs.max() <= 1e-3 and lrs[0] < 0.2e-3 and lrs[-1] < 0.1e-3
    for marker in ("at_0.5", "at_1"):
        assert os.path.exists(os.path.join(tmp_path, "finetune_checkpoints", marker, "bert_mgpu.json"))


def test_early_stop_on_validation_loss(text, tmp_path):
    pre = new_pretrainer(text)
    data = text_data(pre, text)
    budget = Budget(num_train_steps=50, early_stop_time=0.0, early_stop_eval_loss=0.01)
    pre.fit(data, str(tmp_path), budget, validation=Validation(data, steps=3, max_steps=2), verbose=False)
    assert pre.stop.startswith("early stop") and int(pre.trainer.step.numpy()) == 3


def test_validation_is_denser_at_both_ends():
    v = Validation(None, epochs=1.0, begin_proportion=0.1, epochs_begin=0.25, end_proportion=0.2, epochs_end=0.5)
    spe = lambda: 100  # noqa: E731
    assert [v.interval(p, spe) for p in (0.05, 0.5, 0.85)] == [25, 100, 50]


def test_finetune_checkpoint_loads_in_classifier_and_pretrainer(text, tmp_path):
    pre = new_pretrainer(text, encoder_ln_mode="pre-ln")
    pre.fit(text_data(pre, text), str(tmp_path), Budget(num_train_steps=4, finetune_time_markers=(0.5, 1.0)),
            learning_rate=1e-3, verbose=False)
    marker = os.path.join(tmp_path, "finetune_checkpoints", "at_1")
    clf = bert_mgpu.BertClassifier.from_pretrained(marker, labels=["neg", "pos"], towers=pre.towers,
                                                   max_seq_length=32)
    want = checkpoints.encoder_weights(pre.model.backbone)
    got = checkpoints.encoder_weights(clf.model.backbone)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert all(layer.normalize_first for layer in clf.model.backbone.transformer_layers)  # pre-LN kept
    again = BertPretrainer.from_pretrained(marker, towers=pre.towers, nsp=False)
    for name, value in pretraining_model.head_weights(pre.model).items():
        np.testing.assert_array_equal(pretraining_model.head_weights(again.model)[name], value, err_msg=name)


def test_pre_ln_changes_the_computation():
    config = tiny_config(40)
    post, pre_ln = build_backbone(config), build_backbone(tiny_config(40, encoder_ln_mode="pre-ln"))
    # Kernels 10x their initial size, so that the sublayers move the residual stream: at the initial 0.02 the
    # two differed by 0.006-0.014 over 12 seeds, against 2.6-4.3 at 10x (NOTES item 65).
    weights = [w * 10 if w.ndim >= 2 else w for w in post.get_weights()]
    post.set_weights(weights)
    pre_ln.set_weights(weights)
    x = {"token_ids": np.array([[2, 11, 12, 3]]), "segment_ids": np.zeros((1, 4), "int32"),
         "padding_mask": np.ones((1, 4), bool)}
    a, b = post(x)["sequence_output"].numpy(), pre_ln(x)["sequence_output"].numpy()
    assert np.abs(a - b).max() > 1e-2
    with pytest.raises(bert_mgpu.UserError, match="encoder_ln_mode"):
        bert_mgpu.BertConfig.from_dict({"vocab_size": 40, "encoder_ln_mode": "sandwich"})


def test_google_release_heads_load_and_missing_heads_start_fresh(tmp_path, caplog):
    directory, weights = write_google_release(str(tmp_path / "with_heads"))
    config = tiny_config(len(open(os.path.join(directory, "vocab.txt")).read().split()))
    rng = np.random.default_rng(1)
    heads = {"cls/predictions/transform/dense/kernel": (32, 32), "cls/predictions/transform/dense/bias": (32,),
             "cls/predictions/transform/LayerNorm/gamma": (32,), "cls/predictions/transform/LayerNorm/beta": (32,),
             "cls/predictions/output_bias": (config.vocab_size,), "cls/seq_relationship/output_weights": (2, 32),
             "cls/seq_relationship/output_bias": (2,)}
    heads = {k: rng.normal(size=s).astype(np.float32) for k, s in heads.items()}
    checkpoints.write_google_checkpoint({**weights, **heads}, os.path.join(directory, "bert_model.ckpt"))
    towers = bert_mgpu.Towers(0, 2, 4)
    pre = BertPretrainer.from_pretrained(os.path.join(directory, "bert_model.ckpt"), towers=towers, nsp=True)
    got = pretraining_model.head_weights(pre.model)
    for name, value in heads.items():
        np.testing.assert_allclose(got[name], value, err_msg=name)
    bare, _ = write_google_release(str(tmp_path / "bare"))
    with caplog.at_level(logging.WARNING, logger="bert_mgpu"):
        BertPretrainer.from_pretrained(bare, towers=towers, nsp=True)
    assert "initialized fresh: cls/predictions/transform/dense/kernel" in caplog.text
    assert "cls/seq_relationship/output_weights" in caplog.text


def test_budget_stops_at_steps_time_or_early_exit_marker():
    b = Budget(num_train_steps=100, total_training_time=1.0, early_exit_time_marker=0.5)
    assert b.stop_reason(99, 1000.0) is None
    assert b.stop_reason(100, 0.0) == "reached 100 steps"
    assert b.stop_reason(10, 1800.0) == "early exit time marker of 0.5 h"  # half the budget: schedule of 1 h
    assert b.progress(10, 1800.0) == pytest.approx(0.5)
    assert Budget(total_training_time=1.0).stop_reason(3, 3600.0) == "time budget of 1.0 h spent"
    with pytest.raises(bert_mgpu.UserError, match="--lr_schedule=time needs --total_training_time"):
        Budget(num_train_steps=5, lr_schedule="time").check()


def test_hugging_face_pretraining_heads_give_its_logits(reference, tmp_path):
    """A transformers BertForPreTraining (safetensors) continues here with the same MLM and NSP outputs."""
    import torch
    import transformers

    tokens = write_vocab(str(tmp_path / "vocab.txt"))
    hf_config = transformers.BertConfig(vocab_size=len(tokens), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(hf_config).eval()
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    pre = BertPretrainer.from_pretrained(str(tmp_path), towers=bert_mgpu.Towers(0, 2, 4), precision="float32",
                                         nsp=True)
    ids = np.array([[2, 11, 4, 13, 14, 3, 15, 4, 3, 0]], np.int32)
    positions = np.array([[2, 7]], np.int32)
    ours = pre.model({"token_ids": ids, "segment_ids": (np.arange(10) > 5).astype(np.int32)[None],
                      "padding_mask": ids != 0, "mask_positions": positions})
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(ids != 0),
                 token_type_ids=torch.tensor((np.arange(10) > 5)[None], dtype=torch.long))
    np.testing.assert_allclose(ours["mlm_logits"].numpy()[0], out.prediction_logits.numpy()[0, [2, 7]], atol=1e-4)
    np.testing.assert_allclose(ours["nsp_logits"].numpy(), out.seq_relationship_logits.numpy(), atol=1e-4)


@pytest.mark.process
def test_sigterm_saves_where_it_stopped_and_the_rerun_finishes(text, tmp_path):
    import signal

    import tensorflow as tf

    class SignalClock(FakeClock):
        def __call__(self):
            t = super().__call__()
            if t == 12.0:  # a few steps in
                os.kill(os.getpid(), signal.SIGTERM)
            return t

    budget = Budget(num_train_steps=8, warmup_proportion=0.25)
    pre = new_pretrainer(text)
    pre.fit(text_data(pre, text), str(tmp_path), budget, learning_rate=1e-3, verbose=False, clock=SignalClock())
    assert pre.stop == "interrupted by SIGTERM; rerun to resume"
    stopped = int(pre.trainer.step.numpy())
    assert 1 <= stopped < 8 and tf.train.latest_checkpoint(str(tmp_path)).endswith(f"ckpt-{stopped}")
    again = new_pretrainer(text)
    again.fit(text_data(again, text), str(tmp_path), budget, learning_rate=1e-3, verbose=False)
    assert again.stop == "reached 8 steps" and int(again.trainer.step.numpy()) == 8



@pytest.mark.process
def test_auto_batch_size_picks_a_micro_batch_that_fits_and_divides(text, caplog, monkeypatch):
    from bert_mgpu.train import memory

    pre = new_pretrainer(text, micro=1)
    with caplog.at_level(logging.INFO, "bert_mgpu"):
        micro = pre.auto_batch_size(global_batch=24, max_seq_length=32, max_predictions_per_seq=6,
                                    memory_limit_mb=1e6)  # real trials; no limit: the cap (24 / 2 towers) fits
    assert micro == 12 and pre.micro_batch == 12
    assert "micro-batch 12 per tower (12 fits), 1 accumulation steps" in caplog.text
    trials = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auto batch size")][-1]
    assert "trials 1: " in trials and "12: " in trials
    monkeypatch.setattr(memory, "find_batch_size", lambda *a, **k: (5, []))  # say 5 fit: 12 = 3 x 4
    assert pre.auto_batch_size(24, 32, 6, memory_limit_mb=1.0) == 4 and pre.micro_batch == 4
    assert pre.towers.train_batch_size == 1  # the model's batch changed, not the devices'


@pytest.mark.parametrize("policy, tol", [("float32", 1e-5), ("mixed_bfloat16", 1e-2)])
def test_tied_head_matches_keras_hub_head_and_its_gradients(policy, tol):
    import keras_hub
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    table = keras_hub.layers.ReversibleEmbedding(50, 16, dtype=keras.DTypePolicy(policy))
    table.build((None,))
    kw = dict(vocabulary_size=50, token_embedding=table, intermediate_activation="gelu",
              layer_norm_epsilon=1e-12, dtype=keras.DTypePolicy(policy))
    ours, theirs = pretraining_model.TiedMaskedLMHead(**kw), keras_hub.layers.MaskedLMHead(**kw)
    hidden = tf.random.normal([3, 7, 16])
    positions = tf.constant([[0, 2, 6], [1, 1, 5], [3, 4, 0]])
    ours(hidden, mask_positions=positions), theirs(hidden, mask_positions=positions)  # build
    theirs.set_weights(ours.get_weights())
    results = []
    for head in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            logits = tf.cast(head(hidden, mask_positions=positions), tf.float32)
            loss = tf.reduce_sum(tf.sin(logits))
        results.append([logits] + tape.gradient(loss, [hidden, table.embeddings] + head.trainable_weights))
    assert results[0][0].shape == (3, 3, 50)
    assert float(tf.math.reduce_std(results[0][0])) > 0.1
    for a, b in zip(*results):
        a, b = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()
        np.testing.assert_allclose(a, b, atol=tol * max(1.0, np.abs(b).max()), rtol=tol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sparse_xent_matches_keras_cross_entropy_and_its_gradient(dtype):
    import tensorflow as tf

    rng = np.random.default_rng(4)
    logits = tf.cast(tf.constant(rng.normal(scale=3.0, size=(9, 61)).astype("float32")), dtype)
    labels = tf.constant(np.r_[0, 60, rng.integers(0, 61, 7)].astype("int32"))  # both ends of the vocabulary
    weights = tf.constant(rng.normal(size=9).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = kernels.sparse_xent(labels, logits)
        ref = keras.losses.sparse_categorical_crossentropy(labels, tf.cast(logits, tf.float32), from_logits=True)
        loss_ours, loss_ref = tf.reduce_sum(ours * weights), tf.reduce_sum(ref * weights)
    grad_ours, grad_ref = tape.gradient(loss_ours, logits), tape.gradient(loss_ref, logits)
    assert ours.dtype == tf.float32 and grad_ours.dtype == logits.dtype
    assert float(tf.reduce_min(ref)) > 0.01 and float(tf.reduce_max(tf.abs(grad_ref))) > 0.1
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tf.cast(grad_ours, tf.float32).numpy(), tf.cast(grad_ref, tf.float32).numpy(),
                               rtol=1e-6, atol=1e-6)


def test_recompute_trains_the_same_weights_with_accumulation(text, tmp_path):
    """--recompute in pretraining (the masked LM's last layer on its predicted positions only), inside the
    accumulation loop on two towers: the same weights as without it."""
    weights = []
    for recompute in (False, True):
        pre = new_pretrainer(text, micro=4, precision="float32")
        pre.fit(text_data(pre, text), str(tmp_path / str(recompute)), Budget(num_train_steps=2), train_batch_size=16,
                learning_rate=1e-3, verbose=False, recompute=recompute)
        from bert_mgpu.core import _compat
        from bert_mgpu.model.fused_encoder import FusedBertEncoder

        encoders = [layer for layer in _compat.sublayers(pre.model) if isinstance(layer, FusedBertEncoder)]
        assert encoders and all(e.recompute == recompute for e in encoders)
        weights.append(checkpoints.encoder_weights(pre.model.backbone))
    for name, value in weights[0].items():
        np.testing.assert_allclose(weights[1][name], value, atol=2e-6, err_msg=name)


def test_evaluation_with_a_tower_left_empty_by_the_last_batch(text):
    """9 sequences in batches of 8 on 2 towers: the last batch gives tower 1 no row, which crashed the masked-LM
    gather (issue 65, item 1). The 9th row counts once: the result is (8 x the first batch's + the 9th's) / 9."""
    import tensorflow as tf

    from bert_mgpu.train.training import Trainer

    pre = new_pretrainer(text)
    data = text_data(pre, text)
    trainer = Trainer(pre.towers.strategy, pre.model, loss_fn=pre.objective.loss)
    with data.reading():
        rows = list(data.dataset(8, training=False).unbatch().take(9))
    batches = lambda picked, size: tf.data.Dataset.from_tensor_slices(  # noqa: E731
        tf.nest.map_structure(lambda *t: tf.stack(t), *picked)).batch(size)
    every = trainer.evaluate(batches(rows, 8))
    first = trainer.evaluate(batches(rows[:8], 8))
    ninth = trainer.evaluate(batches([rows[8], rows[8]], 2))  # one on each tower: that row's numbers
    assert set(every) == set(first) and "mlm_loss" in every
    for key in every:
        assert every[key] == pytest.approx((8 * first[key] + ninth[key]) / 9, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "keras_hub"])
def test_the_masked_lm_head_gathers_its_positions_as_take_along_axis_does_with_no_integer_transpose(fused):
    """keras.ops.take_along_axis transposes the int64 positions, and oneDNN's graph pass then logs an error line
    on every run; the head's per-row gather takes the same rows, forward and backward."""
    import tensorflow as tf

    model = pretraining_model.build_pretrainer(tiny_config(40), nsp=False, fused=fused)
    rng = np.random.default_rng(0)
    inputs = {"token_ids": tf.constant(rng.integers(5, 40, (3, 12)), tf.int32),
              "segment_ids": tf.zeros((3, 12), tf.int32), "padding_mask": tf.ones((3, 12), tf.bool),
              "mask_positions": tf.constant(rng.integers(0, 12, (3, 4)), tf.int32)}
    head = next(layer for layer in model.layers if isinstance(layer, pretraining_model.TiedMaskedLMHead))
    hidden = tf.constant(rng.normal(size=(3, 12, 32)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(hidden)
        ours = head(hidden, mask_positions=inputs["mask_positions"])
        theirs = keras_hub.layers.MaskedLMHead.call(head, hidden, inputs["mask_positions"])
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours, hidden), tape.gradient(theirs, hidden), atol=1e-5)
    graph = tf.function(lambda x: model(x)).get_concrete_function(
        {k: tf.TensorSpec([None, None], v.dtype) for k, v in inputs.items()}).graph
    transposed = [op.get_attr("T") for op in graph.get_operations() if op.type == "Transpose"]
    assert tf.int64 not in transposed and tf.int32 not in transposed
