"""Where words begin, for whole-word masking.

WordPiece marks a word's later pieces with `##`, which is all google-bert's `--do_whole_word_mask` looks at.
Chinese has one character a token and never `##`, so there the flag did nothing (google-research/bert#780).
The words come from elsewhere instead:
- a segmenter: `jieba` (pure Python, its own dictionary), as bert4keras' `word_segment`;
- text already segmented, words separated by spaces (`pretokenized`);
- a reference file as transformers' `run_chinese_ref.py` writes (`RefFile`; in the dynamic path,
  `check_ref_files` first, then `lines_with_refs`).

The token ids never change: text is cut where google-bert's BasicTokenizer cuts it (`split_words_tf`),
each piece is WordPiece'd as the whole line would be, and a flag per token says whether it starts a word.

Example:
    ids, starts = tokenize_with_word_starts(tokenizer, tf.constant(["使用语言模型"]), segmenter("jieba"))
    # starts[0] == [True, False, True, False, True, False]: 使用 / 语言 / 模型
"""

import json
import logging
import re

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import traced_pieces
from bert_mgpu.data.tagging_input import split_words_tf

log = logging.getLogger("bert_mgpu")

SEGMENTERS = ("none", "jieba", "pretokenized")
_warned = False  # warn_if_cjk_unsegmented: once a process
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def segmenter(name):
    """--word_segmenter -> a function of one text -> its words' (start, end) character offsets; None for
    "none". UserError when jieba is asked for and not installed."""
    if name in (None, "none"):
        return None
    if name == "pretokenized":
        return lambda text: [m.span() for m in re.finditer(r"\S+", text)]
    if name == "jieba":
        try:
            import jieba
        except ImportError:
            raise UserError("--word_segmenter=jieba: the jieba package is not installed "
                            "(pip install jieba, or bert_mgpu[zh])") from None
        jieba.setLogLevel(logging.WARNING)  # its dictionary-loading lines
        cutter = jieba.Tokenizer()  # its own, so nobody else's user dictionary changes our words
        return lambda text: [(start, end) for _, start, end in cutter.tokenize(text)]
    raise UserError(f"--word_segmenter={name}: expected one of {', '.join(SEGMENTERS)}")


def _flags(segment, text, byte_starts):
    """Whether each piece of `text` (a BasicTokenizer word, starting at these UTF-8 byte offsets) starts
    a word of `segment`: the first piece does, and every piece outside the previous piece's word."""
    position, offset = [], 0  # each character's byte offset
    for char in text:
        position.append(offset)
        offset += len(char.encode("utf-8"))
    position.append(offset)
    owner = np.full(offset + 1, -1, np.int64)  # the segment word of each byte
    for k, (start, end) in enumerate(segment(text)):
        owner[position[start]:position[end]] = k
    words = owner[np.asarray(byte_starts, np.int64)]
    return np.concatenate([[True], (words[1:] != words[:-1]) | (words[1:] < 0)]) if len(words) else \
        np.zeros([0], bool)


def tokenize_with_word_starts(tokenizer, lines, segment):
    """Strings [batch] -> (ids, starts), both ragged [batch, (tokens)]: the ids `tokenizer(lines)` gives,
    and whether each token starts a word of `segment` (the first WordPiece of its first BasicTokenizer
    piece). TensorFlow ops around one numpy_function, so it runs eagerly or inside tf.data."""
    words, byte_starts, _ = split_words_tf(lines)
    pieces = tokenizer(words.flat_values)
    if not isinstance(pieces, tf.RaggedTensor):
        pieces = tf.ragged.constant(pieces, dtype=tf.int32)

    def flags(texts, starts, lengths):
        out, at = [], 0
        for text, n in zip(texts, lengths):
            out.append(_flags(segment, text.decode("utf-8"), starts[at:at + n]))
            at += n
        return np.concatenate(out).astype(bool) if out else np.zeros([0], bool)

    word_starts = tf.numpy_function(flags, [lines, byte_starts.flat_values, byte_starts.row_lengths()], tf.bool,
                                    stateful=False)
    word_starts = tf.ensure_shape(word_starts, [None])
    first = tf.equal(tf.ragged.range(pieces.row_lengths()), 0)  # a word's first WordPiece
    token_starts = tf.logical_and(first, tf.RaggedTensor.from_row_lengths(
        tf.repeat(word_starts, pieces.row_lengths()), pieces.row_lengths()))
    starts = tf.RaggedTensor.from_row_lengths(token_starts, words.row_lengths()).merge_dims(1, 2)
    ids = tokenizer(lines)
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.ragged.constant(ids, dtype=tf.int32)
    # A line whose words' pieces do not add up to its tokens (a guard: split_words_tf reads past a NUL now)
    # keeps google-bert's words, every token but a `##` piece a start.
    same = tf.equal(starts.row_lengths(), ids.row_lengths())
    pieces_only = tf.logical_not(tf.gather(continues(tokenizer), ids)).to_tensor(True)
    dense = starts.to_tensor(False)
    dense = tf.pad(dense, [[0, 0], [0, tf.maximum(tf.shape(pieces_only)[1] - tf.shape(dense)[1], 0)]])
    dense = tf.where(same[:, None], dense[:, :tf.shape(pieces_only)[1]], pieces_only)
    return ids, tf.RaggedTensor.from_tensor(dense, lengths=ids.row_lengths())


