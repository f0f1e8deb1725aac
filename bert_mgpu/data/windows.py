"""Long inputs, without TensorFlow: a sentence's WordPieces cut into windows `doc_stride` pieces apart
(google-bert run_squad's document spans), each word owned by the window where it has the most context, and
each word's prediction read from its owner; a long text's windows pooled (a classifier's); which pieces of a
text too long stay (`kept`, `pair_counts`). The tagger's training and `predict` use it (the question
answerer its spans and pieces, the classifier its cuts and pooling), and so do their ONNX and LiteRT
exports, served with no TensorFlow (io/exported*.py). A `tokenizer` here is anything with `id_lists(texts)` and
`unk_id`: bert_mgpu's FullTokenizer, or an export's tokenizer.json.

Example:
    wins = sentence_windows(0, piece_ids, first, room=126, doc_stride=63, cls_id=101, sep_id=102)
    tags = word_predictions(wins, logits, [len(words)])  # a label id per word
"""

import dataclasses

import numpy as np


@dataclasses.dataclass
class Window:
    """One model input: `token_ids` ([CLS] pieces [SEP]), `labels` (a label id on each first piece, else
    IGNORED), `words` (the word index at each first piece, else -1) and `owned` (the word indices this
    window predicts: those with the most context here)."""

    sentence: int
    token_ids: list
    labels: list
    words: list
    owned: set


# head+tail keeps this share of a text's room from its start, the rest from its end: Sun et al. 2019 ("How to
# Fine-Tune BERT for Text Classification?") found the first 128 and the last 382 pieces best at length 512.
HEAD_SHARE = (128, 510)


def pair_counts(a, b, budget):
    """How many pieces of a pair of `a` and `b` pieces stay in `budget`: the two take a piece in turn, the
    first first (tf-text's RoundRobinTrimmer, as bert_mgpu encodes; google-bert's _truncate_seq_pair keeps
    the same counts) -> (kept of a, kept of b)."""
    if a + b <= budget:
        return a, b
    kept_a = min(a, max(budget - b, (budget + 1) // 2))
    return kept_a, min(b, budget - kept_a)


def kept(pieces, keep, truncation="head"):
    """The `keep` of `pieces` that `truncation` keeps: the first (head), the last (tail), or the first
    HEAD_SHARE of them and the rest from the end (head+tail); input_pipeline.trim in TensorFlow."""
    if len(pieces) <= keep:
        return list(pieces)
    head = {"head": keep, "tail": 0}.get(truncation, keep * HEAD_SHARE[0] // HEAD_SHARE[1])
    return [*pieces[:head], *pieces[len(pieces) - (keep - head):]]


def pool(logits, doc_of, documents, pooling="mean"):
    """Windows' logits [windows, ...] -> documents' [documents, ...]: the mean or the maximum of each one's."""
    logits = np.asarray(logits)
    out = np.zeros((documents, *logits.shape[1:]), np.float32)
    if pooling == "mean":
        np.add.at(out, doc_of, logits)
        return out / np.bincount(doc_of, minlength=documents).reshape(-1, *[1] * (logits.ndim - 1))
    out.fill(-np.inf)
    np.maximum.at(out, doc_of, logits)
    return out


def word_pieces(tokenizer, words, chunk=8192):
    """The WordPiece ids of each word, tokenized in batches of `chunk` words -> [[id, ...], ...]."""
    pieces = []
    for i in range(0, len(words), chunk):
        pieces.extend(ids or [tokenizer.unk_id] for ids in tokenizer.id_lists(words[i:i + chunk]))
    return pieces


def spans(length, room, doc_stride):
    """(start, end) piece spans covering `length` pieces, `room` at most each, starts `doc_stride` apart."""
    out, start = [], 0
    while True:
        end = min(start + room, length)
        out.append((start, end))
        if end == length:
            return out
        start += doc_stride


def sentence_windows(sentence, flat, first, room, doc_stride, cls_id, sep_id):
    """The windows of one sentence: `flat` its piece ids, `first` the word index at each word's first piece
    (else -1); each window is [CLS] pieces [SEP] and owns the words that have the most context in it
    (run_squad's `_check_is_max_context`). Its labels are left None, for the caller to set."""
    cuts = spans(len(flat), room, doc_stride)
    best = {}  # word -> (score, window number): run_squad's most context
    for w, (start, end) in enumerate(cuts):
        for p in range(start, end):
            if first[p] >= 0:
                score = min(p - start, end - 1 - p) + 0.01 * (end - start)
                if first[p] not in best or score > best[first[p]][0]:
                    best[first[p]] = (score, w)
    out = []
    for w, (start, end) in enumerate(cuts):
        words_here = first[start:end]
        out.append(Window(sentence, [cls_id, *flat[start:end], sep_id], None, [-1, *words_here, -1],
                          {k for k in words_here if k >= 0 and best[k][1] == w}))
    return out


def word_predictions(windows, logits, lengths, decode=None):
    """Each sentence's label id per word, from the window that owns the word -> [np.ndarray per sentence].
    `logits`: [windows, positions, labels] (positions at least each window's length), in windows' order.
    `decode(scores [words, labels]) -> ids [words]`: a window's words decoded together (a CRF's Viterbi);
    default each word's best label."""
    out = [np.full(n, -1, np.int64) for n in lengths]
    for window, scores in zip(windows, logits, strict=True):
        firsts = [p for p, word in enumerate(window.words) if word >= 0]
        scores = np.asarray(scores)[firsts]
        chosen = scores.argmax(-1) if decode is None else decode(scores)
        for position, label in zip(firsts, chosen):
            if window.words[position] in window.owned:
                out[window.sentence][window.words[position]] = label
    missing = [n for n, tags in enumerate(out) if (tags < 0).any()]
    if missing:
        raise RuntimeError(f"sentence {missing[0]}: a word no window predicts")
    return out
