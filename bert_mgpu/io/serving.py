"""A SavedModel for TensorFlow Serving that takes raw text: tokenization is part of the graph.

The graph tokenizes as training does (the same `FullTokenizer` and `encode`, tensorflow-text ops), runs the
reference (unfused) keras-hub encoder with the trained weights, and returns probabilities, label ids and
label names (scores for a regression; encoder outputs for a pretrained model). A process that imports
only TensorFlow and tensorflow-text serves it. Built with Keras' `ExportArchive`.

The directory also keeps, in `assets.extra/` (which TensorFlow Serving ignores), the config, vocabulary
and run facts, and the archive keeps the weights under Google's names, so `--init_checkpoint` reads an
export back (`read_saved_model`).

Example:
    clf.export("serving/1", format="saved_model")
    served = tf.saved_model.load("serving/1")   # after `import tensorflow_text`
    served.signatures["serving_default"](text=tf.constant(["a fine film"]))["probabilities"]
"""

import json
import os

import keras
import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.data.doc_windows import pool_in_graph, windows_in_graph
from bert_mgpu.data.input_pipeline import encode
from bert_mgpu.data.tagging_input import split_words_tf
from bert_mgpu.data.tokenization import FullTokenizer
from bert_mgpu.io import weight_names
from bert_mgpu.io.checkpoints import EXTRA, META  # where an export's own facts go (read back there)
from bert_mgpu.io.span_serving import span_endpoint
from bert_mgpu.io.trained import build_model
from bert_mgpu.model.crf import viterbi_tf
from bert_mgpu.model.objectives import objective

# run_squad's defaults, for a question answerer whose run did not record its own.
SQUAD_DEFAULTS = {"max_query_length": 64, "doc_stride": 128, "n_best_size": 20, "max_answer_length": 30,
                  "version_2_with_negative": False, "null_score_diff_threshold": 0.0}


def _text_specs(pairs):
    names = ("text_a", "text_b") if pairs else ("text",)
    return [tf.TensorSpec([None], tf.string, name=n) for n in names]


def _id_specs():
    return [tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec([None, None], tf.int32, name="segment_ids")]


