"""The checkpoints Chinese users have: HFL's RoBERTa-wwm-ext / MacBERT / RBT3 releases are Google-layout BERT
(`bert_model.ckpt`, a bert_config.json with Google's Chinese extras, a 21,128-token vocabulary). One is
written here from random weights and read as transformers' BertModel reads the same weights."""

import json
import re

import numpy as np
import pytest

from bert_mgpu.io import checkpoints
from bert_mgpu.model import modeling

# HFL's bert_config.json for chinese-roberta-wwm-ext, shrunk (hidden 64, 3 layers as RBT3), its other keys kept.
HFL_CONFIG = {"attention_probs_dropout_prob": 0.1, "directionality": "bidi", "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
              "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 3,
              "pooler_fc_size": 768, "pooler_num_attention_heads": 12, "pooler_num_fc_layers": 3,
              "pooler_size_per_head": 128, "pooler_type": "first_token_transform", "type_vocab_size": 2,
              "vocab_size": 21128}


def chinese_vocab():
    """Google's Chinese layout: [PAD], [unused1-99], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then
    punctuation, digits and characters up to 21,128 entries."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += list("，。！？、：；“”（）《》") + [str(d) for d in range(10)]
    tokens += [chr(c) for c in range(0x4E00, 0x4E00 + 21128 - len(tokens) - 1000)]
    tokens += [f"##{chr(c)}" for c in range(0x4E00, 0x4E00 + 1000)]
    assert len(tokens) == 21128
    return tokens


def hfl_release(directory, seed=0):
    """Random weights under the names HFL's TensorFlow release uses (Google's, with the pretraining heads)."""
    rng = np.random.default_rng(seed)
    h, inter, v = HFL_CONFIG["hidden_size"], HFL_CONFIG["intermediate_size"], HFL_CONFIG["vocab_size"]
    w = lambda *shape: rng.normal(0, 0.2, shape).astype(np.float32)  # noqa: E731
    weights = {"bert/embeddings/word_embeddings": w(v, h), "bert/embeddings/token_type_embeddings": w(2, h),
               "bert/embeddings/position_embeddings": w(512, h), "bert/embeddings/LayerNorm/gamma": 1 + w(h),
               "bert/embeddings/LayerNorm/beta": w(h), "bert/pooler/dense/kernel": w(h, h),
               "bert/pooler/dense/bias": w(h), "cls/predictions/transform/dense/kernel": w(h, h),
               "cls/predictions/transform/dense/bias": w(h), "cls/predictions/transform/LayerNorm/gamma": 1 + w(h),
               "cls/predictions/transform/LayerNorm/beta": w(h), "cls/predictions/output_bias": w(v),
               "cls/seq_relationship/output_weights": w(2, h), "cls/seq_relationship/output_bias": w(2)}
    for i in range(HFL_CONFIG["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}/"
        for name in ("attention/self/query", "attention/self/key", "attention/self/value", "attention/output/dense"):
            weights[p + name + "/kernel"], weights[p + name + "/bias"] = w(h, h), w(h)
        weights[p + "intermediate/dense/kernel"], weights[p + "intermediate/dense/bias"] = w(h, inter), w(inter)
        weights[p + "output/dense/kernel"], weights[p + "output/dense/bias"] = w(inter, h), w(h)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            weights[p + ln + "/gamma"], weights[p + ln + "/beta"] = 1 + w(h), w(h)
    directory.mkdir()
    checkpoints.write_google_checkpoint(weights, str(directory / "bert_model.ckpt"))
    (directory / "bert_config.json").write_text(json.dumps(HFL_CONFIG, indent=2))
    (directory / "vocab.txt").write_text("\n".join(chinese_vocab()) + "\n", encoding="utf-8")
    return weights


def as_transformers(weights):
    """Google names -> transformers' BertModel state dict (dense kernels transposed), written out here
    rather than taken from bert_mgpu, so the two sides share nothing."""
    state = {}
    for name, value in weights.items():
        if not name.startswith("bert/"):
            continue
        key = name[len("bert/"):].replace("/", ".")
        key = re.sub(r"layer_(\d+)", r"layer.\1", key)
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key.endswith(".kernel"):
            key, value = key[:-len(".kernel")] + ".weight", value.T
        if key.endswith("_embeddings"):
            key += ".weight"
        state[key] = value
    return state


def test_an_hfl_roberta_wwm_ext_release_loads_and_predicts_as_transformers_bert(reference, tmp_path):
    import torch
    import transformers

    from bert_mgpu.data.tokenization import FullTokenizer

    release = tmp_path / "chinese_roberta_wwm_ext_L-3_H-64_A-4"
    weights = hfl_release(release)
    pre = checkpoints.load_pretrained(str(release))
    assert pre.layout == "google" and pre.config.vocab_size == 21128 and pre.config.num_hidden_layers == 3
    tok = FullTokenizer(str(release / "vocab.txt"), do_lower_case=True)
    texts = ["使用语言模型来预测下一个词。", "今天天气很好！"]
    rows = [[tok.cls_id, *ids, tok.sep_id] for ids in tok.id_lists(texts)]
    assert [tok.vocab[i] for i in rows[0][:3]] == ["[CLS]", "使", "用"] and rows[0][0] == 101  # Google's layout
    width = max(map(len, rows))
    ids = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
    mask = ids != 0
    backbone = modeling.build_backbone(pre.config)
    checkpoints.assign_encoder(backbone, pre.weights, str(release))
    ours = backbone({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask})

    config = transformers.BertConfig(**{k: v for k, v in HFL_CONFIG.items() if not k.startswith("pooler_")})
    model = transformers.BertModel(config).eval()
    missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in as_transformers(weights).items()},
                                                strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long())
    seq, pooled = ref.last_hidden_state.numpy(), ref.pooler_output.numpy()
    assert np.abs(ours["sequence_output"].numpy()[mask] - seq[mask]).max() <= 1e-4
    assert np.abs(ours["pooled_output"].numpy() - pooled).max() <= 1e-4
    assert np.abs(seq[mask]).max() > 1.0


@pytest.mark.parametrize("family, extra, expected", [
    ("albert_zh", {"embedding_size": 128, "ln_type": "postln"},
     "brightmart's albert_zh config (ln_type: its checkpoints keep one layer_shared, not Google's ALBERT names), "
     "not BERT"),
    ("nezha-cn-base", {"max_relative_position": 64, "use_relative_position": True},
     "a NEZHA config (use_relative_position: relative position encodings), not BERT"),
])
def test_a_release_of_another_family_is_refused_by_name(tmp_path, family, extra, expected):
    """brightmart's albert_zh and NEZHA Chinese releases ship BERT-like configs; read as BERT they would load
    nothing that fits (or, NEZHA, the wrong positions), so the config says which family it is. (HFL's ELECTRA
    configs and Google's ALBERT ones load: test_electra.py, test_albert.py.)"""
    from bert_mgpu.core.errors import UserError

    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**HFL_CONFIG, **extra}))
    checkpoints.write_google_checkpoint({"bert/embeddings/word_embeddings": np.zeros([8, 4], np.float32)},
                                        str(tmp_path / "bert_model.ckpt"))
    (tmp_path / "vocab.txt").write_text("\n".join(chinese_vocab()) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        checkpoints.load_pretrained(str(tmp_path))  # the release's folder
    assert str(e.value) == f"{path}: {expected}; it does not load here (transformers or bert4keras read it)"
