"""The question answerer's SavedModel endpoint: a question and a context as raw strings in, the answer out,
computed in the graph as `BertQuestionAnswerer.predict` computes it in Python (data/squad_input.py): the
context in windows `doc_stride` pieces apart, each piece scored only where it has most context, the best of
the n best starts and ends of every window, the answer's characters taken from the context.

Outputs per question: `answer` (text), `answer_start`, `answer_end` (character offsets, end exclusive; -1
for none), `score` (its start plus end score) and `null_odds` (a v2 model's null score minus the answer's;
the answer is "" when that exceeds the model's threshold).
"""

import tensorflow as tf

from bert_mgpu.data.tagging_input import spans_in_graph, split_words_tf


def _char_offsets(text, byte_offsets):
    """UTF-8 byte offsets into each row's text -> character offsets."""
    return tf.strings.length(tf.strings.substr(text, tf.zeros_like(byte_offsets), byte_offsets), unit="UTF8_CHAR")


def _take(values, index):
    """tf.gather with one element more: a request whose only contexts are empty has no piece (nor window)
    to gather, and its answers, none, are masked after."""
    return tf.gather(tf.concat([values, tf.zeros([1], values.dtype)], 0), index)


def _context_pieces(tokenizer, context):
    """Each context's WordPieces and the characters [start, end) each came from -> (ids, starts, ends), ragged
    [batch, (pieces)]; a word whose pieces do not spell it gives each piece the whole word."""
    words, byte_starts, byte_ends = split_words_tf(context)
    rows = tf.cast(words.value_rowids(), tf.int32)
    flat_text = tf.gather(context, rows)
    word_starts = _char_offsets(flat_text, byte_starts.flat_values)
    word_ends = _char_offsets(flat_text, byte_ends.flat_values)
    pieces = tokenizer(words.flat_values)  # [words, (pieces)]; a word with none reads as [UNK]
    plus = tf.concat([pieces, tf.RaggedTensor.from_tensor(tf.fill([tf.shape(rows)[0], 1], tokenizer.unk_id))], 1)
    pieces = tf.ragged.boolean_mask(plus, tf.ragged.range(plus.row_lengths()) < tf.maximum(
        pieces.row_lengths(), 1)[:, None])
    word_of = tf.cast(pieces.value_rowids(), tf.int32)
    within = tf.cast(tf.ragged.range(pieces.row_lengths()).flat_values, tf.int32)
    vocab = tf.constant(tokenizer.vocab)
    text = tf.gather(vocab, pieces.flat_values)
    text = tf.where(within > 0, tf.strings.regex_replace(text, "^##", ""), text)
    length = tf.strings.length(text, unit="UTF8_CHAR")
    spelled = tf.math.unsorted_segment_sum(length, word_of, tf.shape(word_starts)[0])
    has_unk = tf.math.unsorted_segment_max(tf.cast(pieces.flat_values == tokenizer.unk_id, tf.int32), word_of,
                                           tf.shape(word_starts)[0]) > 0
    exact = tf.gather((spelled == word_ends - word_starts) & ~has_unk, word_of)
    before = tf.cumsum(tf.RaggedTensor.from_row_splits(length, pieces.row_splits), axis=1, exclusive=True).flat_values
    start = tf.gather(word_starts, word_of)
    starts = tf.where(exact, start + before, start)
    ends = tf.where(exact, start + before + length, tf.gather(word_ends, word_of))
    by_text = lambda v: tf.RaggedTensor.from_row_splits(  # noqa: E731
        tf.RaggedTensor.from_row_splits(v, pieces.row_splits), words.row_splits).merge_dims(1, 2)
    return by_text(pieces.flat_values), by_text(starts), by_text(ends)


