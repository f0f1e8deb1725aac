"""A token classifier's SavedModel endpoint: raw text in, each word's tag and the entities out, in the graph.

The words are cut as `split_words` cuts them and WordPiece'd; a text longer than a window is read in windows
`doc_stride` pieces apart, each word tagged from the window where it has most context (run_squad's rule, as
`BertTagger.predict` does on the host); with a CRF, each window's words are decoded together (Viterbi) and a
word takes its tag from the window that owns it.
"""

import tensorflow as tf

from bert_mgpu.data.tagging_input import spans_in_graph, split_words_tf
from bert_mgpu.model.crf import viterbi_tf


def _chars(text, byte_offsets):
    return tf.strings.length(tf.strings.substr(text, tf.zeros_like(byte_offsets), byte_offsets), unit="UTF8_CHAR")


def tagger_endpoint(trained, tokenizer, model, crf=None):
    """The `serving_default` function of `trained` (a tagger): text [n] -> tags, word offsets, entities.
    `crf`: the transitions variable of a CRF tagger."""
    labels = list(trained.labels)
    head = trained.head
    room, pad = trained.max_seq_length - 2, tokenizer.pad_id
    stride = int(trained.facts.get("doc_stride") or room // 2)

    def tag(text):
        n = tf.shape(text)[0]
        words, byte_starts, byte_ends = split_words_tf(text)
        rows64 = words.value_rowids()
        rows = tf.cast(rows64, tf.int32)
        flat_text = tf.gather(text, rows)
        byte_starts, byte_ends = byte_starts.flat_values, byte_ends.flat_values
        starts, ends = _chars(flat_text, byte_starts), _chars(flat_text, byte_ends)
        pieces = tokenizer(words.flat_values)  # [words, (pieces)]; a word with none reads as [UNK]
        plus = tf.concat([pieces, tf.RaggedTensor.from_tensor(tf.fill([tf.shape(rows)[0], 1], tokenizer.unk_id))], 1)
        pieces = tf.ragged.boolean_mask(plus, tf.ragged.range(plus.row_lengths()) < tf.maximum(
            pieces.row_lengths(), 1)[:, None])
        counts = tf.cast(pieces.row_lengths(), tf.int32)
        first_piece = tf.cumsum(counts, exclusive=True)  # each word's first piece among all the texts' pieces
        total = tf.reduce_sum(counts)
        word_at = tf.tensor_scatter_nd_update(tf.fill([total], -1), first_piece[:, None], tf.range(tf.size(rows)))
        per_text = tf.RaggedTensor.from_row_splits(pieces.flat_values, tf.gather(
            tf.concat([first_piece, [total]], 0), tf.cast(words.row_splits, tf.int32)))
        # The windows: each text's pieces `stride` apart, `room` at most (spans_in_graph, as make_windows).
        text_of, start, length = spans_in_graph(tf.cast(per_text.row_lengths(), tf.int32), room, stride)
        where = (tf.gather(tf.cast(per_text.row_splits, tf.int32), text_of)[:, None]
                 + tf.cast(tf.ragged.range(start, start + length), tf.int32)).flat_values  # flat piece of each slot
        windows = tf.shape(text_of)[0]
        one = lambda v: tf.fill([windows, 1], tf.cast(v, per_text.dtype))  # noqa: E731
        tokens = tf.concat([one(tokenizer.cls_id), tf.RaggedTensor.from_row_lengths(
            tf.gather(per_text.flat_values, where), tf.cast(length, tf.int64)), one(tokenizer.sep_id)], 1)
        ids = tf.cast(tokens.to_tensor(pad), tf.int32)
        logits = tf.cast(model({"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": ids != pad},
                               training=False), tf.float32)
        # Most context: a piece's score in each window holding it; the first window with the best owns it.
        window = tf.repeat(tf.range(windows), length)
        i = tf.cast(tf.ragged.range(length).flat_values, tf.int32)
        span = tf.repeat(length, length)
        score = tf.cast(tf.minimum(i, span - 1 - i), tf.float32) + 0.01 * tf.cast(span, tf.float32)
        best = tf.math.unsorted_segment_max(score, where, total)
        owner = tf.math.unsorted_segment_min(tf.where(score == tf.gather(best, where), window, 2**30), where, total)
        word = tf.gather(word_at, where)
        firsts = tf.where(word >= 0)[:, 0]  # the slots holding a word's first piece, window by window
        scores = tf.gather_nd(logits, tf.stack([tf.gather(window, firsts), tf.gather(i, firsts) + 1], 1))
        if crf is None:
            chosen = tf.argmax(scores, -1, output_type=tf.int32)
        else:  # each window's words decoded together
            by_window = tf.RaggedTensor.from_value_rowids(scores, tf.gather(window, firsts), windows)
            paths = viterbi_tf(by_window.to_tensor(), tf.cast(by_window.row_lengths(), tf.int32), crf)
            chosen = tf.RaggedTensor.from_tensor(paths, lengths=by_window.row_lengths()).flat_values
        owned = tf.gather(window, firsts) == tf.gather(owner, tf.gather(where, firsts))
        tag_ids = tf.scatter_nd(tf.boolean_mask(tf.gather(word, firsts), owned)[:, None],
                                tf.boolean_mask(chosen, owned), [tf.size(rows)])
        count = tf.size(rows)
        last_in_row = (rows != tf.roll(rows, -1, 0)) | (tf.range(count) == count - 1)
        first_word, last_word, kind, types = head.serving_chunks(tag_ids, last_in_row, labels)
        entity_rows = tf.gather(rows64, first_word)
        span_start = tf.gather(byte_starts, first_word)
        n64 = tf.cast(n, tf.int64)
        by_entity = lambda values: tf.RaggedTensor.from_value_rowids(values, entity_rows, n64)  # noqa: E731
        by_word = lambda values: tf.RaggedTensor.from_value_rowids(values, rows64, n64)  # noqa: E731
        texts = tf.strings.substr(tf.gather(flat_text, first_word), span_start,
                                  tf.gather(byte_ends, last_word) - span_start)
        return {"tags": by_word(tf.gather(tf.constant(labels), tag_ids)).to_tensor(""),
                "word_starts": by_word(starts).to_tensor(-1), "word_ends": by_word(ends).to_tensor(-1),
                "entity_types": by_entity(tf.gather(tf.constant(types or [""]), kind)).to_tensor(""),
                "entity_texts": by_entity(texts).to_tensor(""),
                "entity_starts": by_entity(tf.gather(starts, first_word)).to_tensor(-1),
                "entity_ends": by_entity(tf.gather(ends, last_word)).to_tensor(-1)}

    return tag
