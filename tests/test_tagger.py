"""The token-classification head and its objective against transformers' BertForTokenClassification on the
same weights: logits to 1e-4, and the loss over labelled positions equal to its ignore_index loss."""

import keras
import numpy as np
import pytest
from conftest import tiny_config

from bert_mgpu.io import checkpoints, weight_names
from bert_mgpu.model import modeling
from bert_mgpu.model.objectives import TokenClassification


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "keras_hub"])
def test_logits_and_loss_equal_transformers_on_the_same_weights(reference, fused):
    import torch
    import transformers

    config = tiny_config(40, hidden_act="gelu")
    keras.utils.set_random_seed(3)
    model = modeling.build_tagger(config, 5, fused=fused)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 40, (3, 11)).astype(np.int32)
    mask = np.arange(11)[None, :] < np.array([[11], [7], [4]])
    ids[~mask] = 0
    segments = (np.arange(11)[None, :] >= 5).astype(np.int32) * mask
    labels = np.where(mask & (rng.random((3, 11)) < 0.6), rng.integers(0, 5, (3, 11)), -1).astype(np.int32)
    features = {"token_ids": ids, "segment_ids": segments, "padding_mask": mask}
    ours = model(features, training=False).numpy()

    weights = checkpoints.encoder_weights(model.backbone)
    kernel, bias = model.head.get_weights()
    weights.update({"output_weights": kernel.T, "output_bias": bias})
    state = {}
    for name, value in weights.items():
        hf, transpose = weight_names.google_to_hf_name(name)
        state[hf] = torch.tensor(value.T if transpose else value)
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "encoder_ln_mode"},
                                        num_labels=5, layer_norm_eps=1e-12)
    reference_model = transformers.BertForTokenClassification(hf_config).eval()
    missing, unexpected = reference_model.load_state_dict(state, strict=False)
    # transformers' token classifier has no pooler; nothing else is left over or missing.
    assert all(".pooler." in u for u in unexpected) and all("position_ids" in m for m in missing), (missing,
                                                                                                   unexpected)
    with torch.no_grad():
        out = reference_model(input_ids=torch.tensor(ids, dtype=torch.long),
                              token_type_ids=torch.tensor(segments, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long),
                              labels=torch.tensor(np.where(labels < 0, -100, labels), dtype=torch.long))
    real = mask  # padding positions are not compared: neither library defines them
    difference = np.abs(out.logits.numpy()[real] - ours[real]).max()
    print(f"largest logit difference {difference:.2e}, loss {float(out.loss):.6f}")
    assert difference < 1e-4

    loss, stats = TokenClassification().loss(lambda f, training: model(f, training=training), features, labels,
                                             training=False)
    assert float(loss) == pytest.approx(float(out.loss), abs=1e-5)
    chosen = ours.argmax(-1)
    assert float(stats["token_accuracy"]) == pytest.approx(float((chosen == labels)[labels >= 0].mean()), abs=1e-6)


def test_the_objective_scores_entities_and_names_its_export():
    kind = TokenClassification()
    results, per_type = kind.evaluate([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "O"]])
    assert results == {"eval_precision": 1.0, "eval_recall": 0.5, "eval_f1": pytest.approx(2 / 3),
                       "eval_accuracy": 0.75}
    assert per_type["LOC"]["recall"] == 0.0 and per_type["PER"]["f1"] == 1.0 and kind.main_metric() == "eval_f1"
    assert kind.hf_architecture({}) == "BertForTokenClassification"
    assert kind.hf_facts(["O", "B-PER"])["id2label"] == {"0": "O", "1": "B-PER"}