def continues(tokenizer):
    """[vocab] bools: which tokens continue a word (`##` pieces), google-bert's only word boundaries."""
    return tf.constant([t.startswith("##") for t in tokenizer.vocab])


class RefFile:
    """A reference file as transformers' run_chinese_ref.py writes it: for each non-blank line of the
    corpus, a JSON list of the token positions (counting [CLS] as 0) that continue a word.

    Example:
        ref = RefFile("ref.txt", "corpus.txt")
        starts = ref.starts(len(ids))     # for the corpus's next non-blank line
    """

    def __init__(self, path, corpus):
        self.path, self.corpus = path, corpus
        try:
            self._file = open(path, encoding="utf-8")
        except OSError as e:
            raise UserError(f"{path}: cannot read the reference file ({e.strerror})") from None
        self.line = 0

    def starts(self, n_tokens):
        """The next line's word starts for a line of `n_tokens` tokens."""
        raw = self._file.readline()
        self.line += 1
        if not raw:
            raise UserError(f"{self.path}:{self.line}: the reference file ends before {self.corpus} (one line "
                            "a non-blank corpus line)")
        try:
            positions = json.loads(raw)
            if not isinstance(positions, list) or not all(isinstance(p, int) for p in positions):
                raise ValueError
        except ValueError:
            raise UserError(f"{self.path}:{self.line}: expected a JSON list of token positions, got "
                            f"{raw.strip()[:60]!r}") from None
        starts = [True] * n_tokens
        for p in positions:
            if not 1 <= p <= n_tokens:
                raise UserError(f"{self.path}:{self.line}: position {p} is outside the line's {n_tokens} tokens "
                                f"(1-{n_tokens}, [CLS] being 0); is this the reference file of {self.corpus}, "
                                "made with this vocabulary?")
            starts[p - 1] = False
        return starts

    def close(self):
        """Close it; a reference file longer than its corpus is a UserError."""
        extra = self._file.readline()
        self._file.close()
        if extra.strip():
            raise UserError(f"{self.path}:{self.line + 1}: the reference file has more lines than {self.corpus} "
                            "has non-blank lines")


def _nonblank_lines(path, chunk):
    """Lists of at most `chunk` of a corpus file's non-blank lines (bytes), as the dynamic path reads them."""
    batch = []
    with tf.io.gfile.GFile(path, "rb") as f:
        for raw in f:
            if raw.strip():
                batch.append(raw.rstrip(b"\r\n"))
                if len(batch) == chunk:
                    yield batch
                    batch = []
    if batch:
        yield batch


def check_ref_files(files, refs, tokenizer, chunk=8192):
    """Each corpus file read beside its reference file, every line tokenized: UserError naming the reference
    file and line where they disagree (before any step, as create_pretraining_data.py finds it)."""
    if len(refs) != len(files):
        raise UserError(f"--ref_file: {len(refs)} reference file(s) for {len(files)} input file(s); give one an "
                        "input file, in the order of the input files")
    pieces = traced_pieces(tokenizer)
    for path, ref_path in zip(files, refs):
        ref = RefFile(ref_path, path)
        for batch in _nonblank_lines(path, chunk):
            for n in pieces(tf.constant(batch)).row_lengths().numpy():
                ref.starts(int(n))
        ref.close()


def lines_with_refs(files, refs):
    """(line, positions that continue a word) for every line of each corpus file, its reference file's
    positions beside each non-blank line (none beside a blank one): for tf.data.Dataset.from_generator."""
    for path, ref_path in zip(files, refs):
        with tf.io.gfile.GFile(path, "rb") as f, open(ref_path, encoding="utf-8") as ref:
            for raw in f:
                line = raw.rstrip(b"\r\n")
                yield line, np.array(json.loads(ref.readline()) if line.strip() else [], np.int32)


def starts_from_refs(ids, positions):
    """Ragged ids [lines, (tokens)] and positions [lines, (continuing)] (1-based, [CLS] being 0) -> ragged
    starts [lines, (tokens)]: true where a token starts a word."""
    flat = positions.flat_values - 1 + tf.gather(tf.cast(ids.row_starts(), tf.int32), positions.value_rowids())
    starts = tf.tensor_scatter_nd_update(tf.ones([tf.size(ids.flat_values)], tf.bool), flat[:, None],
                                         tf.zeros_like(flat, tf.bool))
    return ids.with_flat_values(starts)


def warn_if_cjk_unsegmented(lines, whole_word, segmenter_name, where):
    """One warning (a process) when whole-word masking meets Chinese text with no segmenter: it does
    nothing there. True once warned."""
    global _warned
    if _warned:
        return True
    if whole_word and segmenter_name in (None, "none") and any(_CJK.search(line) for line in lines):
        _warned = True
        log.warning("%s: --do_whole_word_mask groups only ## pieces, and Chinese characters have none: on this "
                    "text it masks single characters. Add --word_segmenter=jieba (or pretokenized; "
                    "create_pretraining_data.py also takes --ref_file) to mask whole Chinese words.", where)
        return True
    return False