def span_endpoint(tokenizer, model, max_seq_length, max_query_length, doc_stride, n_best_size, max_answer_length,
                  version_2_with_negative, null_score_diff_threshold):
    """A function of (question, context) string tensors [batch] -> the answer's tensors (module docstring)."""
    pad = tokenizer.pad_id

    def answer(question, context):
        n = tf.shape(question)[0]
        query = tokenizer(question)[:, :max_query_length]
        ids, starts, ends = _context_pieces(tokenizer, context)
        size = tf.cast(ids.row_lengths(), tf.int32)  # context pieces a text
        room = max_seq_length - tf.cast(query.row_lengths(), tf.int32) - 3
        text_of, first, length = spans_in_graph(size, room, doc_stride)  # each window's text, start, pieces
        slot = tf.ragged.range(first, first + length)  # [windows, (pieces)]: context piece index in its text
        piece = tf.gather(tf.cast(ids.row_splits, tf.int32), text_of)[:, None] + tf.cast(slot, tf.int32)
        asked = tf.gather(query, text_of)
        one = lambda v: tf.fill([tf.shape(text_of)[0], 1], tf.cast(v, ids.dtype))  # noqa: E731
        tokens = tf.concat([one(tokenizer.cls_id), asked, one(tokenizer.sep_id),
                            tf.gather(ids.flat_values, piece), one(tokenizer.sep_id)], 1)
        offset = tf.cast(asked.row_lengths(), tf.int32) + 2  # the window's first context position
        token_ids = tf.cast(tokens.to_tensor(pad), tf.int32)
        width = tf.shape(token_ids)[1]
        position = tf.range(width)[None, :]
        real = position < tf.cast(tokens.row_lengths(), tf.int32)[:, None]
        segments = tf.cast((position >= offset[:, None]) & real, tf.int32)
        logits = model({"token_ids": token_ids, "segment_ids": segments, "padding_mask": real}, training=False)
        # Most context: a piece's score in each window holding it; the first window with the best owns it.
        i = tf.cast(tf.ragged.range(length).flat_values, tf.float32)
        span = tf.cast(tf.repeat(length, length), tf.float32)
        score = tf.minimum(i, span - 1 - i) + 0.01 * span
        where = piece.flat_values
        total = tf.shape(ids.flat_values)[0]
        best = tf.math.unsorted_segment_max(score, where, total)
        window = tf.repeat(tf.range(tf.shape(text_of)[0]), length)
        owner = tf.math.unsorted_segment_min(tf.where(score == tf.gather(best, where), window, 2**30), where, total)
        owned = tf.RaggedTensor.from_row_lengths(tf.gather(owner, where) == window, tf.cast(length, tf.int64))
        context_at = (position >= offset[:, None]) & (position < (offset + length)[:, None])
        owned_at = tf.pad(owned.to_tensor(False), [[0, 0], [0, width]])
        owned_at = tf.gather(owned_at, tf.maximum(position - offset[:, None], 0), batch_dims=1) & context_at
        low = tf.constant(-1e30, logits.dtype)
        start_logits = tf.where(real, logits[:, :, 0], low)
        end_logits = tf.where(real, logits[:, :, 1], low)
        k = min(n_best_size, max_seq_length)
        top_starts = tf.math.top_k(start_logits, tf.minimum(k, width)).indices  # ties: the earlier index first
        top_ends = tf.math.top_k(end_logits, tf.minimum(k, width)).indices
        s, e = top_starts[:, :, None], top_ends[:, None, :]
        valid = (tf.gather(owned_at, top_starts, batch_dims=1)[:, :, None]
                 & tf.gather(context_at, top_ends, batch_dims=1)[:, None, :] & (e >= s)
                 & (e - s + 1 <= max_answer_length))
        pair = (tf.gather(start_logits, top_starts, batch_dims=1)[:, :, None]
                + tf.gather(end_logits, top_ends, batch_dims=1)[:, None, :])
        pair = tf.reshape(tf.where(valid, pair, low), [tf.shape(pair)[0], -1])
        chosen = tf.argmax(pair, 1, output_type=tf.int32)  # the first of equal scores, as run_squad's stable sort
        window_best = tf.gather(pair, chosen, batch_dims=1)
        kk = tf.shape(top_ends)[1]
        start_at = tf.gather(top_starts, chosen // kk, batch_dims=1)
        end_at = tf.gather(top_ends, chosen % kk, batch_dims=1)
        text_best = tf.math.unsorted_segment_max(window_best, text_of, n)
        first_window = tf.math.unsorted_segment_min(
            tf.where(window_best == tf.gather(text_best, text_of), tf.range(tf.shape(text_of)[0]), 2**30), text_of, n)
        found = text_best > low / 2
        w = tf.where(found, first_window, 0)
        context_start = _take(first, w) - _take(offset, w)  # window position -> context piece index
        first_piece = tf.cast(ids.row_splits[:-1], tf.int32)  # each text's first piece among all
        a = first_piece + context_start + _take(start_at, w)
        b = first_piece + context_start + _take(end_at, w)
        char_start = tf.where(found, _take(starts.flat_values, tf.where(found, a, 0)), -1)
        char_end = tf.where(found, _take(ends.flat_values, tf.where(found, b, 0)), -1)
        null = tf.math.unsorted_segment_min(logits[:, 0, 0] + logits[:, 0, 1], text_of, n)
        odds = tf.where(found, null - text_best, 0.0) if version_2_with_negative else tf.zeros([n], logits.dtype)
        answered = found & (odds <= null_score_diff_threshold) if version_2_with_negative else found
        text = tf.where(answered, tf.strings.substr(context, tf.maximum(char_start, 0),
                                                    tf.maximum(char_end - char_start, 0), unit="UTF8_CHAR"), "")
        return {"answer": text, "answer_start": tf.where(answered, char_start, -1),
                "answer_end": tf.where(answered, char_end, -1), "score": tf.where(found, text_best, 0.0),
                "null_odds": odds}

    return answer