def write_saved_model(trained, path, precision="float32"):
    """Write `trained` (an `export.Trained`) as a SavedModel in the empty directory `path`.

    Signatures: `serving_default` (raw strings: `text`, `text_a` and `text_b` for a pair task, or `question` and
    `context` for a question answerer: span_serving.py) and
    `serving_ids` (`token_ids` and `segment_ids`, [CLS] ... [SEP] as training packs them, 0 = [PAD]).
    """
    tokenizer = FullTokenizer(trained.vocab_file, trained.do_lower_case)
    classifier = trained.kind in ("classifier", "tagger", "question_answerer")
    model = build_model(trained, precision)
    backbone = model.backbone if classifier else model
    labels = tf.constant(trained.labels or [""])
    pad = tokenizer.pad_id

    def run(ids, segments):
        features = {"token_ids": ids, "segment_ids": segments, "padding_mask": tf.not_equal(ids, pad)}
        out = model(features, training=False)
        if not classifier:
            mask = tf.cast(features["padding_mask"], tf.float32)[:, :, None]
            sequence = tf.cast(out["sequence_output"], tf.float32)
            return {"pooled_output": tf.cast(out["pooled_output"], tf.float32), "sequence_output": sequence,
                    "mean_pooled": tf.reduce_sum(sequence * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)}
        if trained.kind == "tagger":
            return {"logits": out}
        if trained.kind == "question_answerer":
            return {"start_logits": out[:, :, 0], "end_logits": out[:, :, 1]}
        return objective(trained.task_type).serving(out, labels)

    def from_text(text_a, text_b=None):
        if trained.facts.get("doc_stride"):  # a long text's windows, their logits pooled (data/doc_windows.py)
            ids, segments, real, doc_of = windows_in_graph(tokenizer, text_a, trained.max_seq_length,
                                                           trained.facts["doc_stride"])
            out = model({"token_ids": ids, "segment_ids": segments, "padding_mask": real}, training=False)
            pooled = pool_in_graph(out, doc_of, tf.shape(text_a)[0], trained.facts.get("window_pooling", "mean"))
            return objective(trained.task_type).serving(pooled, labels)
        ids, segments = encode(tokenizer, text_a, text_b, trained.max_seq_length, text_b is not None,
                               truncation=trained.truncation)
        return run(ids.to_tensor(pad), segments.to_tensor(0))

    archive = keras.export.ExportArchive()
    archive.track(model)
    crf = None
    if trained.kind == "question_answerer":
        text_specs = [tf.TensorSpec([None], tf.string, name=n) for n in ("question", "context")]
        facts = {**SQUAD_DEFAULTS, **trained.facts}
        archive.add_endpoint("serving_default", span_endpoint(tokenizer, model, trained.max_seq_length, **facts),
                             text_specs)
    elif trained.kind == "tagger":
        text_specs = _text_specs(False)
        if "crf/transitions" in trained.weights:  # kept as a variable: the export reads back as a CRF tagger
            crf = tf.Variable(trained.weights["crf/transitions"], trainable=False, name="crf_transitions")
            archive.add_variable_collection("crf", [crf])
        archive.add_endpoint("serving_default", _tagger_endpoint(trained, tokenizer, model, crf), text_specs)
    elif trained.pairs:
        text_specs = _text_specs(True)
        archive.add_endpoint("serving_default", lambda text_a, text_b: from_text(text_a, text_b), text_specs)
    else:
        text_specs = _text_specs(False)
        archive.add_endpoint("serving_default", lambda text: from_text(text), text_specs)
    archive.add_endpoint("serving_ids", run, _id_specs())
    # Every weight, its Google name in the meta file: what `read_saved_model` reads back.
    named = _named_variables(model, backbone)
    if crf is not None:
        named["crf/transitions"] = crf
    archive.add_variable_collection("bert_weights", list(named.values()))
    archive.write_out(path, verbose=False)
    storage.makedirs(os.path.join(path, EXTRA))
    meta = {"kind": trained.kind, "labels": trained.labels, "task_type": trained.task_type, "facts": trained.facts,
            "max_seq_length": trained.max_seq_length, "pairs": trained.pairs,
            "do_lower_case": trained.do_lower_case, "precision": precision, "weights": list(named),
            "signatures": {"serving_default": [s.name for s in text_specs],
                           "serving_ids": [s.name for s in _id_specs()]}}
    storage.write_atomic(os.path.join(path, EXTRA, META), json.dumps(meta, indent=2) + "\n")
    storage.write_atomic(os.path.join(path, EXTRA, "bert_config.json"),
                         json.dumps(trained.config.to_dict(), indent=2) + "\n")
    storage.write_atomic(os.path.join(path, EXTRA, "vocab.txt"), storage.read_bytes(trained.vocab_file))
    return path


def _named_variables(model, backbone):
    named = {weight_names.google_name(v.path): v for v in backbone.weights}
    if getattr(model, "head", None) is not None:
        named["classifier/kernel"], named["classifier/bias"] = model.head.kernel, model.head.bias
    return named




