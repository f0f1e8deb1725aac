"""ELECTRA discriminators (issue 70 item 7): the fused encoder computes transformers' ElectraModel on the same
weights (narrower embeddings projected to the hidden width, no pooler); Hugging Face's layout, Google's TF1
layout (`electra/...`, beside the generator and the discriminator's head) and HFL's BERT-like config read as
one model; every head builds on it and takes the GPU run's step; a script fine-tunes one on 2 towers and
exports it under google-research/electra's names, and a tagger's hf export is transformers'
ElectraForTokenClassification."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import WORDS, tiny_config, write_vocab

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints, weight_names
from bert_mgpu.model import modeling
from bert_mgpu.model.fused_encoder import FusedBertEncoder

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def electra_config(vocab_size=60, **overrides):
    return tiny_config(vocab_size, model_type="electra", embedding_size=16, hidden_act="gelu", **overrides)


def features(batch=4, length=12, seed=0, vocab_size=60):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab_size, (batch, length)).astype(np.int32)
    mask = np.arange(length)[None, :] < rng.integers(3, length + 1, (batch, 1))
    ids[~mask] = 0
    segments = ((np.arange(length)[None, :] > length // 2) & mask).astype(np.int32)
    return {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}


def encoder(model):
    return next(layer for layer in model.layers if isinstance(layer, FusedBertEncoder))


def hf_electra(directory, discriminator_head=True):
    """transformers' ElectraForPreTraining (a discriminator, its head included) with random weights, saved as
    safetensors with a vocabulary: what HFL's and Google's releases are on the Hugging Face hub."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ElectraConfig(vocab_size=60, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    model = (transformers.ElectraForPreTraining if discriminator_head else transformers.ElectraModel)(config).eval()
    with torch.no_grad():  # away from the initialisation, so that every tensor matters
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(directory, safe_serialization=True)
    write_vocab(os.path.join(directory, "vocab.txt"), [f"w{i}" for i in range(50)])  # and 10 special tokens
    return model


def torch_outputs(model, batch):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(batch["token_ids"], dtype=torch.long),
                     token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["padding_mask"], dtype=torch.long))


def test_the_fused_encoder_computes_transformers_electra_on_the_same_weights(tmp_path, reference):
    """ElectraForPreTraining's discriminator read from its safetensors: the fused encoder's sequence output is
    transformers' last hidden state to 1e-4 (padding excluded), its pooled output is [CLS]'s row (no pooler, as
    google-research/electra fine-tunes), and the discriminator's head is left over as a head."""
    theirs = hf_electra(str(tmp_path))
    pre = checkpoints.load_pretrained(str(tmp_path))
    assert (pre.config.model_type, pre.config.embedding_size, pre.config.hidden_size) == ("electra", 16, 32)
    model = modeling.build_tagger(pre.config, 3)
    heads = checkpoints.assign_encoder(model.backbone, pre.weights, str(tmp_path))
    assert heads == sorted(n for n in pre.weights if n.startswith("discriminator_predictions/")) and len(heads) == 4
    assert model.backbone.embeddings_projection.kernel.shape == (16, 32)
    batch = features()
    ours = encoder(model)(batch)
    expected = torch_outputs(theirs.electra, batch).last_hidden_state.numpy()
    sequence = ours["sequence_output"].numpy()
    difference = np.abs(sequence - expected)[batch["padding_mask"]].max()
    print(f"largest difference to transformers' ElectraModel {difference:.2e} (outputs up to "
          f"{np.abs(expected).max():.2f})")
    assert difference < 1e-4
    np.testing.assert_array_equal(ours["pooled_output"].numpy(), sequence[:, 0])


def family_release(directory, config_of, weights=None, seed=0, words=WORDS, heads=lambda vocab, rng: {}):
    """A Google TF1 release of the family `config_of(vocab_size)` gives: `weights` ({google-bert name: array}; by
    default random ones) under the family's own names, `heads(vocab_size, rng)` beside them, and its config's
    keys as the release writes them (no model_type, which Google's configs lack)."""
    os.makedirs(directory, exist_ok=True)
    tokens = write_vocab(os.path.join(directory, "vocab.txt"), words)
    config = config_of(len(tokens))
    if weights is None:
        keras.utils.set_random_seed(seed)
        weights = checkpoints.encoder_weights(modeling.build_backbone(config))
    on_disk = weight_names.to_family(weights, config.model_type, config.inner_group_num)
    on_disk.update(heads(len(tokens), np.random.default_rng(seed)))
    release_config = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "encoder_ln_mode")}
    with open(os.path.join(directory, "bert_config.json"), "w") as f:
        json.dump(release_config, f)
    checkpoints.write_google_checkpoint(on_disk, os.path.join(directory, "bert_model.ckpt"))
    return directory, weights


