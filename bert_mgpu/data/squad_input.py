"""Questions -> model windows, and window scores -> answers: google-bert run_squad's algorithm end to end.

A window is `[CLS] question [SEP] context pieces [SEP]`, the question cut to `max_query_length` pieces;
a context longer than the room left is read in windows `doc_stride` pieces apart, and each context piece
is scored only in the window where it has the most context (`_check_is_max_context`). The answer's
label is its first and last piece in a window that holds it whole, else [CLS] (position 0), as for a
question without an answer.

Every context piece keeps the characters it came from, so an answer's text is the context's own
characters (what run_squad's `get_final_text` recovers: lower-casing and accent stripping undone). A
word whose pieces do not spell it character for character (an [UNK], a decomposed accent) gives each
of its pieces the whole word.

Only `span_dataset` loads TensorFlow, so a question answerer's ONNX or LiteRT export uses the rest where
TensorFlow is not installed (io/exported_qa.py).

Example:
    wins = make_windows(questions, tokenizer, max_seq_length=384, max_query_length=64, doc_stride=128)
    found = best_answers(questions, wins, logits, n_best_size=20, max_answer_length=30)
    found.predictions["q1"]   # the answer's text
"""

import dataclasses

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.windows import spans, word_pieces
from bert_mgpu.data.words import split_words


@dataclasses.dataclass
class SpanWindow:
    """One model input. `offset`: where its context pieces start; `first`, `last`: the context pieces it
    holds ([first, last) of the question's pieces); `owned`: whether each of them has its most context
    here; `start`, `end`: the answer's label positions (0, 0 for none here)."""

    question: int
    token_ids: list
    segment_ids: list
    offset: int
    first: int
    last: int
    owned: np.ndarray
    start: int = 0
    end: int = 0


@dataclasses.dataclass
class Context:
    """A context's WordPieces and the characters [starts, ends) each came from."""

    ids: list
    starts: np.ndarray
    ends: np.ndarray


def check_lengths(max_seq_length, max_query_length, doc_stride):
    """One line for lengths that leave no room for the context or make windows that do not overlap."""
    room = max_seq_length - max_query_length - 3
    if max_query_length < 1 or room < 1:
        raise UserError(f"--max_query_length={max_query_length}: must be at least 1 and leave room for the "
                        f"context in --max_seq_length={max_seq_length} ([CLS], two [SEP] and one piece)")
    if not 0 < doc_stride < room:
        raise UserError(f"--doc_stride={doc_stride}: must be above 0 and below the {room} pieces left for the "
                        f"context (--max_seq_length={max_seq_length} less --max_query_length={max_query_length}, "
                        "[CLS] and two [SEP]), so windows overlap")


def contexts(tokenizer, texts):
    """Each distinct text's `Context`, cut into words as google-bert's BasicTokenizer cuts them."""
    vocab = tokenizer.vocab
    found = {text: split_words(text) for text in dict.fromkeys(texts)}
    words = [w for text in found for w, _, _ in found[text]]
    pieces, at, out = word_pieces(tokenizer, words), 0, {}
    for text, spans_here in found.items():
        ids, starts, ends = [], [], []
        for (_, first, last), piece_ids in zip(spans_here, pieces[at:at + len(spans_here)]):
            texts_here = [vocab[i][2:] if k and vocab[i].startswith("##") else vocab[i]
                          for k, i in enumerate(piece_ids)]
            exact = tokenizer.unk_id not in piece_ids and sum(map(len, texts_here)) == last - first
            position = first
            for piece_id, piece in zip(piece_ids, texts_here):
                ids.append(piece_id)
                starts.append(position if exact else first)
                position += len(piece)
                ends.append(position if exact else last)
        at += len(spans_here)
        out[text] = Context(ids, np.array(starts, np.int64), np.array(ends, np.int64))
    return out


def make_windows(questions, tokenizer, max_seq_length, max_query_length=64, doc_stride=128):
    """Windows of every question, in order -> ([SpanWindow], {context text: Context}); labelled with each
    question's first answer (`Question.answer`)."""
    check_lengths(max_seq_length, max_query_length, doc_stride)
    cut = contexts(tokenizer, [q.context for q in questions])
    asked = word_pieces(tokenizer, [q.question for q in questions])
    windows = []
    for n, q in enumerate(questions):
        query = asked[n][:max_query_length]
        context = cut[q.context]
        room = max_seq_length - len(query) - 3
        answer = q.answer
        if answer is not None:
            inside = np.flatnonzero((context.ends > answer[0]) & (context.starts < answer[1]))
            answer = (int(inside[0]), int(inside[-1])) if len(inside) else None
        cuts = spans(len(context.ids), room, doc_stride)
        best = np.zeros(len(context.ids), np.int64)  # the window each piece has most context in
        score = np.full(len(context.ids), -1.0)
        for w, (start, end) in enumerate(cuts):
            p = np.arange(start, end)
            here = np.minimum(p - start, end - 1 - p) + 0.01 * (end - start)
            better = here > score[start:end]
            score[start:end][better], best[start:end][better] = here[better], w
        offset = len(query) + 2
        for w, (start, end) in enumerate(cuts):
            window = SpanWindow(n, [tokenizer.cls_id, *query, tokenizer.sep_id, *context.ids[start:end],
                                    tokenizer.sep_id], [0] * offset + [1] * (end - start + 1), offset, start, end,
                                best[start:end] == w)
            if answer is not None and start <= answer[0] and answer[1] < end:
                window.start, window.end = answer[0] - start + offset, answer[1] - start + offset
            windows.append(window)
    return windows, cut


