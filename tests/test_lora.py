"""LoRA on the fused encoder (issue 70 item 6): the same weights and adapters give PEFT's outputs on
transformers' BertForSequenceClassification to 1e-4; enabling freezes the encoder and trains the adapters and the
head alone; a checkpoint holding adapters reads back as one ordinary BERT with them folded in; a step on the GPU
run's strategy (NCCL, mixed_float16) all-reduces the adapters' and the head's gradients only, and 2 towers take
the 1-tower step."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import hf_state, sentiment_rows, tiny_config

from bert_mgpu.core.errors import UserError
from bert_mgpu.model import lora, modeling

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def classifier(fused=True, policy="float32", strategy=None, seed=1, dropout=0.0):
    keras.utils.set_random_seed(seed)
    config = tiny_config(60, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, hidden_act="gelu")
    with (strategy or tf.distribute.get_strategy()).scope():
        return config, modeling.build_classifier(config, 3, policy, fused=fused)


def features(batch=4, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 60, (batch, length)).astype(np.int32)
    mask = np.arange(length)[None, :] < rng.integers(3, length + 1, (batch, 1))
    ids[~mask] = 0
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}


def randomize_b(model, seed=2):
    """B starts at 0 (the adapted model computes what it did); tests give it values to see the adapters act."""
    rng = np.random.default_rng(seed)
    for name, v in lora.adapters(model).named_variables().items():
        if name.endswith("/lora_b"):
            v.assign(rng.normal(scale=0.5, size=v.shape).astype(np.float32))


def test_the_adapted_model_gives_peft_s_outputs_on_the_same_weights(reference):
    """transformers' BertForSequenceClassification with PEFT's LoRA (r 4, alpha 12, query, value and the
    intermediate dense), its A and B set to ours (torch keeps A [r, in] and B [out, r]): logits to 1e-4. PEFT
    counts the trainable parameters as we do (the adapters and the classifier; PEFT's SEQ_CLS task keeps its
    classifier trainable, and its pooler frozen, as ours)."""
    import peft
    import torch
    import transformers

    config, model = classifier()
    batch = features()
    before = model(batch).numpy()
    spec = lora.check_lora(4, 12, ("query", "value", "intermediate"))
    lora.enable(model, spec)
    np.testing.assert_array_equal(model(batch).numpy(), before)  # B = 0
    randomize_b(model)
    ours = model(batch).numpy()
    assert np.abs(ours - before).max() > 0.1 * np.abs(before).max()  # the adapters moved the outputs

    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "encoder_ln_mode"},
                                        num_labels=3, layer_norm_eps=1e-12)
    theirs = transformers.BertForSequenceClassification(hf_config).eval()
    state = {k: torch.tensor(v) for k, v in hf_state(model).items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    theirs = peft.get_peft_model(theirs, peft.LoraConfig(
        task_type=peft.TaskType.SEQ_CLS, r=4, lora_alpha=12, lora_dropout=0.0,
        target_modules=["query", "value", "intermediate.dense"]))
    hf_targets = {"query": "attention.self.query", "value": "attention.self.value",
                  "intermediate": "intermediate.dense"}
    named = lora.adapters(model).named_variables()
    with torch.no_grad():
        for i in range(config.num_hidden_layers):
            for target, module in hf_targets.items():
                m = theirs.base_model.model.bert.encoder.layer[i].get_submodule(module)
                prefix = f"bert/encoder/layer_{i}/{lora.TARGETS[target]}"
                m.lora_A["default"].weight.copy_(torch.tensor(named[f"{prefix}/lora_a"].numpy().T))
                m.lora_B["default"].weight.copy_(torch.tensor(named[f"{prefix}/lora_b"].numpy().T))
        got = theirs(input_ids=torch.tensor(batch["token_ids"], dtype=torch.long),
                     token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["padding_mask"], dtype=torch.long)).logits.numpy()
    difference = np.abs(got - ours).max()
    print(f"largest logit difference to PEFT {difference:.2e}")
    assert difference < 1e-4
    peft_trained, peft_total = theirs.get_nb_trainable_parameters()
    trained, total = lora.trainable_counts(model)
    # 2 layers x rank 4 x (in + out) of query, value and intermediate (64 wide), and the 3-label classifier
    assert trained == peft_trained == 2 * 4 * ((32 + 32) + (32 + 32) + (32 + 64)) + (32 * 3 + 3)
    assert total == peft_total - (32 * 3 + 3)  # PEFT keeps the original classifier beside its trained copy


def lora_steps(strategy, policy, steps=3):
    """A classifier with rank-2 adapters on query and value, `steps` steps on one batch of 8 on `strategy`
    -> (trainer, weights before, losses)."""
    from bert_mgpu.model.objectives import Classification
    from bert_mgpu.train import optimization, training

    _, model = classifier(policy=policy, strategy=strategy)
    with strategy.scope():
        lora.enable(model, lora.check_lora(2, 4.0))
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=policy == "mixed_float16")
    before = {v.path: v.numpy().copy() for v in model.weights}
    trainer = training.Trainer(strategy, model, opt, loss_fn=Classification().loss, bytes_per_pack=2**14)
    batch = (features(8), np.arange(8, dtype=np.int32) % 3)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors(batch).repeat(steps))
    return trainer, before, [trainer.train_step(next(batches))[0] for _ in range(steps)]


def test_the_gpu_step_all_reduces_and_moves_the_adapters_and_the_head_alone():
    """NCCL collectives, mixed_float16, 2 towers: the encoder is frozen (not trained, not all-reduced: the
    collectives carry exactly the adapters' and the head's elements); a step moves those alone; both towers'
    variables stay bit-equal."""
    from test_allreduce import collectives, gpu_strategy

    _, strategy = gpu_strategy()
    trainer, before, losses = lora_steps(strategy, "mixed_float16", steps=1)
    model = trainer.model
    named = lora.adapters(model).named_variables()
    trained = {v.path for n, v in named.items() if n != lora.SCALE_NAME} | {"classifier/kernel", "classifier/bias"}
    assert {v.path for v in model.trainable_variables} == trained
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"}
    assert sum(n for _, _, n in sent) == lora.trainable_counts(model)[0] == 2 * 2 * 2 * (32 + 32) + 32 * 3 + 3
    moved = {v.path for v in model.weights if not np.array_equal(v.numpy(), before[v.path])}
    # B and the head by their gradients, A by AdamW's weight decay alone (its first gradient is B's zero times
    # the input); of the encoder nothing, of the model only the dropout seed's state besides.
    assert np.isfinite(losses).all() and moved - {"fused_encoder/dropout_seed/seed_generator_state"} == trained
    for v in model.trainable_variables:
        x, y = strategy.experimental_local_results(v.value)
        assert np.array_equal(x.numpy(), y.numpy()), v.path


def test_two_towers_of_the_gpu_run_take_the_one_tower_step():
    """float32 on the NCCL strategy: each tower's half of the batch gives the 1-tower adapters and head to 1e-6
    over 3 steps."""
    from test_allreduce import gpu_strategy

    from bert_mgpu.parallel import devices, distribute

    one, _, one_losses = lora_steps(distribute.make_strategy(devices.plan_devices(0, 1, ())), "float32")
    two, _, two_losses = lora_steps(gpu_strategy()[1], "float32")
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-6)
    assert one_losses[0] != one_losses[2]
    for a, b in zip(one.model.trainable_variables, two.model.trainable_variables):
        assert a.path == b.path
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-6, err_msg=a.path)


def test_a_checkpoint_with_adapters_reads_back_folded_and_merge_keeps_the_outputs(tmp_path):
    from bert_mgpu.io import checkpoints, run_checkpoint, weight_names

    _, model = classifier()
    lora.enable(model, lora.check_lora(2, 5.0, ("query", "attention_output", "output")))
    randomize_b(model)
    batch = features()
    adapted = model(batch).numpy()
    prefix = run_checkpoint.training_checkpoint(model).write(str(tmp_path / "ckpt"))
    read = checkpoints.read_tf_checkpoint(prefix, only="encoder/")
    names = {k: k.split("/", 1)[1][: -len("/.ATTRIBUTES/VARIABLE_VALUE")].replace(".S", "/") for k in read}
    weights = {names[k]: weight_names.fold_to_google_shape(names[k], v) for k, v in read.items()}
    assert lora.SCALE_NAME in weights and float(weights[lora.SCALE_NAME]) == 2.5
    folded = lora.fold(weights)
    assert not any("lora" in k for k in folded)
    _, plain = classifier(seed=7)
    checkpoints.assign_encoder(plain.backbone, folded, "test")
    plain.head.set_weights(model.head.get_weights())
    np.testing.assert_allclose(plain(batch).numpy(), adapted, atol=1e-5)

    lora.merge(model)
    np.testing.assert_allclose(model(batch).numpy(), adapted, atol=1e-5)
    assert all(not v.numpy().any() for n, v in lora.adapters(model).named_variables().items()
               if n.endswith("/lora_b"))
    for name, value in checkpoints.encoder_weights(model.backbone).items():
        np.testing.assert_allclose(value, folded[name], atol=1e-6, err_msg=name)


def test_bad_settings_and_keras_hubs_layers_are_refused_in_one_line():
    for args, message in [((0,), None), ((-1,), "--lora_rank=-1"), ((2.5,), "--lora_rank=2.5"),
                          ((2, 0.0), "--lora_alpha=0.0"), ((2, None, ("query", "query")), "--lora_targets"),
                          ((2, None, ("dense",)), "--lora_targets=dense")]:
        if message is None:
            assert lora.check_lora(*args) is None
            continue
        with pytest.raises(UserError, match=message):
            lora.check_lora(*args)
    assert lora.check_lora(4, None, "query,key").alpha == 4.0
    _, plain = classifier(fused=False)
    with pytest.raises(UserError, match="--fused_encoder"):
        lora.enable(plain, lora.check_lora(2))
    _, model = classifier()
    lora.enable(model, lora.check_lora(2))
    lora.enable(model, lora.check_lora(2))  # the same again: nothing
    with pytest.raises(UserError, match="other LoRA adapters"):
        lora.enable(model, lora.check_lora(4))


def transformers_model(directory):
    import transformers

    return transformers.AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()


def peft_over_release(release, adapter, scratch):
    """PEFT's model of `adapter` over `release` (a Google checkpoint, exported as transformers reads it)."""
    import peft

    import bert_mgpu

    bert_mgpu.export_model(release, str(scratch), format="hf")
    import transformers

    base = transformers.BertForSequenceClassification.from_pretrained(str(scratch), num_labels=2)
    return peft.PeftModel.from_pretrained(base, str(adapter)).eval()


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.ones_like(torch.tensor(ids))).logits.numpy()


