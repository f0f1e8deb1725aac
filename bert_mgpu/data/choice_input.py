"""Multiple-choice questions -> tf.data: each question a row of its choices, [choices, length] tokens, each
choice read with the context as one BERT input (Hugging Face's run_swag and CLUE's C3 baseline).

Questions with fewer choices than the widest are padded with empty choices (no [CLS], so the model's
`padding_mask[:, :, 0]` is false there and it never chooses them). Long texts are cut as google-bert cuts
a pair: the longer segment first (transformers' `longest_first`).

Example:
    rows = encode_questions(questions, tokenizer, max_seq_length=128)
    ds = choice_dataset(rows, global_batch=32, training=True, seed=1)   # (features, label, index)
"""

import dataclasses

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.choices import choice_texts  # noqa: F401 (choice_input.choice_texts, as before)
from bert_mgpu.data.input_pipeline import CHUNK, traced_encode


@dataclasses.dataclass
class EncodedChoices:
    """Every question's choices tokenized: `token_ids` and `segment_ids` [questions, choices, width] (0 where
    padded), `lengths` [questions] (its longest choice), `labels` [questions] (-1: none), `pad_id`."""

    token_ids: np.ndarray
    segment_ids: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray
    pad_id: int

    def __len__(self):
        return len(self.labels)


def encode_questions(questions, tokenizer, max_seq_length, num_choices=None):
    """Tokenize every choice of every question -> `EncodedChoices` (`num_choices`: the row width; default
    the most choices a question has)."""
    if not questions:
        raise UserError("no questions")
    width = max(len(q.choices) for q in questions)
    num_choices = num_choices or width
    if width > num_choices:
        raise UserError(f"a question has {width} choices; this model reads {num_choices} at most")
    pairs = [choice_texts(q, c) for q in questions for c in q.choices]
    encode = traced_encode(tokenizer, max_seq_length, "mixed")
    ids, segments, lengths = [], [], []
    for i in range(0, len(pairs), CHUNK):
        a, b = zip(*pairs[i:i + CHUNK])
        tokens, segs = encode(tf.constant(a), tf.constant(b), tf.constant([bool(t) for t in b]))
        ids.append(tokens.flat_values.numpy())
        segments.append(segs.flat_values.numpy())
        lengths.append(tokens.row_lengths().numpy())
    lengths = np.concatenate(lengths)
    sizes = np.array([len(q.choices) for q in questions])
    question, choice = np.repeat(np.arange(len(questions)), sizes), np.concatenate([np.arange(n) for n in sizes])
    pair = np.repeat(np.arange(len(pairs)), lengths)  # each token's pair, then its place in it
    place = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    token_ids = np.full((len(questions), num_choices, int(lengths.max())), tokenizer.pad_id, np.int32)
    segment_ids = np.zeros_like(token_ids)
    token_ids[question[pair], choice[pair], place] = np.concatenate(ids)
    segment_ids[question[pair], choice[pair], place] = np.concatenate(segments)
    per_question = np.zeros(len(questions), np.int32)
    np.maximum.at(per_question, question, lengths)
    labels = np.array([-1 if q.label is None else q.label for q in questions], np.int32)
    return EncodedChoices(token_ids, segment_ids, per_question, labels, tokenizer.pad_id)


def _model_inputs(pad_id, max_seq_length, pad_to_multiple=8):
    def to_model_inputs(batch):
        length = tf.reduce_max(batch["length"])
        rounded = tf.minimum((length + pad_to_multiple - 1) // pad_to_multiple * pad_to_multiple, max_seq_length)
        width = tf.maximum(rounded, length)
        ids = batch["token_ids"][:, :, :width]
        features = {"token_ids": ids, "segment_ids": batch["segment_ids"][:, :, :width],
                    "padding_mask": tf.not_equal(ids, pad_id)}
        return features, batch["label"], batch["index"]
    return to_model_inputs


def choice_dataset(rows, max_seq_length, batch_size, training, seed=None, rows_multiple=None):
    """(features [batch, choices, width], label [batch], index [batch]) of `rows` (`EncodedChoices`), each
    batch cut to its longest choice rounded up to 8. Training: shuffled with `seed`, repeated, full batches.
    Otherwise every question once in its order; `rows_multiple` pads the last batch with filler rows of
    index -1 (the towers each get a share)."""
    arrays = {"token_ids": rows.token_ids, "segment_ids": rows.segment_ids, "length": rows.lengths,
              "label": rows.labels, "index": np.arange(len(rows), dtype=np.int32)}
    if training and (rows.labels < 0).any():
        raise UserError("training questions need a label")
    to_inputs = _model_inputs(rows.pad_id, max_seq_length)
    if training:
        ds = tf.data.Dataset.from_tensor_slices(arrays).shuffle(len(rows), seed=seed, reshuffle_each_iteration=True)
        ds = ds.repeat().batch(batch_size, drop_remainder=True)
        return ds.map(to_inputs, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    if rows_multiple:
        extra = -(len(rows) % batch_size) % rows_multiple  # the last batch's rows up to a multiple
        if extra:
            filler = {k: np.zeros((extra,) + v.shape[1:], v.dtype) for k, v in arrays.items()}
            filler["token_ids"][:] = rows.pad_id
            filler["index"][:] = -1
            arrays = {k: np.concatenate([v, filler[k]]) for k, v in arrays.items()}
    ds = tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)
    return ds.map(to_inputs).prefetch(tf.data.AUTOTUNE)