def google_electra_release(directory, hf_weights=None, seed=0, words=WORDS):
    """A Google TF1 ELECTRA release as google-research/electra writes its pretraining checkpoint (the
    discriminator under `electra/`, its head, a generator beside it) with HFL's BERT-like config (no model_type,
    `embedding_size`), `hf_weights` ({Google name: array}) or random weights."""
    def heads(vocab, rng):
        return {"discriminator_predictions/dense/kernel": rng.normal(size=(32, 32)).astype(np.float32),
                "generator/encoder/layer_0/output/dense/kernel": rng.normal(size=(16, 8)).astype(np.float32),
                "generator_predictions/output_bias": rng.normal(size=(vocab,)).astype(np.float32)}
    return family_release(directory, electra_config, hf_weights, seed, words, heads)


def test_googles_tf1_layout_and_hfls_config_read_as_the_hugging_face_model(tmp_path, reference):
    hf_electra(str(tmp_path / "hf"))
    from_hf = checkpoints.load_pretrained(str(tmp_path / "hf"))
    encoder_only = {k: v for k, v in from_hf.weights.items() if k.startswith("bert/")}
    google, _ = google_electra_release(str(tmp_path / "google"), encoder_only, words=[f"w{i}" for i in range(50)])
    from_google = checkpoints.load_pretrained(google)
    assert from_google.config == from_hf.config
    model = modeling.build_classifier(from_google.config, 2)
    heads = checkpoints.assign_encoder(model.backbone, from_google.weights, google)
    assert heads == ["discriminator_predictions/dense/kernel", "generator/encoder/layer_0/output/dense/kernel",
                     "generator_predictions/output_bias"]
    np.testing.assert_equal(checkpoints.encoder_weights(model.backbone), encoder_only)
    # A config that says BERT over an ELECTRA's names, and ELECTRA's pooler-less weights in a BERT: one line each.
    with open(os.path.join(google, "bert_config.json"), "w") as f:
        json.dump({**tiny_config(60).to_dict(), "model_type": "bert"}, f)
    bert = modeling.build_classifier(tiny_config(60), 2)
    with pytest.raises(UserError, match="missing: bert/pooler/dense/kernel; bert/pooler/dense/bias"):
        checkpoints.assign_encoder(bert.backbone, {k: v for k, v in from_hf.weights.items()
                                                   if "embeddings_project" not in k}, "hf")


def gpu_step(build, batch, labels, loss):
    """One step of `build()` on the GPU run's strategy (NCCL, mixed_float16, 2 towers) -> (trainer, before)."""
    from test_allreduce import gpu_strategy

    from bert_mgpu.train import optimization, training

    _, strategy = gpu_strategy()
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = build()
        opt = optimization.create_optimizer(1e-2, 10, 0, float16=True)
    before = {v.path: v.numpy().copy() for v in model.weights}
    trainer = training.Trainer(strategy, model, opt, loss_fn=loss, bytes_per_pack=2**14)
    batches = trainer.training_batches(tf.data.Dataset.from_tensors((batch, labels)))
    losses = trainer.train_step(next(batches))
    return trainer, before, losses


