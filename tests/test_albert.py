"""ALBERT (issue 70 item 7): the fused encoder and the unfused reference compute transformers' AlbertModel on the
same weights (factorized embeddings, layers shared in groups, inner groups of more than one layer); Hugging Face's
layout (AlbertModel alone, AlbertForPreTraining with its heads) and Google's TF1 layout (bert/encoder/transformer/
group_G/inner_group_J/) read as one model; a step on the GPU run's strategy gives each shared layer one gradient,
the sum over its passes; a script fine-tunes one on 2 towers and its hf export is transformers'
AlbertForSequenceClassification; ELECTRA's and ALBERT's graph exports (SavedModel, ONNX) serve the model's
outputs."""

import os

import keras
import numpy as np
import pytest
from conftest import WORDS, tiny_config, write_vocab
from test_electra import family_release, features, google_electra_release, gpu_step, torch_outputs

from bert_mgpu.io import checkpoints, weight_names
from bert_mgpu.model import modeling
from bert_mgpu.model.fused_encoder import FusedBertEncoder

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def albert_config(vocab_size=60, **overrides):
    values = dict(model_type="albert", embedding_size=16, num_hidden_layers=4, num_hidden_groups=2,
                  inner_group_num=2, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    return tiny_config(vocab_size, **{**values, **overrides})


def hf_albert(directory, pretraining=True):
    """transformers' AlbertForPreTraining (or AlbertModel alone) with random weights: 4 passes of 2 groups of
    2 layers, saved as safetensors with a vocabulary of 60."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AlbertConfig(vocab_size=60, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                                       num_hidden_groups=2, inner_group_num=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64, hidden_act="gelu_new")
    model = (transformers.AlbertForPreTraining if pretraining else transformers.AlbertModel)(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(directory, safe_serialization=True)
    write_vocab(os.path.join(directory, "vocab.txt"), [f"w{i}" for i in range(50)])  # and 10 special tokens
    return model


@pytest.mark.parametrize("layout", ["AlbertModel", "AlbertForPreTraining"])
def test_the_encoders_compute_transformers_albert_on_the_same_weights(tmp_path, reference, layout):
    """The fused encoder and the unfused reference (what the graph exports convert) on AlbertModel's weights:
    sequence and pooled outputs to 1e-4; 4 distinct layers run 8 passes; the pretraining heads are left over."""
    theirs = hf_albert(str(tmp_path), pretraining=layout == "AlbertForPreTraining")
    pre = checkpoints.load_pretrained(str(tmp_path))
    assert (pre.config.model_type, pre.config.num_hidden_groups, pre.config.inner_group_num) == ("albert", 2, 2)
    assert pre.config.schedule == (0, 1, 0, 1, 2, 3, 2, 3)
    model = modeling.build_tagger(pre.config, 3)
    heads = checkpoints.assign_encoder(model.backbone, pre.weights, str(tmp_path))
    assert len(model.backbone.transformer_layers) == 4
    assert all(h.startswith("cls/albert_") for h in heads) and len(heads) == (7 if layout != "AlbertModel" else 0)
    batch = features()
    expected = torch_outputs(getattr(theirs, "albert", theirs), batch)
    fused = next(layer for layer in model.layers if isinstance(layer, FusedBertEncoder))(batch)
    reference_outputs = modeling.reference_encoder(model.backbone)(batch)
    for name, ours in (("fused", fused), ("reference", reference_outputs)):
        difference = np.abs(ours["sequence_output"].numpy() - expected.last_hidden_state.numpy())[
            batch["padding_mask"]].max()
        pooled = np.abs(ours["pooled_output"].numpy() - expected.pooler_output.numpy()).max()
        print(f"{name}: largest difference to transformers' AlbertModel {difference:.2e}, pooled {pooled:.2e}")
        assert difference < 1e-4 and pooled < 1e-4


def test_features_of_each_pass_are_transformers_hidden_states(tmp_path, reference):
    """extract_features' layers (google-bert's numbering, -1 the last) of an ALBERT are its passes, not its 4
    distinct layers: -1 and -6 are transformers' hidden states 8 and 3 to 1e-4; layer -9 is refused."""
    from bert_mgpu.api.embeddings import pooling_model
    from bert_mgpu.core.errors import UserError

    theirs = hf_albert(str(tmp_path), pretraining=False)
    pre = checkpoints.load_pretrained(str(tmp_path))
    backbone = modeling.build_backbone(pre.config)
    checkpoints.assign_encoder(backbone, pre.weights, str(tmp_path))
    batch = features()
    got = pooling_model(backbone, "layers", layers=(-1, -6), width=12)(batch).numpy()
    import torch

    with torch.no_grad():
        states = theirs(input_ids=torch.tensor(batch["token_ids"], dtype=torch.long),
                        token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                        attention_mask=torch.tensor(batch["padding_mask"], dtype=torch.long),
                        output_hidden_states=True).hidden_states  # the embeddings' projection, then 8 passes
    for column, index in ((0, 8), (1, 3)):
        difference = np.abs(got[:, column] - states[index].numpy())[batch["padding_mask"]].max()
        assert difference < 1e-4, (index, difference)
    with pytest.raises(UserError, match="the model has 8 layers"):
        pooling_model(backbone, "layers", layers=(-9,), width=12)