def _tagger_endpoint(trained, tokenizer, model, crf=None):
    """Raw text -> each word's tag and the entities, with character offsets into the text: the words cut as
    `split_words` cuts them, labels read on each word's first WordPiece (with `crf`, its transitions: the
    Viterbi path over the text's words). A text of more than max_seq_length - 2 WordPieces is read up to
    there: its later words are tagged O (`BertTagger.predict` reads long texts in windows)."""
    labels = list(trained.labels)
    head = trained.head
    room, pad = trained.max_seq_length - 2, tokenizer.pad_id
    outside = labels.index("O") if "O" in labels else 0

    def tag(text):
        words, byte_starts, byte_ends = split_words_tf(text)
        rows = words.value_rowids()
        flat_text = tf.gather(text, rows)
        byte_starts, byte_ends = byte_starts.flat_values, byte_ends.flat_values
        char = lambda ends: tf.strings.length(tf.strings.substr(flat_text, tf.zeros_like(ends), ends),  # noqa: E731
                                              unit="UTF8_CHAR")
        starts, ends = char(byte_starts), char(byte_ends)
        pieces = tokenizer(words.flat_values)  # [words, (pieces)]; a word with none reads as [UNK]
        plus = tf.concat([pieces, tf.RaggedTensor.from_tensor(tf.fill([tf.shape(rows)[0], 1], tokenizer.unk_id))], 1)
        pieces = tf.ragged.boolean_mask(plus, tf.ragged.range(plus.row_lengths()) < tf.maximum(
            pieces.row_lengths(), 1)[:, None])
        counts = tf.cast(pieces.row_lengths(), tf.int32)
        before = tf.cumsum(counts, exclusive=True)
        first = before - tf.gather(tf.gather(tf.concat([before, [0]], 0), tf.cast(words.row_splits, tf.int32)),
                                   tf.cast(rows, tf.int32))  # each word's first piece within its text
        per_text = tf.RaggedTensor.from_row_splits(pieces, words.row_splits).merge_dims(1, 2)[:, :room]
        n = tf.shape(text)[0]
        ids = tf.concat([tf.fill([n, 1], tokenizer.cls_id), per_text,
                         tf.fill([n, 1], tokenizer.sep_id)], 1).to_tensor(pad)
        logits = model({"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": ids != pad},
                       training=False)
        width = tf.shape(logits)[1]
        at = tf.cast(rows, tf.int32) * width + tf.minimum(first + 1, width - 1)
        scores = tf.gather(tf.reshape(logits, [-1, len(labels)]), at)  # each word's, on its first piece
        count = tf.size(rows)
        if crf is None:
            tag_ids = tf.where(first < room, tf.argmax(scores, -1, output_type=tf.int32), outside)
        else:  # the window's words of each text (a prefix of them), decoded together
            kept = tf.where(first < room)[:, 0]
            words_in = tf.RaggedTensor.from_value_rowids(tf.gather(scores, kept), tf.gather(rows, kept),
                                                         tf.cast(n, tf.int64))
            paths = viterbi_tf(words_in.to_tensor(), tf.cast(words_in.row_lengths(), tf.int32), crf)
            decoded = tf.RaggedTensor.from_tensor(paths, lengths=words_in.row_lengths()).flat_values
            tag_ids = tf.tensor_scatter_nd_update(tf.fill([count], outside), kept[:, None], decoded)
        last_in_row = (rows != tf.roll(rows, -1, 0)) | (tf.range(count) == count - 1)
        first_word, last_word, kind, types = head.serving_chunks(tag_ids, last_in_row, labels)
        entity_rows = tf.gather(rows, first_word)
        span = tf.gather(byte_starts, first_word)
        n64 = tf.cast(n, tf.int64)
        by_entity = lambda values: tf.RaggedTensor.from_value_rowids(values, entity_rows, n64)  # noqa: E731
        by_word = lambda values: tf.RaggedTensor.from_value_rowids(values, rows, n64)  # noqa: E731
        texts = tf.strings.substr(tf.gather(flat_text, first_word), span,
                                  tf.gather(byte_ends, last_word) - span)
        return {"tags": by_word(tf.gather(tf.constant(labels), tag_ids)).to_tensor(""),
                "word_starts": by_word(starts).to_tensor(-1), "word_ends": by_word(ends).to_tensor(-1),
                "entity_types": by_entity(tf.gather(tf.constant(types or [""]), kind)).to_tensor(""),
                "entity_texts": by_entity(texts).to_tensor(""),
                "entity_starts": by_entity(tf.gather(starts, first_word)).to_tensor(-1),
                "entity_ends": by_entity(tf.gather(ends, last_word)).to_tensor(-1)}

    return tag