@pytest.mark.parametrize("head", ["classifier", "tagger", "span", "choice"])
def test_every_head_takes_the_gpu_step_on_electra(head):
    """Each head's model on an ELECTRA (embeddings 16 wide, hidden 32), one mixed_float16 step on the NCCL
    strategy: the collectives carry every trainable element (the projection's, not the unused pooler's) in
    NCCL all-reduces; the step moves every trained variable and not the pooler; both towers stay bit-equal."""
    from test_allreduce import collectives

    from bert_mgpu.model.choice_objectives import MultipleChoice
    from bert_mgpu.model.objectives import Classification
    from bert_mgpu.model.span_objectives import SpanExtraction
    from bert_mgpu.model.tagging_objectives import TokenClassification

    config = electra_config()
    batch = features(8)
    setups = {
        "classifier": (lambda: modeling.build_classifier(config, 3, "mixed_float16"), np.arange(8) % 3,
                       Classification().loss),
        "tagger": (lambda: modeling.build_tagger(config, 3, "mixed_float16"),
                   np.where(batch["padding_mask"], np.arange(12)[None] % 3, -1), TokenClassification().loss),
        "span": (lambda: modeling.build_span_model(config, "mixed_float16"), np.stack([np.arange(8) % 3 + 1] * 2, 1),
                 SpanExtraction().loss),
        "choice": (lambda: modeling.build_choice_model(config, "mixed_float16"), np.arange(4) % 2,
                   MultipleChoice().loss),
    }
    build, labels, loss = setups[head]
    if head == "choice":
        batch = {k: np.stack([v[:4], v[4:]], axis=1) for k, v in batch.items()}
    trainer, before, losses = gpu_step(build, batch, labels.astype(np.int32), loss)
    model = trainer.model
    trained = {v.path for v in model.trainable_variables}
    assert "embeddings_projection/kernel" in trained and not any(p.startswith("pooled_dense") for p in trained)
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"}
    assert sum(n for _, _, n in sent) == sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    moved = {v.path for v in model.weights if not np.array_equal(v.numpy(), before[v.path])}
    assert np.isfinite(np.asarray(losses[0])).all()
    # A choice head's bias adds the same to every choice, and a softmax over them cancels it: its gradient is 0
    # (round-off moved it with oneDNN on, not with it off).
    still = {"classifier/bias"} if head == "choice" else set()
    assert trained - still <= moved and not any(p.startswith("pooled_dense") for p in moved)
    for v in model.trainable_variables:
        x, y = trainer.strategy.experimental_local_results(v.value)
        assert np.array_equal(x.numpy(), y.numpy()), v.path


def test_layerwise_decay_gives_the_projection_the_embeddings_rate():
    from bert_mgpu.train import optimization

    model = modeling.build_classifier(electra_config(), 2)
    paths = [v.path for v in model.trainable_variables]
    rates = dict(zip(paths, optimization.layerwise_rates(paths, 0.5)))
    assert rates["embeddings_projection/kernel"] == rates["token_embedding/embeddings"] == 0.5 ** 3
    assert rates["transformer_layer_0/feedforward_output_dense/kernel"] == 0.5 ** 2
    assert rates["classifier/kernel"] == 1.0


def test_the_unfused_reference_pools_cls_as_the_fused_encoder():
    """--fused_encoder=false (and the graph exports) run keras-hub's layers in ELECTRA's order and pool [CLS]'s
    row: the same logits as the fused classifier on the same weights, to 1e-5."""
    keras.utils.set_random_seed(5)
    fused = modeling.build_classifier(electra_config(), 3)
    reference = modeling.build_classifier(electra_config(), 3, fused=False)
    weights = {v.path: v for v in fused.weights}
    for v in reference.weights:
        v.assign(weights[v.path])
    fused.head.kernel.assign(np.random.default_rng(0).normal(size=fused.head.kernel.shape))
    reference.head.kernel.assign(fused.head.kernel)
    batch = features()
    np.testing.assert_allclose(reference(batch).numpy(), fused(batch).numpy(), atol=1e-5)


def test_what_electra_cannot_do_is_refused_in_one_line(tmp_path):
    import bert_mgpu
    from bert_mgpu.model.pretraining_model import build_pretrainer

    release, _ = google_electra_release(str(tmp_path / "release"))
    clf = bert_mgpu.BertClassifier.from_pretrained(release, labels=["a", "b"], max_seq_length=16)
    with pytest.raises(UserError, match="keras_hub: an ELECTRA model is written as saved_model, onnx, tflite"):
        clf.export(str(tmp_path / "kh"), "keras_hub")
    with pytest.raises(UserError, match="hf: transformers has no ELECTRA class with this classifier's head"):
        clf.export(str(tmp_path / "hf"), "hf")
    assert not os.path.exists(tmp_path / "kh") and not os.path.exists(tmp_path / "hf")

    with pytest.raises(UserError, match="an ELECTRA is fine-tuned here"):
        build_pretrainer(electra_config())
    with pytest.raises(UserError, match="embedding_size=16 differs from hidden_size=32, which only ELECTRA and ALBERT"):
        tiny_config(60, embedding_size=16, model_type="bert").validate()


def test_a_script_refuses_an_export_only_the_model_rules_out_before_training(sentiment_data, tmp_path):
    """--export_format=saved_model,hf on an ELECTRA classifier: transformers has no class for its head, which
    only the model says (the flags cannot). Refused in one line before any step, nothing written; it used
    to train the whole run first."""
    from conftest import run_script

    release, _ = google_electra_release(str(tmp_path / "release"))
    out = tmp_path / "run"
    proc = run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={sentiment_data}",
                      f"--init_checkpoint={release}", f"--output_dir={out}", "--n_gpus=0", "--max_seq_length=32",
                      "--do_train", "--do_export", "--export_format=saved_model,hf", check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        "run_classifier_mgpu.py: error: --export_format=hf: transformers has no ELECTRA class with this "
        "classifier's head (its ElectraFor... heads add a dense layer); export saved_model, onnx or google")
    assert not any(name.startswith(("ckpt", "checkpoint")) for name in os.listdir(out)), os.listdir(out)
    assert os.listdir(out / "export") == []  # checked writable at the start; no format in it