def google_albert_release(directory, weights=None, seed=0, words=WORDS):
    """A Google TF1 ALBERT release: the shared layers under bert/encoder/transformer/group_G/inner_group_J/, the
    projection as embedding_hidden_mapping_in, an MLM head, Google's albert_config.json keys (no model_type)."""
    return family_release(directory, albert_config, weights, seed, words,
                          lambda vocab, rng: {"cls/predictions/output_bias": np.zeros(vocab, np.float32)})


def test_googles_tf1_layout_reads_as_the_hugging_face_model(tmp_path, reference):
    hf_albert(str(tmp_path / "hf"))
    from_hf = checkpoints.load_pretrained(str(tmp_path / "hf"))
    encoder = {k: v for k, v in from_hf.weights.items() if k.startswith("bert/")}
    release, _ = google_albert_release(str(tmp_path / "google"), encoder, words=[f"w{i}" for i in range(50)])
    stored = checkpoints.read_tf_checkpoint(os.path.join(release, "bert_model.ckpt"))
    assert "bert/encoder/transformer/group_1/inner_group_1/ffn_1/intermediate/output/dense/kernel" in stored
    assert "bert/encoder/embedding_hidden_mapping_in/kernel" in stored
    assert not any("/layer_" in n for n in stored)
    from_google = checkpoints.load_pretrained(release)
    assert from_google.config == from_hf.config
    np.testing.assert_equal({k: v for k, v in from_google.weights.items() if k.startswith("bert/")}, encoder)
    # layer 3 is group 1's second layer: HF's albert_layer_groups.1.albert_layers.1
    assert weight_names.bert_to_hf_family("bert.encoder.layer.3.output.dense.weight", "albert", 2) == \
        "albert.encoder.albert_layer_groups.1.albert_layers.1.ffn_output.weight"


@pytest.mark.parametrize("head", ["classifier"])  # the other heads' steps on the same encoder: test_electra
def test_the_gpu_step_gives_each_shared_layer_one_gradient(head):
    """NCCL, mixed_float16, 2 towers: an ALBERT of 4 distinct layers run 8 times all-reduces each shared
    variable once (the collectives carry the trainable elements exactly), the step moves them all and the
    towers stay bit-equal (a tagger's pooler, which it does not read, aside)."""
    from test_allreduce import collectives

    from bert_mgpu.model.objectives import Classification
    from bert_mgpu.model.tagging_objectives import TokenClassification

    config = albert_config()
    batch = features(8)
    if head == "classifier":
        trainer, before, losses = gpu_step(lambda: modeling.build_classifier(config, 3, "mixed_float16"), batch,
                                           (np.arange(8) % 3).astype(np.int32), Classification().loss)
    else:
        labels = np.where(batch["padding_mask"], np.arange(12)[None] % 3, -1).astype(np.int32)
        trainer, before, losses = gpu_step(lambda: modeling.build_tagger(config, 3, "mixed_float16"), batch, labels,
                                           TokenClassification().loss)
    model = trainer.model
    assert len([v for v in model.trainable_variables if v.path.endswith("feedforward_output_dense/kernel")]) == 4
    sent = collectives(trainer.step_graph(trainer.input_spec))
    assert {hint for hint, _, _ in sent} == {"nccl"}
    # a tagger reads no pooled output: the pooler gets no gradient, as a BERT tagger's
    used = [v for v in model.trainable_variables if head == "classifier" or not v.path.startswith("pooled_dense")]
    assert sum(n for _, _, n in sent) == sum(int(np.prod(v.shape)) for v in used)
    assert np.isfinite(np.asarray(losses[0])).all()
    for v in used:
        assert not np.array_equal(v.numpy(), before[v.path]), v.path
        x, y = trainer.strategy.experimental_local_results(v.value)
        assert np.array_equal(x.numpy(), y.numpy()), v.path


