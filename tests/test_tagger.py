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


def test_a_tagger_learns_entities_that_need_context_on_two_towers_and_predicts_long_sentences_in_windows(tmp_path):
    """A made-up task: "film" and "movie" are a location right after "the", "actor" begins a person that the
    next "story" continues. Trained on two towers through the Trainer; sentences longer than a window are
    predicted in windows, each word once."""
    import tensorflow as tf
    from conftest import write_vocab

    from bert_mgpu.core.entities import entity_scores
    from bert_mgpu.data.tagged import Sentence
    from bert_mgpu.data.tagging_input import make_windows, window_arrays, word_predictions
    from bert_mgpu.data.tokenization import FullTokenizer
    from bert_mgpu.parallel import devices, distribute
    from bert_mgpu.train import optimization, training

    words = ["the", "a", "film", "movie", "actor", "story", "good"]
    vocab = tmp_path / "vocab.txt"
    write_vocab(str(vocab), words)
    tokenizer = FullTokenizer(str(vocab))

    def sentence(rng, n, guid):
        tokens = [str(rng.choice(words)) for _ in range(n)]
        tags = []
        for k, w in enumerate(tokens):
            before = tokens[k - 1] if k else None
            if w in ("film", "movie") and before == "the":
                tags.append("B-LOC")
            elif w == "actor":
                tags.append("B-PER")
            elif w == "story" and tags and tags[-1] in ("B-PER", "I-PER"):
                tags.append("I-PER")
            else:
                tags.append("O")
        return Sentence(guid, tokens, tags, 1)

    rng = np.random.default_rng(0)
    labels = ["O", "B-LOC", "B-PER", "I-PER"]
    train = [sentence(rng, int(rng.integers(3, 30)), f"train-{i}") for i in range(512)]  # windows too
    test = [sentence(rng, int(rng.integers(15, 40)), f"test-{i}") for i in range(40)]  # longer than a window
    length = 16
    features, y = window_arrays(make_windows(train, tokenizer, labels, length), length)

    plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(plan)
    keras.utils.set_random_seed(0)
    steps = 800
    with strategy.scope():
        model = modeling.build_tagger(tiny_config(len(tokenizer.vocab), hidden_size=64, intermediate_size=128),
                                      len(labels), dropout=0.0)
        optimizer = optimization.create_optimizer(5e-3, steps, 50)
    trainer = training.Trainer(strategy, model, optimizer, True, TokenClassification().loss)
    batches = trainer.training_batches(tf.data.Dataset.from_tensor_slices((features, y)).shuffle(
        512, seed=0).repeat().batch(32))
    first = last = None
    for _ in range(steps):
        loss, _ = trainer.train_step(next(batches))
        first = loss if first is None else first
        last = loss
    assert last < first / 5, (first, last)

    wins = make_windows(test, tokenizer, labels, length, doc_stride=6)
    assert len(wins) > 2 * len(test)  # every test sentence takes several windows
    test_features, test_labels = window_arrays(wins, length)
    data = tf.data.Dataset.from_tensor_slices((test_features, test_labels, np.arange(len(wins)))).batch(8)
    logits, _ = trainer.predict_logits(data)
    predicted = word_predictions(wins, logits, [len(s.tokens) for s in test])
    scores = entity_scores([s.tags for s in test], [[labels[i] for i in p] for p in predicted])
    assert scores["f1"] > 0.95 and scores["per_type"]["PER"]["support"] > 20, scores