def test_a_script_fine_tunes_an_electra_release_on_two_towers_and_exports_it(sentiment_data, tmp_path):
    """run_classifier_mgpu.py from a Google-layout ELECTRA release, 2 towers, trains and evaluates;
    the google export holds google-research/electra's names (no pooler, the projection) with a config that
    says ELECTRA, and reads back as the run's model: evaluating it repeats the run's evaluation."""
    from conftest import run_script

    release, initial = google_electra_release(str(tmp_path / "release"))
    common = ["--task_name=tsv", f"--data_dir={sentiment_data}", f"--init_checkpoint={release}", "--n_gpus=0",
              "--towers_per_gpu=2", "--train_batch_size=8", "--eval_batch_size=8", "--max_seq_length=32",
              "--precision=float32"]
    out = tmp_path / "run"
    run_script("run_classifier_mgpu.py", *common, f"--output_dir={out}", "--do_train", "--do_eval",
               "--num_train_epochs=2", "--learning_rate=1e-3", "--do_export", "--export_format=google")
    results = dict(line.split(" = ") for line in open(out / "eval_results.txt").read().splitlines())
    assert 0.0 <= float(results["eval_accuracy"]) <= 1.0 and np.isfinite(float(results["eval_loss"]))
    trained = checkpoints.load_pretrained(str(out))
    assert trained.config.model_type == "electra"
    moved = [n for n in initial if not np.array_equal(trained.weights[n], initial[n])]
    assert "bert/embeddings_project/kernel" in moved and len(moved) > len(initial) // 2
    exported = checkpoints.read_tf_checkpoint(str(out / "export" / "google" / "bert_model.ckpt"))
    assert "electra/embeddings_project/kernel" in exported and not any(n.startswith("bert/") for n in exported)
    assert not any("pooler" in n for n in exported) and "output_weights" in exported
    config = json.load(open(out / "export" / "google" / "bert_config.json"))
    assert (config["model_type"], config["embedding_size"]) == ("electra", 16)
    again = tmp_path / "again"
    run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={sentiment_data}",
               f"--init_checkpoint={out / 'export' / 'google'}", f"--output_dir={again}", "--n_gpus=0",
               "--eval_batch_size=8", "--max_seq_length=32", "--precision=float32", "--do_eval")
    repeated = dict(line.split(" = ") for line in open(again / "eval_results.txt").read().splitlines())
    assert float(repeated["eval_loss"]) == pytest.approx(float(results["eval_loss"]), abs=1e-6)
    assert repeated["eval_accuracy"] == results["eval_accuracy"]


@pytest.mark.parametrize("head", ["tagger", "question_answerer"])
def test_the_hf_export_of_a_token_head_is_transformers_electra_class(tmp_path, reference, head):
    """A tagger (a question answerer) on an ELECTRA release, exported as hf: transformers'
    ElectraForTokenClassification (ElectraForQuestionAnswering) reads it with no missing or unexpected tensor and
    gives the model's logits to 1e-4."""
    import transformers

    import bert_mgpu

    hf_electra(str(tmp_path / "release"), discriminator_head=False)
    if head == "tagger":
        ours = bert_mgpu.BertTagger.from_pretrained(str(tmp_path / "release"), labels=["O", "B-X", "I-X"],
                                                    precision="float32", max_seq_length=16)
        reader = transformers.ElectraForTokenClassification
    else:
        ours = bert_mgpu.BertQuestionAnswerer.from_pretrained(str(tmp_path / "release"), precision="float32",
                                                              max_seq_length=16)
        reader = transformers.ElectraForQuestionAnswering
    ours.export(str(tmp_path / "hf"), "hf")
    theirs, info = reader.from_pretrained(str(tmp_path / "hf"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = features(3, 12)
    expected = ours.model(batch).numpy()
    got = torch_outputs(theirs.eval(), batch)
    got = got.logits.numpy() if head == "tagger" else np.stack([got.start_logits.numpy(), got.end_logits.numpy()], -1)
    difference = np.abs(got - expected)[batch["padding_mask"]].max()
    print(f"largest logit difference to {reader.__name__} {difference:.2e}")
    assert difference < 1e-4