def test_a_script_run_with_lora_trains_the_adapters_and_ends_as_one_bert(sentiment_data, google_release, tmp_path,
                                                                         reference):
    """run_classifier_mgpu.py --lora_rank=4 on 2 towers, best model loaded at the end, exported as hf: the
    summary counts the trained parameters; the settings record the adapters; what the adapters did not touch
    (keys, embeddings, LayerNorms, pooler) is the release's bit for bit in the last checkpoint and in best/ read
    as weights; the targets moved; the last checkpoint's B is zero (the adapters are added in); best/ and the
    export, read as weights, are the model the run evaluated (its eval results repeat from best/); PEFT reads the
    adapters kept apart (peft_adapter/) over the release and computes the exported model's logits."""
    import json
    import re

    from conftest import run_script
    from safetensors.numpy import load_file

    from bert_mgpu.io import checkpoints, weight_names

    out = tmp_path / "run"
    proc = run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={sentiment_data}",
                      f"--init_checkpoint={google_release}", f"--output_dir={out}", "--n_gpus=0",
                      "--towers_per_gpu=2", "--train_batch_size=8", "--eval_batch_size=8", "--max_seq_length=32",
                      "--precision=float32", "--do_train", "--do_eval", "--num_train_epochs=2",
                      "--learning_rate=1e-2", "--lora_rank=4", "--lora_alpha=32", "--lora_targets=query,value,output",
                      "--evaluation_strategy=epoch", "--load_best_model_at_end", "--do_export", "--export_format=hf")
    block = proc.stdout[proc.stdout.index("== run_classifier_mgpu.py =="):]
    release = checkpoints.load_pretrained(google_release).weights
    config = checkpoints.load_pretrained(google_release).config
    h, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    trained = layers * 4 * ((h + h) + (h + h) + (inner + h)) + (h * 2 + 2)
    total = sum(v.size for v in release.values() if not v.dtype.kind == "i") + layers * 4 * (5 * h + inner) \
        + h * 2 + 2
    match = re.search(r"trained parameters\s+([\d,]+) of ([\d,]+)", block)
    assert match and (int(match[1].replace(",", "")), int(match[2].replace(",", ""))) == (trained, total), block
    settings = json.load(open(out / "bert_mgpu.json"))["settings"]
    assert (settings["lora_rank"], settings["lora_alpha"], settings["lora_targets"]) == (4, 32.0,
                                                                                          ["query", "value", "output"])
    targets = re.compile(r"bert/encoder/layer_\d+/(attention/self/(query|value)|output/dense)/kernel")
    last = checkpoints.read_tf_checkpoint(str(out / "ckpt-8"), only="encoder/")
    adapters = {k: v for k, v in last.items() if "lora_b" in k}
    assert len(adapters) == 3 * layers and not any(v.any() for v in adapters.values())
    for path in (out, out / "best"):
        weights = checkpoints.load_pretrained(str(path)).weights
        assert not any("lora" in k for k in weights)
        for name, value in release.items():
            if name.startswith("bert/"):
                moved = not np.array_equal(weights[name], value)
                assert moved == bool(targets.fullmatch(name)), (path, name)
    best = checkpoints.load_pretrained(str(out / "best")).weights
    exported = load_file(str(out / "export" / "hf" / "model.safetensors"))
    for name, value in best.items():
        hf, transpose = weight_names.google_to_hf_name(name)
        if hf in exported:
            np.testing.assert_allclose(exported[hf].T if transpose else exported[hf], value, atol=1e-6,
                                       err_msg=name)
    assert weight_names.google_to_hf_name("bert/encoder/layer_0/attention/self/query/kernel")[0] in exported
    # The adapters kept apart in PEFT's layout, over the release as transformers reads it, are the exported model.
    peft_model = peft_over_release(google_release, out / "peft_adapter", tmp_path / "base")
    merged = transformers_model(out / "export" / "hf")
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (3, 9))
    difference = np.abs(logits(peft_model, ids) - logits(merged, ids)).max()
    print(f"largest difference of PEFT over the release to the exported model {difference:.2e}")
    assert difference < 1e-4
    import torch

    with torch.no_grad():  # and the adapters are what makes them: without B, PEFT's logits move
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.zero_()
    assert np.abs(logits(peft_model, ids) - logits(merged, ids)).max() > 10 * 1e-4
    # The run's evaluation (of the best model, loaded at its end) repeats from best/ read as an ordinary BERT.
    again = tmp_path / "again"
    run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={sentiment_data}",
               f"--init_checkpoint={out / 'best'}", f"--output_dir={again}", "--n_gpus=0", "--towers_per_gpu=2",
               "--eval_batch_size=8", "--max_seq_length=32", "--precision=float32", "--do_eval")

    def results(path):
        return dict(line.split(" = ") for line in open(path / "eval_results.txt").read().splitlines())
    first, second = results(out), results(again)
    assert float(second["eval_loss"]) == pytest.approx(float(first["eval_loss"]), abs=1e-6)
    assert second["eval_accuracy"] == first["eval_accuracy"]