def test_a_script_fine_tunes_an_albert_release_and_transformers_reads_its_export(sentiment_data, tmp_path,
                                                                                  reference):
    """run_classifier_mgpu.py from a Google ALBERT release on 2 towers, exported google and hf: the google
    export keeps ALBERT's names; transformers' AlbertForSequenceClassification reads the hf export with no
    missing or unexpected tensor and computes the run's model (its logits to 1e-4)."""
    import transformers
    from conftest import run_script

    import bert_mgpu

    release, initial = google_albert_release(str(tmp_path / "release"))
    out = tmp_path / "run"
    run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={sentiment_data}",
               f"--init_checkpoint={release}", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8",
               "--eval_batch_size=8", "--max_seq_length=32", "--precision=float32", f"--output_dir={out}",
               "--do_train", "--do_eval", "--num_train_epochs=2", "--learning_rate=1e-3", "--do_export",
               "--export_format=google,hf")
    trained = checkpoints.load_pretrained(str(out))
    assert trained.config.schedule == (0, 1, 0, 1, 2, 3, 2, 3)
    assert all(not np.array_equal(trained.weights[n], initial[n]) for n in initial if n.endswith("kernel"))
    stored = checkpoints.read_tf_checkpoint(str(out / "export" / "google" / "bert_model.ckpt"))
    assert "bert/encoder/transformer/group_0/inner_group_1/attention_1/self/query/kernel" in stored
    theirs, info = transformers.AlbertForSequenceClassification.from_pretrained(str(out / "export" / "hf"),
                                                                                 output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    clf = bert_mgpu.BertClassifier.from_pretrained(str(out), precision="float32", max_seq_length=32)
    batch = features(3, 12, vocab_size=trained.config.vocab_size)
    difference = np.abs(torch_outputs(theirs.eval(), batch).logits.numpy() - clf.model(batch).numpy()).max()
    print(f"largest logit difference to AlbertForSequenceClassification {difference:.2e}")
    assert difference < 1e-4


@pytest.mark.parametrize("family", ["electra", "albert"])
@pytest.mark.parametrize("fmt", ["saved_model", "onnx"])
def test_the_graph_exports_serve_the_models_outputs(tmp_path, family, fmt):
    """A classifier on an ELECTRA (no pooler) or an ALBERT (shared layers) release, exported as a SavedModel or
    ONNX (both converted from the unfused reference): served from text, its probabilities are the model's to
    1e-5."""
    import bert_mgpu
    from bert_mgpu.io.exported import load_exported

    write = google_electra_release if family == "electra" else google_albert_release
    release, _ = write(str(tmp_path / "release"))
    clf = bert_mgpu.BertClassifier.from_pretrained(release, labels=["neg", "pos"], precision="float32",
                                                   max_seq_length=16)
    keras.utils.set_random_seed(1)
    clf.model.head.kernel.assign(np.random.default_rng(1).normal(size=clf.model.head.kernel.shape) * 2)
    texts = ["the movie was good", "a dull plot and a bad actor", "fun", "this story is not great but it was fun"]
    path = clf.export(str(tmp_path / fmt), format=fmt)
    expected = clf.predict(texts)
    assert np.abs(expected[:, 0] - 0.5).max() > 0.05  # outputs that depend on the text
    if fmt == "saved_model":
        import tensorflow as tf

        served = tf.saved_model.load(path).signatures["serving_default"](text=tf.constant(texts))
        got = served["probabilities"].numpy()
    else:
        got = load_exported(path).predict(texts)
    difference = np.abs(got - expected).max()
    print(f"{family} {fmt}: largest probability difference {difference:.2e}")
    assert difference <= 1e-5


def test_lora_adapts_each_shared_layer_once_and_folds_back():
    """--lora_rank on an ALBERT: one adapter per distinct layer (4, used by 8 passes), the encoder frozen; the
    adapted model's outputs are those of its kernels with the adapters folded in (merge), to 1e-5."""
    from test_lora import randomize_b

    from bert_mgpu.model import lora

    keras.utils.set_random_seed(2)
    model = modeling.build_classifier(albert_config(), 3)
    adapters = lora.enable(model, lora.check_lora(2, 4.0, ("query", "value")))
    assert len(adapters.layers) == 4
    randomize_b(model)
    batch = features()
    adapted = model(batch).numpy()
    paths = [v.path for v in model.trainable_variables]
    assert {p for p in paths if "lora" not in p} == {"classifier/kernel", "classifier/bias"}
    assert len(paths) == 2 + 4 * 2 * 2  # A and B of query and value in each of the 4 distinct layers
    lora.merge(model)
    assert not lora.pending(model)
    np.testing.assert_allclose(model(batch).numpy(), adapted, atol=1e-5)


def test_what_albert_cannot_be_is_refused_in_one_line():
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.model.pretraining_model import build_pretrainer

    with pytest.raises(UserError, match="an ALBERT is fine-tuned here"):
        build_pretrainer(albert_config())
    with pytest.raises(UserError, match="num_hidden_layers=4 is not a multiple of num_hidden_groups=3"):
        albert_config(num_hidden_groups=3).validate()
    with pytest.raises(UserError, match="an ALBERT whose embedding_size is its hidden_size"):
        albert_config(embedding_size=32).validate()
    with pytest.raises(UserError, match="num_hidden_groups and inner_group_num are ALBERT's"):
        tiny_config(60, num_hidden_groups=2).validate()
