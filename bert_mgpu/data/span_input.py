"""GlobalPointer's training and prediction batches (tf.data) of the windows data/spans.py cuts.

Example:
    windows, entities = spans.span_windows(sentences, tokenizer, types, max_seq_length=128)
    dataset = span_dataset(windows, entities, tokenizer, 128, batch_size=32, training=True, seed=1)
"""

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import length_batches, shuffled_rows, sorted_batches


def span_dataset(windows, entities, tokenizer, max_seq_length, batch_size, training, seed=None,
                 rows_multiple=None, buckets=False):
    """({token_ids, segment_ids, padding_mask}, entities [batch, n, 3], index) over the windows, as
    `tagging_input.tagging_dataset` makes them: training shuffles with `seed`, repeats and makes full
    batches; otherwise every window once, sorted by length."""
    if not windows:
        raise UserError("no sentences")
    lengths = np.array([len(w.token_ids) for w in windows], np.int64)
    ids = np.concatenate([np.asarray(w.token_ids, np.int32) for w in windows])
    segments = np.zeros_like(ids)
    if not training:
        return sorted_batches(ids, segments, lengths, entities, tokenizer, max_seq_length, batch_size,
                              rows_multiple=rows_multiple)
    ds = shuffled_rows({"token_ids": ids, "segment_ids": segments}, lengths,
                       {"label": entities, "index": np.arange(len(windows), dtype=np.int32)}, seed)
    return length_batches(ds, tokenizer.pad_id, max_seq_length, batch_size, entities, buckets=buckets)