@pytest.mark.parametrize("head", ["tagger", "crf_tagger", "span", "choice"])
def test_every_heads_model_takes_the_adapters(head):
    """The tagger (with and without a CRF), the span model and the multiple-choice model have the fused encoder
    too: enabled adapters start as a no-op, then change the outputs; only adapters and the head train."""
    keras.utils.set_random_seed(4)
    config = tiny_config(60)
    model = {"tagger": lambda: modeling.build_tagger(config, 5),
             "crf_tagger": lambda: modeling.build_tagger(config, 5, crf=True),
             "span": lambda: modeling.build_span_model(config),
             "choice": lambda: modeling.build_choice_model(config)}[head]()
    batch = features(4, 10)
    if head == "choice":
        batch = {k: np.stack([v, v[::-1]], axis=1) for k, v in batch.items()}  # [batch, 2 choices, length]

    def outputs():
        got = model(batch, training=False)
        return np.concatenate([np.ravel(t) for t in (got.values() if isinstance(got, dict) else [got])])
    before = outputs()
    lora.enable(model, lora.check_lora(2))
    np.testing.assert_array_equal(outputs(), before)
    randomize_b(model)
    assert np.abs(outputs() - before).max() > 1e-4
    assert not any(v.path.startswith(("transformer_layer", "token_embedding", "pooled_dense"))
                   and "lora" not in v.path for v in model.trainable_variables)
    assert any("lora" in v.path for v in model.trainable_variables)


