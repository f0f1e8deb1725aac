"""Long documents for the sentence heads: every text cut into windows of max_seq_length pieces, `doc_stride`
pieces apart, and the windows' outputs pooled back into one per document.

Training sees every window, each carrying its document's label and a weight, its share of the document
(`window_weight`): the loss is then the mean over documents, each counting once however long it is, as
evaluation scores it (the alternative, a document's windows in one batch, would make the batch size vary
with the documents' lengths). Evaluation and prediction run every window once and pool each document's
logits with `pooling` (mean or max), one row per document in input order.

Example:
    cut = cut_documents(tokenizer, ["a very long text ...", "another"], 512, 256)
    pooled = windows.pool(window_logits, cut.doc_of, 2, "mean")   # bert_mgpu.data.windows
"""

import dataclasses

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import (
    examples_to_arrays,
    length_batches,
    shuffled_rows,
    sorted_batches,
    traced_pieces,
)
from bert_mgpu.data.tagging_input import spans, spans_in_graph

POOLINGS = ("mean", "max")


def check_windows(max_seq_length, doc_stride, pooling="mean", truncation="head", pairs=False):
    """One line for windows that cannot be made: a stride not below the room, or with --truncation or pairs."""
    room = max_seq_length - 2
    if pooling not in POOLINGS:
        raise UserError(f"--window_pooling={pooling}: one of {', '.join(POOLINGS)}")
    if not 0 < doc_stride < room:
        raise UserError(f"--doc_stride={doc_stride}: must be above 0 and below the {room} pieces of a window "
                        f"(--max_seq_length={max_seq_length} less [CLS] and [SEP]), so windows overlap")
    if truncation != "head":
        raise UserError(f"--truncation={truncation} with --doc_stride: windows keep every piece, nothing is cut")
    if pairs:
        raise UserError("--doc_stride: windows slide over single texts; this task reads sentence pairs")


@dataclasses.dataclass
class Windows:
    """Every document's windows end to end: `ids` and `segments` flat, `lengths` a window, `doc_of` each
    window's document, `count` windows a document."""

    ids: np.ndarray
    segments: np.ndarray
    lengths: np.ndarray
    doc_of: np.ndarray
    count: np.ndarray


def cut_documents(tokenizer, texts, max_seq_length, doc_stride):
    """[CLS] piece ... [SEP] windows of each text's WordPieces, `doc_stride` apart (`tagging_input.spans`)."""
    pieces = _pieces(tokenizer, texts)
    room = max_seq_length - 2
    ids, lengths, doc_of, count = [], [], [], []
    for d, row in enumerate(pieces):
        cuts = spans(len(row), room, doc_stride)
        for start, end in cuts:
            ids += [tokenizer.cls_id, *row[start:end], tokenizer.sep_id]
            lengths.append(end - start + 2)
            doc_of.append(d)
        count.append(len(cuts))
    ids = np.array(ids, np.int32)
    return Windows(ids, np.zeros_like(ids), np.array(lengths, np.int64), np.array(doc_of, np.int32),
                   np.array(count, np.int64))


def _pieces(tokenizer, texts, chunk=4096):
    fn = traced_pieces(tokenizer)
    out = []
    for i in range(0, len(texts), chunk):
        out += [row.tolist() for row in fn(tf.constant(texts[i:i + chunk])).numpy()]
    return out


def window_dataset(examples, tokenizer, label_list, max_seq_length, doc_stride, batch_size, training, seed=None,
                   source="data", encode_labels=None, rows_multiple=None, windows=None, buckets=False):
    """As input_pipeline.make_dataset, over the examples' windows (`windows`: already cut): training
    shuffles them (each with its document's label and `window_weight`), otherwise every window once with
    its position among the windows as `index` -> (dataset, Windows)."""
    arrays = examples_to_arrays(examples, label_list, source, encode_labels)
    if windows is None:
        windows = cut_documents(tokenizer, list(arrays["text_a"]), max_seq_length, doc_stride)
    labels = arrays["label"][windows.doc_of]
    if not training:
        return sorted_batches(windows.ids, windows.segments, windows.lengths, labels, tokenizer, max_seq_length,
                              batch_size, rows_multiple=rows_multiple), windows
    # A window's share of its document, scaled so the weights' mean is 1: a batch's loss stays a mean.
    weight = (len(windows.lengths) / len(examples)) / windows.count[windows.doc_of]
    ds = shuffled_rows({"token_ids": windows.ids, "segment_ids": windows.segments}, windows.lengths,
                       {"label": labels, "index": np.arange(len(labels), dtype=np.int32),
                        "window_weight": weight.astype(np.float32)}, seed)
    return length_batches(ds, tokenizer.pad_id, max_seq_length, batch_size, labels, buckets=buckets), windows


def windows_in_graph(tokenizer, text, max_seq_length, doc_stride):
    """`cut_documents` in TensorFlow ops, for a SavedModel: string tensor [n] -> (token_ids, segment_ids,
    padding_mask) [windows, width] and each window's text [windows]."""
    pieces = tokenizer(text)
    doc_of, first, length = spans_in_graph(tf.cast(pieces.row_lengths(), tf.int32), max_seq_length - 2, doc_stride)
    at = tf.gather(tf.cast(pieces.row_splits[:-1], tf.int32), doc_of)[:, None] + tf.ragged.range(first, first + length)
    one = lambda v: tf.fill([tf.shape(doc_of)[0], 1], tf.cast(v, pieces.dtype))  # noqa: E731
    tokens = tf.concat([one(tokenizer.cls_id), tf.gather(pieces.flat_values, at), one(tokenizer.sep_id)], 1)
    ids = tf.cast(tokens.to_tensor(tokenizer.pad_id), tf.int32)
    real = tf.range(tf.shape(ids)[1])[None, :] < tf.cast(tokens.row_lengths(), tf.int32)[:, None]
    return ids, tf.zeros_like(ids), real, doc_of


def pool_in_graph(logits, doc_of, documents, pooling="mean"):
    """`pool` in TensorFlow ops."""
    if pooling == "mean":
        return tf.math.unsorted_segment_mean(logits, doc_of, documents)
    return tf.math.unsorted_segment_max(logits, doc_of, documents)
