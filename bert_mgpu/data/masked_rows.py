"""Texts -> rows for the masked-LM scorer (model/mlm_scorer.py): every token masked in turn (pseudo-
perplexity), or the [MASK]s a text already has (fill-mask).

A row is [CLS] tokens [SEP] with the positions the head reads and the token expected at each (-1: none).
Rows are batched by length, every row once with its index, so copies of one text spread over every tower.

Example:
    ids = [encode(tokenizer, t) for t in texts]
    rows, owners = masked_copies(ids, tokenizer)        # owners[r] = (text, token)
    dataset = row_dataset(rows, tokenizer, batch_size=64, rows_multiple=towers.batch(1))
"""

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError

MASK_TEXT = "[MASK]"


def encode(tokenizer, text):
    """A text's WordPiece ids; "[MASK]" written in it becomes the [MASK] token (the tokenizer alone would cut
    it into "[", "mask", "]")."""
    parts = text.split(MASK_TEXT)
    pieces = tokenizer.id_lists(parts)
    ids = list(pieces[0])
    for part in pieces[1:]:
        ids += [tokenizer.mask_id, *part]
    return [int(i) for i in ids]


def check_length(ids, max_seq_length, what):
    """UserError when a text's tokens and [CLS] [SEP] do not fit."""
    for i, row in enumerate(ids):
        if len(row) + 2 > max_seq_length:
            raise UserError(f"{what} {i + 1}: {len(row)} tokens; with [CLS] and [SEP] longer than "
                            f"--max_seq_length={max_seq_length}")


def masked_copies(ids, tokenizer):
    """One row per token of each text, that token masked -> (rows, owners): owners[r] = (text, token)."""
    rows, owners = [], []
    for i, row in enumerate(ids):
        for t, token in enumerate(row):
            copy = [tokenizer.cls_id, *row, tokenizer.sep_id]
            copy[t + 1] = tokenizer.mask_id
            rows.append((copy, [t + 1], [token]))
            owners.append((i, t))
    return rows, owners


def mask_rows(ids, tokenizer):
    """One row per text, reading its [MASK]s -> rows; UserError naming a text without one."""
    rows = []
    for i, row in enumerate(ids):
        positions = [t + 1 for t, token in enumerate(row) if token == tokenizer.mask_id]
        if not positions:
            raise UserError(f"text {i + 1}: no {MASK_TEXT} to fill")
        rows.append(([tokenizer.cls_id, *row, tokenizer.sep_id], positions, [-1] * len(positions)))
    return rows


def row_dataset(rows, tokenizer, batch_size, rows_multiple=1):
    """Rows -> batches (features, label, index) as Trainer.predict_logits reads them: sorted by length,
    padded to each batch's longest, the last padded with filler rows (index -1) to a multiple of
    `rows_multiple` (the towers)."""
    order = np.argsort([len(r[0]) for r in rows], kind="stable")

    def batches():
        for start in range(0, len(order), batch_size):
            chosen = list(order[start:start + batch_size])
            chosen += [-1] * (-len(chosen) % rows_multiple)
            width = max(len(rows[c][0]) for c in chosen if c >= 0)
            reads = max(len(rows[c][1]) for c in chosen if c >= 0)
            ids = np.full([len(chosen), width], tokenizer.pad_id, np.int32)
            positions = np.zeros([len(chosen), reads], np.int32)
            targets = np.full([len(chosen), reads], -1, np.int32)
            for k, c in enumerate(chosen):
                if c < 0:
                    ids[k, 0] = tokenizer.cls_id
                    continue
                row, at, expected = rows[c]
                ids[k, :len(row)], positions[k, :len(at)], targets[k, :len(at)] = row, at, expected
            features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != tokenizer.pad_id,
                        "mask_positions": positions, "target_ids": targets}
            yield features, np.zeros([len(chosen)], np.int32), np.array(chosen, np.int32)

    spec = {k: tf.TensorSpec([None, None], tf.bool if k == "padding_mask" else tf.int32)
            for k in ("token_ids", "segment_ids", "padding_mask", "mask_positions", "target_ids")}
    return tf.data.Dataset.from_generator(batches, output_signature=(
        spec, tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)))