def test_layerwise_decay_gives_each_layers_adapters_that_layers_rate():
    from bert_mgpu.train import optimization

    _, model = classifier()
    lora.enable(model, lora.check_lora(2))
    paths = [v.path for v in model.trainable_variables]
    rates = dict(zip(paths, optimization.layerwise_rates(paths, 0.5)))
    assert rates == {**{p: 0.5 ** (2 - int(p.split("_")[2].split("/")[0])) for p in paths if "lora" in p},
                     "classifier/kernel": 1.0, "classifier/bias": 1.0}
    assert {rates[p] for p in paths if "lora" in p} == {0.25, 0.5}


def test_a_fit_without_adapters_after_one_with_them_counts_no_adapters(google_release, tmp_path):
    """`trained_parameters` (the summary's "trained parameters" line) is the last fit's: a fit with LoRA then
    one without (the adapters merged in) trains every weight, and says so by None."""
    import bert_mgpu

    rows = [bert_mgpu.Example(str(i), text, label=label) for i, (label, text) in enumerate(sentiment_rows(16, 1))]
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], bert_mgpu.Towers(
        n_gpus=0, towers_per_gpu=2, train_batch_size=8), "float32", max_seq_length=16)
    clf.fit(rows, str(tmp_path / "lora"), epochs=1, lora_rank=2, verbose=False)
    trained, total = clf.trained_parameters
    assert 0 < trained < total
    clf.fit(rows, str(tmp_path / "full"), epochs=1, verbose=False)
    assert clf.trained_parameters is None and clf.global_step == 1
