"""Every head of the tiny release, in memory, for the graph exports' tests (ONNX, LiteRT): the models, texts
to feed them, and what the model itself computes from the same ids."""

import numpy as np
import tensorflow as tf
from conftest import NER_TAGS, WORDS

import bert_mgpu
from bert_mgpu.data.input_pipeline import encode

TOWERS = dict(n_gpus=0, towers_per_gpu=2)
rng = np.random.default_rng(3)
TEXTS = [" ".join(rng.choice(WORDS, rng.integers(1, 30))) for _ in range(9)] + ["", "film", "电影 film !"]


def heads(release):
    towers = bert_mgpu.Towers(**TOWERS)
    common = dict(towers=towers, precision="float32")
    tagger = bert_mgpu.BertTagger.from_pretrained(release, labels=NER_TAGS, max_seq_length=16, crf=True, **common)
    transitions = np.random.default_rng(7).normal(0, 2, (len(NER_TAGS),) * 2)  # whatever ran before
    tagger.model.crf.transitions.assign(transitions.astype(np.float32))
    return {
        "classification": bert_mgpu.BertClassifier.from_pretrained(release, labels=["neg", "pos", "mixed"],
                                                                   max_seq_length=16, **common),
        "regression": bert_mgpu.BertClassifier.from_pretrained(release, task_type="regression", max_seq_length=16,
                                                               **common),
        "multi_label": bert_mgpu.BertClassifier.from_pretrained(release, labels=["a", "b"], task_type="multi_label",
                                                                max_seq_length=16, **common),
        "tagger_crf": tagger,
        "question_answerer": bert_mgpu.BertQuestionAnswerer.from_pretrained(release, max_seq_length=16, **common),
        "multiple_choice": bert_mgpu.BertMultipleChoice.from_pretrained(release, max_seq_length=16, **common),
        "encoder": bert_mgpu.BertPretrainer.from_pretrained(release, **common),
    }


def rows_of(tokenizer, texts, pairs=False, length=16):
    a = tf.constant(texts)
    ids, segments = encode(tokenizer, a, tf.constant(texts[::-1]) if pairs else None, length, pairs)
    ids, segments = ids.to_tensor(0).numpy().astype(np.int64), segments.to_tensor(0).numpy().astype(np.int64)
    return {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64), "token_type_ids": segments}


def head_rows(model, kind, length=16):
    """The 12 TEXTS as the head's graph inputs (pairs for the classifier; for multiple choice 3 questions of 4
    choices, the last question's last choice padding)."""
    rows = rows_of(model.tokenizer, TEXTS, pairs=kind == "classification", length=length)
    if kind == "multiple_choice":
        rows = {k: v.reshape(3, 4, -1) for k, v in rows.items()}
        for v in rows.values():
            v[2, 3] = 0
    return rows


def expected_outputs(model, kind, rows):
    """[(the graph's output name, what the model in memory computes for it)] from the same rows."""
    want = model_outputs(model, rows)
    if kind == "encoder":  # and the pretraining heads, at every position: what a server scores text with
        every = np.broadcast_to(np.arange(rows["input_ids"].shape[1]), rows["input_ids"].shape)
        heads = model.model({**_features(rows), "mask_positions": tf.constant(every, tf.int32)}, training=False)
        return [("last_hidden_state", want["sequence_output"]), ("pooler_output", want["pooled_output"]),
                ("mlm_logits", np.asarray(heads["mlm_logits"])), ("nsp_logits", np.asarray(heads["nsp_logits"]))]
    if kind == "question_answerer":
        return [("start_logits", want[:, :, 0]), ("end_logits", want[:, :, 1])]
    return [("logits", want)]


def model_outputs(model, rows):
    """What the model in memory (its fused encoder) computes from the same rows."""
    features = _features(rows)
    network = model.model.backbone if isinstance(model, bert_mgpu.BertPretrainer) else model.model
    out = network(features, training=False)
    return {k: np.asarray(v) for k, v in out.items()} if isinstance(out, dict) else np.asarray(out)


def _features(rows):
    return {"token_ids": tf.constant(rows["input_ids"], tf.int32),
            "segment_ids": tf.constant(rows["token_type_ids"], tf.int32),
            "padding_mask": tf.constant(rows["attention_mask"] > 0)}


def export_each(release, tmp_path_factory, fmt):
    """{kind: (model, path)}: each head of the tiny release (random heads, non-zero CRF transitions), exported
    as `fmt` (a module fixture of the graph exports' tests)."""
    from bert_mgpu.io import export

    out = {}
    for kind, model in heads(release).items():
        path = str(tmp_path_factory.mktemp(kind) / fmt)
        export.export_model(model, path, fmt)
        out[kind] = (model, path)
    return out
