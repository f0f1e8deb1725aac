"""Every checkpoint format loads to the same numbers as Hugging Face transformers' BertModel."""

import numpy as np
import pytest
from conftest import tiny_config

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints, weight_names
from bert_mgpu.model import modeling

TOKENS = np.array([[101, 7592, 1010, 2088, 999, 2023, 2003, 1037, 3231, 102, 0, 0],
                   [101, 1045, 2293, 2009, 102, 2307, 3185, 102, 0, 0, 0, 0]], np.int32)
SEGMENTS = np.array([[0] * 12, [0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0]], np.int32)


def sequence_output(path):
    pre = checkpoints.load_pretrained(path)
    backbone = modeling.build_backbone(pre.config)
    checkpoints.assign_encoder(backbone, pre.weights, path)
    out = backbone({"token_ids": TOKENS, "segment_ids": SEGMENTS, "padding_mask": TOKENS != 0})
    return pre, out["sequence_output"].numpy(), backbone


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return sequence_output(minilm_dir)


def test_huggingface_safetensors_match_transformers(reference, minilm, minilm_dir):
    import torch
    import transformers

    pre, ours, _ = minilm
    assert pre.layout == "huggingface" and pre.do_lower_case is True
    ref_model = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=torch.tensor(TOKENS).long(), token_type_ids=torch.tensor(SEGMENTS).long(),
                        attention_mask=torch.tensor(TOKENS != 0).long()).last_hidden_state.numpy()
    real = TOKENS != 0
    diff = np.abs(ours[real] - ref[real]).max()
    assert diff <= 1e-4, diff
    assert np.abs(ref[real]).max() > 1.0  # real activations, not zeros


def test_google_release_of_same_weights_loads_to_same_outputs(minilm, tmp_path):
    pre, ours, _ = minilm
    directory = tmp_path / "google"
    directory.mkdir()
    checkpoints.write_google_checkpoint(pre.weights, str(directory / "bert_model.ckpt"))
    pre.config.to_json_file(str(directory / "bert_config.json"))
    (directory / "vocab.txt").write_bytes(open(pre.vocab_file, "rb").read())
    g_pre, g_out, _ = sequence_output(str(directory / "bert_model.ckpt"))
    assert g_pre.layout == "google" and len(g_pre.weights) == len(pre.weights) == 103
    assert np.abs(g_out - ours).max() <= 1e-5
    assert sequence_output(str(directory))[0].layout == "google"  # the directory works too


def test_keras_hub_preset_saved_from_it_loads_to_same_outputs(minilm, tmp_path):
    import keras_hub

    pre, ours, backbone = minilm
    preset = str(tmp_path / "preset")
    backbone.save_to_preset(preset)
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=pre.vocab_file, lowercase=True)
    tokenizer.save_to_preset(preset)
    k_pre, k_out, _ = sequence_output(preset)
    assert k_pre.layout == "keras_hub" and k_pre.do_lower_case is True
    # keras-hub presets record no activation; bert_mgpu reads them as keras-hub's own tanh-GELU BERT
    assert k_pre.config.hidden_act == "gelu_new"
    native = keras_hub.models.BertBackbone.from_preset(preset)  # what keras-hub itself computes
    nat = native({"token_ids": TOKENS, "segment_ids": SEGMENTS, "padding_mask": TOKENS != 0})
    assert np.abs(k_out - nat["sequence_output"].numpy()).max() <= 1e-5
    same_act = modeling.build_backbone(pre.config.__class__(**{**pre.config.to_dict(), "hidden_act": "gelu_new"}))
    checkpoints.assign_encoder(same_act, pre.weights, "minilm")
    ref = same_act({"token_ids": TOKENS, "segment_ids": SEGMENTS, "padding_mask": TOKENS != 0})
    assert np.abs(k_out - ref["sequence_output"].numpy()).max() <= 1e-5


def test_mismatched_checkpoint_lists_what_is_wrong(google_release):
    pre = checkpoints.load_pretrained(google_release)
    bigger = modeling.build_backbone(tiny_config(pre.config.vocab_size, num_hidden_layers=3, hidden_size=48))
    with pytest.raises(UserError) as e:
        checkpoints.assign_encoder(bigger, pre.weights, google_release)
    msg = str(e.value)
    assert "mis-shaped: bert/embeddings/word_embeddings is [38, 32], model wants [38, 48]" in msg
    assert "missing: bert/encoder/layer_2/" in msg


def test_unexpected_tensor_is_an_error_and_heads_are_reported(google_release):
    pre = checkpoints.load_pretrained(google_release)
    backbone = modeling.build_backbone(pre.config)
    weights = dict(pre.weights, **{"cls/seq_relationship/output_bias": np.zeros(2, np.float32)})
    assert checkpoints.assign_encoder(backbone, weights, "x") == ["cls/seq_relationship/output_bias"]
    weights["bert/encoder/layer_9/extra"] = np.zeros(2, np.float32)
    with pytest.raises(UserError, match="unexpected: bert/encoder/layer_9/extra"):
        checkpoints.assign_encoder(backbone, weights, "x")


