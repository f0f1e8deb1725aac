"""Tagged sentences -> model windows: labels on each word's first WordPiece, long sentences in strided windows.

Each word is cut into WordPieces (a word that gives none, such as a control character, stands as [UNK], so
every word has a first piece). Its label goes on the first piece; the other pieces, [CLS], [SEP] and padding
carry -1, which the loss and the metrics skip (as tf-models' tagging task and Hugging Face's run_ner do).

A sentence longer than `max_seq_length - 2` pieces is never cut short: it becomes windows of that many
pieces, each starting `doc_stride` pieces after the last (google-bert's run_squad document spans), and each
word is predicted from the window where it has the most context on both sides (run_squad's
`_check_is_max_context`), so every word gets exactly one prediction.

Example:
    wins = make_windows(sentences, tokenizer, label_list, max_seq_length=128, doc_stride=64)
    tags = word_predictions(wins, logits, [len(s.tokens) for s in sentences])  # label ids per word
"""

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import length_batches, shuffled_rows, sorted_batches
from bert_mgpu.data.windows import (  # noqa: F401 (the names tagging_input had)
    Window,
    sentence_windows,
    spans,
    word_pieces,
    word_predictions,
)
from bert_mgpu.data.words import split_words  # noqa: F401 (tagging_input.split_words, as before)
from bert_mgpu.model.tagging_objectives import TokenClassification

IGNORED = TokenClassification.IGNORED  # the label of a piece that is not a word's first


def spans_in_graph(size, room, doc_stride):
    """`spans` in TensorFlow ops, for SavedModels: pieces a text [n] and room a window (a scalar or one a
    text) -> each window's text, first piece and length [windows]."""
    n = tf.shape(size)[0]
    room = tf.broadcast_to(room, [n])
    count = 1 + tf.maximum(0, (size - room + doc_stride - 1) // doc_stride)  # windows a text
    text_of = tf.repeat(tf.range(n), count)
    first = tf.cast(tf.ragged.range(count).flat_values, tf.int32) * doc_stride
    return text_of, first, tf.minimum(tf.gather(room, text_of), tf.gather(size, text_of) - first)


def make_windows(sentences, tokenizer, label_list, max_seq_length, doc_stride=None, untagged=IGNORED):
    """Windows of every sentence, in order. Untagged sentences (tags None) carry `untagged` on each word's
    first piece (IGNORED; UNTAGGED for a distillation's unlabelled text, which the teacher tags).
    `doc_stride` defaults to half the room; it must be below the room (windows that overlap)."""
    room = max_seq_length - 2
    doc_stride = room // 2 if doc_stride is None else doc_stride
    if room < 1:
        raise UserError(f"--max_seq_length={max_seq_length}: must be at least 3")
    if not 0 < doc_stride < room:
        raise UserError(f"--doc_stride={doc_stride}: must be above 0 and below the {room} pieces a window holds "
                        f"(--max_seq_length={max_seq_length} less [CLS] and [SEP]), so windows overlap")
    ids = {label: i for i, label in enumerate(label_list)}
    words = [w for s in sentences for w in s.tokens]
    pieces, at, windows = word_pieces(tokenizer, words), 0, []
    for n, s in enumerate(sentences):
        flat, first = [], []  # piece ids; the word index at a word's first piece, else -1
        for k, word_ids in enumerate(pieces[at:at + len(s.tokens)]):
            flat.extend(word_ids)
            first.extend([k] + [-1] * (len(word_ids) - 1))
        at += len(s.tokens)
        if s.tags is not None:
            unknown = [t for t in s.tags if t not in ids]
            if unknown:
                raise UserError(f"{s.guid}: tag {unknown[0]!r} is not one of the training tags "
                                f"({', '.join(label_list)})")
        label_of = [untagged] * len(s.tokens) if s.tags is None else [ids[t] for t in s.tags]
        for w in sentence_windows(n, flat, first, room, doc_stride, tokenizer.cls_id, tokenizer.sep_id):
            w.labels = [IGNORED, *(IGNORED if k < 0 else label_of[k] for k in w.words[1:-1]), IGNORED]
            windows.append(w)
    return windows


def window_arrays(windows, max_seq_length):
    """Padded arrays for the model: token_ids, segment_ids, padding_mask and labels, [windows, max_seq_length]."""
    n = len(windows)
    token_ids = np.zeros((n, max_seq_length), np.int32)
    labels = np.full((n, max_seq_length), IGNORED, np.int32)
    for i, w in enumerate(windows):
        token_ids[i, :len(w.token_ids)] = w.token_ids
        labels[i, :len(w.labels)] = w.labels
    mask = np.arange(max_seq_length)[None, :] < np.array([len(w.token_ids) for w in windows])[:, None]
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids), "padding_mask": mask}, labels


def tagging_dataset(windows, tokenizer, max_seq_length, batch_size, training, seed=None, rows_multiple=None,
                    buckets=False):
    """A dataset of ({token_ids, segment_ids, padding_mask}, labels [batch, width], index) over `windows`, as
    `input_pipeline.make_dataset` makes for sentences: training shuffles with `seed`, repeats, makes full
    batches (of similar lengths with `buckets`); otherwise every window once, sorted by length, `index` its
    position."""
    if not windows:
        raise UserError("no sentences")
    lengths = np.array([len(w.token_ids) for w in windows], np.int64)
    ids = np.concatenate([np.asarray(w.token_ids, np.int32) for w in windows])
    labels = np.concatenate([np.asarray(w.labels, np.int32) for w in windows])
    segments = np.zeros_like(ids)
    if not training:
        return sorted_batches(ids, segments, lengths, labels, tokenizer, max_seq_length, batch_size,
                              rows_multiple=rows_multiple, per_token=True)
    ds = shuffled_rows({"token_ids": ids, "segment_ids": segments, "label": labels}, lengths,
                       {"index": np.arange(len(windows), dtype=np.int32)}, seed)
    return length_batches(ds, tokenizer.pad_id, max_seq_length, batch_size, labels, per_token=True,
                          buckets=buckets)


# split_words' rules as RE2 patterns, for the SavedModel: white space (Python's str.isspace), and the
# characters that stand alone (ASCII symbols, Unicode punctuation, the CJK blocks of is_cjk).
_SPACE = r"[\s\v\x{1c}-\x{1f}\x{85}\p{Z}]+"
_ALONE = (r"[!-/:-@\[-`{-~\p{P}\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B81F}"
          r"\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]")


def split_words_tf(text):
    """`split_words` as TensorFlow ops: strings [batch] -> (words, byte starts, byte ends), each ragged
    [batch, (words)]; offsets into the UTF-8 bytes of each text. tf-text's splitter ends a text at a NUL, so
    it splits a copy with NUL as U+0001 (neither is white space or punctuation) and the words are cut from
    the text itself."""
    safe = tf.strings.regex_replace(text, "\x00", "\x01")
    words, starts, ends = tf_text.regex_split_with_offsets(safe, f"{_SPACE}|{_ALONE}", _ALONE)
    own = tf.strings.substr(tf.gather(text, words.value_rowids()), starts.flat_values,
                            ends.flat_values - starts.flat_values)
    return words.with_flat_values(own), starts, ends