def span_dataset(windows, tokenizer, max_seq_length, batch_size, training, seed=None, rows_multiple=None,
                 buckets=False):
    """({token_ids, segment_ids, padding_mask}, labels [batch, 2] (start, end), index) over `windows`, as
    tagging_input.tagging_dataset makes them: training shuffled with `seed`, repeated, in full batches
    (of similar lengths with `buckets`); otherwise every window once, sorted by length."""
    from bert_mgpu.data.input_pipeline import length_batches, shuffled_rows, sorted_batches  # TensorFlow: here only

    if not windows:
        raise UserError("no questions")
    lengths = np.array([len(w.token_ids) for w in windows], np.int64)
    ids = np.concatenate([np.asarray(w.token_ids, np.int32) for w in windows])
    segments = np.concatenate([np.asarray(w.segment_ids, np.int32) for w in windows])
    labels = np.array([[w.start, w.end] for w in windows], np.int32)
    if not training:
        return sorted_batches(ids, segments, lengths, labels, tokenizer, max_seq_length, batch_size,
                              rows_multiple=rows_multiple)
    ds = shuffled_rows({"token_ids": ids, "segment_ids": segments}, lengths,
                       {"label": labels, "index": np.arange(len(windows), dtype=np.int32)}, seed)
    return length_batches(ds, tokenizer.pad_id, max_seq_length, batch_size, labels, buckets=buckets)


@dataclasses.dataclass
class Answers:
    """What run_squad writes: `predictions` {id: text}, `nbest` {id: [{text, probability, start_logit,
    end_logit, start, end}]} (character offsets, end exclusive), `null_odds` {id: null score minus the best
    answer's} (v2 only)."""

    predictions: dict
    nbest: dict
    null_odds: dict


def best_answers(questions, windows, logits, cut=None, n_best_size=20, max_answer_length=30,
                 version_2_with_negative=False, null_score_diff_threshold=0.0):
    """run_squad's `write_predictions`: the n best spans over all of a question's windows -> `Answers`.
    `logits`: [windows, positions, 2] start and end scores in windows' order; `cut`: make_windows' contexts."""
    by_question = [[] for _ in questions]
    for w, window in enumerate(windows):
        by_question[window.question].append(w)
    predictions, nbest, null_odds = {}, {}, {}
    for n, q in enumerate(questions):
        context = cut[q.context]
        found, null = [], None  # (start logit, end logit, window, start, end); the lowest null score's logits
        for w in by_question[n]:
            window, scores = windows[w], np.asarray(logits[w], np.float64)
            size = len(window.token_ids)
            start_logits, end_logits = scores[:size, 0], scores[:size, 1]
            if version_2_with_negative and (null is None or start_logits[0] + end_logits[0] < sum(null)):
                null = (start_logits[0], end_logits[0])
            stop = window.offset + window.last - window.first  # past the window's last context piece
            for i in _top(start_logits, n_best_size):
                for j in _top(end_logits, n_best_size):
                    if not (window.offset <= i <= j < stop and j - i + 1 <= max_answer_length):
                        continue
                    if not window.owned[i - window.offset]:
                        continue
                    first, last = window.first + i - window.offset, window.first + j - window.offset
                    found.append((start_logits[i], end_logits[j], int(context.starts[first]),
                                  int(context.ends[last])))
        if null is not None:
            found.append((null[0], null[1], None, None))
        found.sort(key=lambda f: f[0] + f[1], reverse=True)  # stable: ties keep window order
        kept, seen = [], set()
        for start_logit, end_logit, begin, end in found:
            if len(kept) >= n_best_size:
                break
            text = "" if begin is None else q.context[begin:end]
            if begin is not None and text in seen:
                continue
            seen.add(text)
            kept.append({"text": text, "start_logit": float(start_logit), "end_logit": float(end_logit),
                         "start": begin, "end": end})
        if version_2_with_negative and "" not in seen:
            kept.append({"text": "", "start_logit": float(null[0]), "end_logit": float(null[1]), "start": None,
                         "end": None})
        if not kept:  # no span passes the rules (run_squad's rare edge case)
            kept.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0, "start": None, "end": None})
        totals = np.array([k["start_logit"] + k["end_logit"] for k in kept])
        probabilities = np.exp(totals - totals.max())
        probabilities /= probabilities.sum()
        for k, p in zip(kept, probabilities):
            k["probability"] = float(p)
        nbest[q.qid] = kept
        answered = next((k for k in kept if k["text"]), None)
        if not version_2_with_negative:
            predictions[q.qid] = kept[0]["text"]
            continue
        if answered is None:
            null_odds[q.qid], predictions[q.qid] = 0.0, ""
            continue
        diff = float(sum(null) - answered["start_logit"] - answered["end_logit"])
        null_odds[q.qid] = diff
        predictions[q.qid] = "" if diff > null_score_diff_threshold else answered["text"]
    return Answers(predictions, nbest, null_odds)


def best_of(questions, found):
    """Each question's best answer from `best_answers`' Answers, in order: {"text", "start", "end"
    (character offsets, end exclusive), "probability"}; a v2 no-answer has text "" and no offsets."""
    out = []
    for q in questions:
        text = found.predictions[q.qid]
        best = next((k for k in found.nbest[q.qid] if k["text"] == text), found.nbest[q.qid][0])
        out.append({"text": text, "start": best["start"] if text else None, "end": best["end"] if text else None,
                    "probability": best["probability"]})
    return out


def _top(scores, n):
    """The indices of the n largest scores, largest first (ties: the earlier index first)."""
    return np.argsort(-scores, kind="stable")[:n]