def test_hf_names_map_to_google_names():
    f = weight_names.hf_to_google_name
    assert f("bert.encoder.layer.11.attention.self.query.weight") == (
        "bert/encoder/layer_11/attention/self/query/kernel", True)
    assert f("embeddings.LayerNorm.weight") == ("bert/embeddings/LayerNorm/gamma", False)
    assert f("embeddings.word_embeddings.weight") == ("bert/embeddings/word_embeddings", False)
    assert f("pooler.dense.bias") == ("bert/pooler/dense/bias", False)
    assert f("cls.predictions.transform.dense.weight") == ("cls/predictions/transform/dense/kernel", True)
    assert f("cls.seq_relationship.weight") == ("cls/seq_relationship/output_weights", False)
    assert f("embeddings.position_ids") == (None, False)


def test_google_names_map_back_to_every_hf_name(minilm_dir):
    """`google_to_hf_name` inverts `hf_to_google_name` on a real checkpoint's every tensor, heads included."""
    from safetensors import safe_open

    with safe_open(f"{minilm_dir}/model.safetensors", "np") as f:
        names = [n for n in f.keys() if not n.endswith("position_ids")]
    names += ["cls.predictions.transform.dense.weight", "cls.predictions.transform.LayerNorm.bias",
              "cls.predictions.bias", "cls.seq_relationship.weight", "classifier.weight", "classifier.bias"]
    for name in names:
        google, transpose = weight_names.hf_to_google_name(name)
        hf = name if name.startswith(("bert.", "cls.", "classifier.")) else "bert." + name
        assert weight_names.google_to_hf_name(google) == (hf, transpose), name


def test_pickle_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "vocab_size": 10}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(UserError, match="never unpickles. Convert them once"):
        checkpoints.load_pretrained(str(tmp_path))


def test_config_from_another_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="model_type='gpt2' is not BERT"):
        checkpoints.load_pretrained(str(tmp_path))


def test_missing_checkpoint():
    with pytest.raises(UserError, match="nowhere/bert_model.ckpt: checkpoint not found"):
        checkpoints.load_pretrained("/nowhere/bert_model.ckpt")


def test_keras_file_with_code_is_refused_without_running_it(tmp_path):
    """A keras-hub preset whose config carries Python bytecode (a Lambda) loads in Keras' safe mode: refused."""
    import base64
    import json
    import marshal

    flag = tmp_path / "ran"
    code = (lambda x: open(str(flag), "w").write("pwned") and x).__code__  # noqa: E731
    preset = tmp_path / "preset"
    preset.mkdir()
    (preset / "config.json").write_text(json.dumps({
        "module": "keras.layers", "class_name": "Lambda", "registered_name": None,
        "config": {"name": "evil", "function": {"class_name": "__lambda__", "config": {
            "code": base64.b64encode(marshal.dumps(code)).decode(), "defaults": None, "closure": None}}}}))
    with pytest.raises(UserError, match="not a loadable keras-hub BERT preset"):
        checkpoints.load_pretrained(str(preset))
    assert not flag.exists()


def test_no_code_path_unpickles_or_loads_unsafely():
    """The package and scripts never call what executes a file's content: pickle, torch.load,
    numpy's allow_pickle, Keras' safe_mode=False."""
    import glob
    import os
    import re

    from conftest import ROOT

    sources = glob.glob(os.path.join(ROOT, "bert_mgpu", "**", "*.py"), recursive=True)
    sources += glob.glob(os.path.join(ROOT, "*.py"))
    assert len(sources) > 20
    unsafe = re.compile(r"import pickle|pickle\.load|torch\.load|allow_pickle\s*=\s*True|safe_mode\s*=\s*False|"
                        r"enable_unsafe_deserialization|np\.load\(|numpy\.load\(")
    found = [(path, line) for path in sources for line in open(path, encoding="utf-8") if unsafe.search(line)]
    assert found == []


def test_a_vocabulary_smaller_than_the_embedding_table_is_worth_a_warning(caplog):
    from bert_mgpu.model.config import BertConfig

    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64)
    with caplog.at_level("WARNING", "bert_mgpu"):
        config.check_vocab("v/vocab.txt", 38)
    assert "v/vocab.txt: 38 tokens but the model config has vocab_size=50; the last 12 embedding rows" in caplog.text
    caplog.clear()
    config.check_vocab("v/vocab.txt", 50)
    assert not caplog.text
    with pytest.raises(UserError, match="51 tokens but the model config has vocab_size=50"):
        config.check_vocab("v/vocab.txt", 51)
