"""A WordPiece vocabulary (google-bert's vocab.txt format) learned from raw text, for from-scratch runs.

keras-hub's `compute_word_piece_vocabulary` (tf-text's learner) does the learning. Around it: the text
goes through the same Google normalization the tokenizer applies (tokenization.normalize), lines are
streamed with tf.data rather than whole files read into memory, and CJK characters are split one per
word, as google-bert's BasicTokenizer splits them, so Chinese and Japanese text gives character
tokens. The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.

Example:
    build_vocab(["corpus.txt"], vocab_size=8000, output_file="vocab.txt", do_lower_case=True)
"""

import logging
import os

import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.pretraining_input import expand_files
from bert_mgpu.data.tokenization import SPECIAL_TOKENS, normalize

log = logging.getLogger("bert_mgpu")


def build_vocab(input_files, vocab_size, output_file, do_lower_case=True, invalid_utf8="error"):
    """Learn a vocabulary of at most `vocab_size` tokens and write it; returns the token list.

    invalid_utf8: "error" (name the file and line) or "replace" (U+FFFD, lines counted).
    """
    import keras_hub

    if storage.isdir(output_file):
        raise UserError(f"--output_file={output_file} is a directory; give the vocab.txt file to write")
    parent = os.path.dirname(os.path.abspath(output_file)) if not storage.is_remote(output_file) else None
    if parent and not os.path.isdir(parent):
        raise UserError(f"--output_file={output_file}: directory {parent} does not exist")
    files = expand_files(input_files)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"--vocab_size={vocab_size}: must be above the {len(SPECIAL_TOKENS)} special tokens")
    if not any([check_utf8(path, invalid_utf8) for path in files]):
        raise UserError(f"{', '.join(files)}: no text to learn a vocabulary from (empty or blank)")
    lines = tf.data.TextLineDataset(files).batch(1024).map(lambda t: normalize(t, do_lower_case))
    try:
        vocab = keras_hub.tokenizers.compute_word_piece_vocabulary(
            lines, vocab_size, lowercase=False, strip_accents=False, split=True, split_on_cjk=True,
            suffix_indicator="##", reserved_tokens=list(SPECIAL_TOKENS))
    except StopIteration:  # the learner's way of saying it counted no word
        vocab = []
    if len(vocab) <= len(SPECIAL_TOKENS):
        raise UserError(f"{', '.join(files)}: no words to learn a vocabulary from")
    if len(vocab) < vocab_size:
        logging.getLogger("bert_mgpu").warning(
            "the vocabulary has %d tokens, fewer than the %d asked: the text holds no more words and pieces frequent "
            "enough to keep; a bert_config.json for it takes vocab_size=%d", len(vocab), vocab_size, len(vocab))
    storage.write_atomic(output_file, "".join(t + "\n" for t in vocab))
    return vocab


def check_utf8(path, invalid_utf8="error", block=1 << 22):
    """Read `path` once, in blocks cut at line ends: invalid UTF-8 is an error naming the line (the
    learner would silently make U+FFFD tokens of it) or, with "replace", a warning counting the lines.
    Returns whether the file holds any text that is not white space."""
    bad, line, text, carry = [], 1, False, b""
    with tf.io.gfile.GFile(path, "rb") as f:
        while True:
            chunk = f.read(block)
            data = carry + chunk
            cut = len(data) if not chunk else data.rfind(b"\n") + 1
            part, carry = data[:cut], data[cut:]
            if part:
                try:
                    text = bool(part.decode("utf-8").strip()) or text
                except UnicodeDecodeError:
                    bad += _bad_lines(path, part, line, invalid_utf8)
                    text = True
                line += part.count(b"\n")
            if not chunk:
                break
    if bad:
        log.warning("%s: invalid UTF-8 replaced by U+FFFD on %d line(s), the first at line %d", path, len(bad),
                    bad[0])
    return text


def _bad_lines(path, part, first_line, invalid_utf8):
    bad = []
    for i, raw in enumerate(part.split(b"\n")):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if invalid_utf8 != "replace":
                raise UserError(f"{path}:{first_line + i}: invalid UTF-8 at byte {e.start + 1} of the line "
                                f"({e.reason}); fix the file or pass --invalid_utf8=replace") from None
            bad.append(first_line + i)
    return bad
