"""WordPiece tokenization equal to google-research/bert's FullTokenizer, as TensorFlow ops.

keras-hub's WordPieceTokenizer splits on whitespace, punctuation and CJK characters exactly as Google's
BasicTokenizer does, but its `lowercase=True` is NFKC case folding (`…` -> `...`, `ß` -> `ss`, `，` -> `,`)
and it keeps the control characters Google drops, so its ids differ from the ones a released checkpoint was
trained with. `normalize` therefore does Google's own steps in tf.strings ops (clean control characters,
map Unicode spaces to " ", Unicode lower-case, NFD + drop combining marks), and keras-hub's tokenizer does
the splitting and WordPiece on the normalized text. Everything runs inside tf.data, in parallel.

Example:
    tok = FullTokenizer("vocab.txt", do_lower_case=True)
    tok(["Hello, Wörld!"])  # ragged ids, the same as google-bert's FullTokenizer
"""

import collections

import tensorflow as tf
import tensorflow_text as tf_text

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.words import is_cjk  # noqa: F401 (tokenization.is_cjk, as before)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def normalize(text, do_lower_case):
    """Google BasicTokenizer's normalization of a string tensor (any shape), before splitting."""
    text = tf.strings.regex_replace(text, r"[\t\n\r\p{Zs}]", " ")  # whitespace first: \t\n\r are Cc
    text = tf.strings.regex_replace(text, r"[\p{C}\x{FFFD}]", "")  # NUL, U+FFFD, control/format chars
    if do_lower_case:
        text = tf.strings.lower(text, encoding="utf-8")
        text = tf_text.normalize_utf8(text, "NFD")
        text = tf.strings.regex_replace(text, r"\p{Mn}", "")
    return text


def read_vocab(path):
    """vocab.txt -> list of tokens, one per line (Google's format)."""
    try:
        tokens = [line.rstrip("\r") for line in storage.read_text(path).split("\n")]
    except OSError as e:
        raise UserError(f"{path}: cannot read vocabulary ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: vocabulary is not UTF-8 ({e.reason} at byte {e.start})") from None
    while tokens and not tokens[-1]:
        tokens.pop()
    for special in ("[UNK]", "[CLS]", "[SEP]"):
        if special not in tokens:
            raise UserError(f"{path}: vocabulary has no {special} token; is this a BERT vocab.txt?")
    return tokens


class WordPieces:
    """What a tokenizer's vocabulary and casing alone decide: keras-hub's WordPiece layer, the special ids and
    the functions traced over them (`traced`, filled by data/input_pipeline.py). Tokenizers of the same
    vocabulary share one (`shared`), so loading a model again in a process traces nothing again: a
    notebook's next fit, a resident process's next script run."""

    def __init__(self, vocab, do_lower_case):
        import keras_hub

        self.do_lower_case = do_lower_case
        self._wordpiece = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=list(vocab), lowercase=False, strip_accents=False, split=True, split_on_cjk=True,
            suffix_indicator="##", oov_token="[UNK]", dtype="int32",
        )
        ids = {t: i for i, t in enumerate(vocab)}
        self.pad_id = ids.get("[PAD]", 0)
        self.cls_id, self.sep_id, self.unk_id = ids["[CLS]"], ids["[SEP]"], ids["[UNK]"]
        self.mask_id = ids.get("[MASK]")
        self.traced = {}  # key -> a tf.function over this vocabulary
        self._eager = None  # __call__'s traced function, made on first eager call

    def __call__(self, texts):
        """String tensor [batch] -> ragged int32 ids [batch, (tokens)].

        Called eagerly, keras-hub's layer would take its pure-Python path (13 times slower on single words,
        NOTES item 53), so eager calls run the TensorFlow ops tf.data runs, in one traced function."""
        if tf.inside_function():
            return self._ids(texts)
        if self._eager is None:
            self._eager = tf.function(self._ids, reduce_retracing=True, autograph=False)
        return self._eager(tf.convert_to_tensor(texts, tf.string))

    def _ids(self, texts):
        return self._wordpiece(normalize(texts, self.do_lower_case))


_SHARED = collections.OrderedDict()  # (vocab, do_lower_case) -> WordPieces, the most recently used last
SHARED_VOCABULARIES = 4


def shared(vocab, do_lower_case):
    """The WordPieces of this vocabulary and casing, made once while it is among the last
    SHARED_VOCABULARIES used (their traced functions stay with them)."""
    key = (tuple(vocab), bool(do_lower_case))
    if key in _SHARED:
        _SHARED.move_to_end(key)
    else:
        _SHARED[key] = WordPieces(key[0], key[1])
        while len(_SHARED) > SHARED_VOCABULARIES:
            _SHARED.popitem(last=False)
    return _SHARED[key]


class FullTokenizer:
    """Text -> WordPiece ids, as google-bert's FullTokenizer (keras-hub WordPiece under the hood)."""

    def __init__(self, vocab_file, do_lower_case=True):
        self.vocab = read_vocab(vocab_file)
        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.pieces = shared(self.vocab, do_lower_case)
        self.pad_id, self.cls_id, self.sep_id = self.pieces.pad_id, self.pieces.cls_id, self.pieces.sep_id
        self.unk_id, self.mask_id = self.pieces.unk_id, self.pieces.mask_id

    @property
    def vocab_size(self):
        return len(self.vocab)

    def __call__(self, texts):
        """String tensor [batch] -> ragged int32 ids [batch, (tokens)] (`WordPieces.__call__`)."""
        return self.pieces(texts)

    def id_lists(self, texts):
        """Python strings -> each one's ids as a Python list (tokenized in one call)."""
        return rows(self(tf.constant(list(texts), tf.string)))

    def tokenize(self, text):
        """One Python string -> list of WordPiece strings (for logs and tests)."""
        return [self.vocab[i] for i in self.id_lists([text])[0]]

    def convert_tokens_to_ids(self, tokens):
        ids = {t: i for i, t in enumerate(self.vocab)}
        return [ids.get(t, self.unk_id) for t in tokens]


def rows(ragged):
    """An eager ragged tensor [n, (k)] -> n Python lists; five times faster than `to_list()` (NOTES item 53)."""
    values, cuts = ragged.flat_values.numpy().tolist(), ragged.row_splits.numpy().tolist()
    return [values[a:b] for a, b in zip(cuts, cuts[1:])]
