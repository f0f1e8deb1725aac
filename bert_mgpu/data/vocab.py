"""A WordPiece vocabulary (google-bert's vocab.txt format) learned from raw text, for from-scratch runs.

tf-text's WordPiece learner (the one keras-hub's `compute_word_piece_vocabulary` calls) does the learning,
on words cut as keras-hub cuts them: the text through the Google normalization the tokenizer applies
(tokenization.normalize), streamed with tf.data, CJK characters one a word as google-bert's BasicTokenizer
splits them. Called with its defaults the learner keeps only the 1,000 most frequent characters, which
on Chinese text leaves common characters out (a word with one of them becomes [UNK]) and fills the room
with `##汉` pieces no tokenizer ever makes of a CJK character. Here every character seen at least
`min_count` times is a token, with its `##` form outside CJK, and pieces seen `min_count` times may enter.
The special tokens come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.

Example:
    build_vocab(["corpus.txt"], vocab_size=8000, output_file="vocab.txt", do_lower_case=True)
"""

import collections
import logging
import os

import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.pretraining_input import expand_files
from bert_mgpu.data.tokenization import SPECIAL_TOKENS, is_cjk, normalize

log = logging.getLogger("bert_mgpu")

MAX_TOKEN_LENGTH = 50  # the learner's: a longer word is not counted


def build_vocab(input_files, vocab_size, output_file, do_lower_case=True, invalid_utf8="error", min_count=2):
    """Learn a vocabulary of at most `vocab_size` tokens and write it; returns the token list.

    invalid_utf8: "error" (name the file and line) or "replace" (U+FFFD, lines counted).
    min_count: a character seen this many times is always a token; a word or piece needs as many to enter.
    """
    if storage.isdir(output_file):
        raise UserError(f"--output_file={output_file} is a directory; give the vocab.txt file to write")
    parent = os.path.dirname(os.path.abspath(output_file)) if not storage.is_remote(output_file) else None
    if parent and not os.path.isdir(parent):
        raise UserError(f"--output_file={output_file}: directory {parent} does not exist")
    files = expand_files(input_files)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"--vocab_size={vocab_size}: must be above the {len(SPECIAL_TOKENS)} special tokens")
    if min_count < 1:
        raise UserError(f"--min_count={min_count}: must be at least 1")
    if not any([check_utf8(path, invalid_utf8) for path in files]):
        raise UserError(f"{', '.join(files)}: no text to learn a vocabulary from (empty or blank)")
    counts = count_words(files, do_lower_case)
    if not counts:
        raise UserError(f"{', '.join(files)}: no words to learn a vocabulary from")
    vocab = learn(counts, vocab_size, min_count)
    if len(vocab) < vocab_size:
        log.warning("the vocabulary has %d tokens, fewer than the %d asked: the text holds no more words and pieces "
                    "seen at least %d times (--min_count); a bert_config.json for it takes vocab_size=%d", len(vocab),
                    vocab_size, min_count, len(vocab))
    storage.write_atomic(output_file, "".join(t + "\n" for t in vocab))
    return vocab


def count_words(files, do_lower_case):
    """Counter of the words of `files`, cut as keras-hub's learner cuts them (CJK one character a word)."""
    from keras_hub.src.tokenizers.word_piece_tokenizer import pretokenize
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

    words = tf.data.TextLineDataset(files).batch(1024).map(
        lambda t: pretokenize(normalize(t, do_lower_case), lowercase=False, strip_accents=False, split=True,
                              split_on_cjk=True), num_parallel_calls=tf.data.AUTOTUNE)
    try:
        return learner.count_words(words)
    except StopIteration:  # the learner's way of saying it counted no word
        return collections.Counter()


def learn(counts, vocab_size, min_count):
    """The specials, every character seen `min_count` times (with its `##` form, but for a CJK character,
    always a word of its own), then the learner's words and pieces by count, at most `vocab_size`."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

    chars = collections.Counter()
    for word, n in counts.items():
        if len(word) <= MAX_TOKEN_LENGTH and word not in SPECIAL_TOKENS:
            for c in word:
                chars[c] += n
    kept = sorted(c for c, n in chars.items() if n >= min_count)
    if not kept:
        raise UserError(f"the text has no character seen at least {min_count} times (--min_count); lower it")
    must = _must(kept)
    if len(must) > vocab_size:
        fits = _fitting(chars, vocab_size)
        raise UserError(f"--vocab_size={vocab_size}: the text has {len(kept)} characters seen at least {min_count} "
                        f"times (--min_count), {len(must)} tokens with their ## forms and the specials; raise "
                        "--vocab_size" + (f", or --min_count to {fits[0]}, which keeps {fits[1]} characters"
                                          if fits else ""))
    cjk = sum(is_cjk(c) for c in kept)  # the learner adds a ## form of each: room made for them, then cut
    learned = learner.learn(counts, vocab_size + cjk, list(SPECIAL_TOKENS), lower_thresh=min_count,
                            max_token_length=MAX_TOKEN_LENGTH, max_unique_chars=len(kept), include_joiner_token=True,
                            joiner="##")
    taken = set(must)
    rest = [t for t in learned if t not in taken and not (t.startswith("##") and len(t) == 3 and is_cjk(t[2]))]
    return (must + rest)[:vocab_size]


def _must(chars):
    """The tokens every vocabulary of these characters holds: the specials, each character, and its ## form
    but for a CJK character."""
    return list(SPECIAL_TOKENS) + list(chars) + ["##" + c for c in chars if not is_cjk(c)]


def _fitting(chars, vocab_size):
    """(the lowest --min_count whose characters fit in `vocab_size`, how many it keeps), or None."""
    for n in sorted(set(chars.values())):
        kept = [c for c, k in chars.items() if k >= n]
        if len(_must(kept)) <= vocab_size:
            return n, len(kept)
    return None


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
