"""Entities as spans, for GlobalPointer (model/global_pointer.py), without TensorFlow: sentences whose entities
may nest or overlap, read from files or a notebook, cut into the tagger's windows, and each window's span
scores read back into entities (its ONNX export's reader, io/exported_global_pointer.py, uses it where
TensorFlow is not installed; the training batches are data/span_input.py's).

A sentence's entities are (type, first word, end word), end exclusive. In a window a word stands at its first
WordPiece, so an entity is the span from its first word's first piece to its last word's first piece. A
long sentence is read in the tagger's strided windows (data/windows.py); an entity trains in every window
that holds both its ends, and is predicted by the window that owns its first word (the one where that word
has the most context).

Example:
    sentences = read_spans("data/cluener/train.json")          # CLUENER's JSON (overlaps kept) or any tagger file
    windows, entities = span_windows(sentences, tokenizer, ["LOC", "PER"], max_seq_length=128)
    found = window_entities(windows, scores, len(sentences))   # scores [windows, types, width, width]
"""

import dataclasses

import numpy as np

from bert_mgpu.core.entities import entities as tag_entities
from bert_mgpu.core.errors import UserError
from bert_mgpu.data import tagged, text_files
from bert_mgpu.data.inputs import check_text, rows_of
from bert_mgpu.data.windows import sentence_windows, word_pieces
from bert_mgpu.data.words import split_words


@dataclasses.dataclass
class SpanSentence:
    """A sentence's tokens and its entities [(type, first token, end token exclusive)] (None: not annotated),
    with its file line for messages."""

    guid: str
    tokens: list
    entities: list | None
    line: int = 0


def entity_types(sentences):
    """The entity types of annotated sentences, sorted: the model's outputs, in order."""
    return sorted({kind for s in sentences for kind, _, _ in (s.entities or ())})


def _checked(tokens, found, where):
    """`found` as [(type, start, end)] tuples, or UserError naming `where`."""
    out = []
    for entity in found:
        if isinstance(entity, dict):
            entity = (entity.get("type"), entity.get("start"), entity.get("end"))
        if not (isinstance(entity, list | tuple) and len(entity) == 3 and isinstance(entity[0], str) and entity[0]
                and all(isinstance(i, int) and not isinstance(i, bool) for i in entity[1:])):
            raise UserError(f"{where}: an entity is a type and its token start and end (exclusive), not {entity!r}")
        kind, start, end = entity
        if not 0 <= start < end <= len(tokens):
            raise UserError(f"{where}: {kind} entity [{start}, {end}) is outside the {len(tokens)} tokens")
        out.append((kind, start, end))
    return sorted(set(out), key=lambda e: (e[1], e[2], e[0]))


def from_tags(sentence):
    """A tagged sentence (`data.tagged.Sentence`) as a SpanSentence: its chunks, conlleval's rules."""
    found = None if sentence.tags is None else tag_entities(sentence.tags)
    return SpanSentence(sentence.guid, list(sentence.tokens), found, sentence.line)


def as_span_sentences(rows):
    """What a notebook has -> [SpanSentence]: SpanSentences, tagged Sentences, {"tokens", "entities"} (or
    "tags") dicts, (tokens, entities) pairs, lists of tokens, or raw texts (cut by `split_words`). An entity
    is (type, start, end) or {"type", "start", "end"}, token indices, end exclusive."""
    out = []
    for i, row in enumerate(rows_of(rows)):
        if isinstance(row, SpanSentence):
            out.append(row)
            continue
        if isinstance(row, tagged.Sentence) or (isinstance(row, dict) and "tags" in row):
            out.append(from_tags(tagged.as_sentences([row], split_words)[0]))
            continue
        tokens, found = row, None
        if isinstance(row, dict):
            tokens, found = row.get("tokens", row.get("text")), row.get("entities")
        elif isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], list | tuple):
            tokens, found = row
        if isinstance(tokens, str):
            tokens = [w for w, _, _ in split_words(check_text(tokens, f"input {i}"))]
        if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) and t for t in tokens):
            raise UserError(f"input {i}: expected a text, a list of tokens, (tokens, entities) or a SpanSentence")
        for token in tokens:
            check_text(token, f"input {i}")
        out.append(SpanSentence(str(i), list(tokens), None if found is None else _checked(tokens, found,
                                                                                         f"input {i}"), 0))
    return out


def read_spans(path, invalid_utf8="error", split=None, **tagged_options):
    """The sentences of one file -> [SpanSentence]: JSON lines with "text" and CLUENER's "label" ({type:
    {entity: [[start, end], ...]}}, character offsets, end inclusive; overlapping entities kept) or with
    "tokens" and "entities" ([{"type", "start", "end"}], end exclusive); any other file as the tagger reads it
    (`data.tagged.read_tagged`: CoNLL columns, segmented words, token JSON lines), its tags as entities."""
    lines = text_files.read_lines(path, invalid_utf8)
    first = lines[0][1].lstrip() if lines else ""
    spans = first.startswith("{") and any(key in first for key in ('"label"', '"entities"'))
    if not spans:
        return [from_tags(s) for s in tagged.read_tagged(path, invalid_utf8=invalid_utf8, split=split,
                                                         **tagged_options)]
    out = []
    for number, obj in text_files.read_json_lines(path, invalid_utf8):
        where = f"{path}:{number}"
        guid = f"{split}-{len(out)}" if split else str(len(out))
        if "tokens" in obj:
            tokens = obj["tokens"]
            if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
                raise UserError(f"{where}: \"tokens\" must be a list of non-empty strings")
            found = obj.get("entities")
            if found is not None and not isinstance(found, list):
                raise UserError(f"{where}: \"entities\" must be a list of {{\"type\", \"start\", \"end\"}}")
            out.append(SpanSentence(guid, tokens, None if found is None else _checked(tokens, found, where), number))
            continue
        text = obj.get("text")
        if not isinstance(text, str) or not text:
            raise UserError(f"{where}: no \"text\" string (or \"tokens\")")
        out.append(SpanSentence(guid, list(text), None if "label" not in obj else
                                _cluener_spans(text, obj["label"] or {}, where), number))
    return out


def _cluener_spans(text, label, where):
    if not isinstance(label, dict):
        raise UserError(f"{where}: \"label\" is a JSON {text_files.json_kind(label)}, not an object "
                        "{type: {entity: [[start, end], ...]}}")
    found = []
    for kind, named in label.items():
        for entity, places in (named.items() if isinstance(named, dict) else [(None, named)]):
            if not (isinstance(places, list) and all(isinstance(p, list) and len(p) == 2 and all(
                    isinstance(i, int) and not isinstance(i, bool) for i in p) for p in places)):
                raise UserError(f"{where}: {kind} {entity!r}: expected a list of [start, end] integer pairs")
            for start, end in places:
                if not 0 <= start <= end < len(text) or text[start:end + 1] != entity:
                    raise UserError(f"{where}: {kind} {entity!r} at [{start}, {end}] is {text[start:end + 1]!r} "
                                    "in the text")
                found.append((kind, start, end + 1))
    return sorted(set(found), key=lambda e: (e[1], e[2], e[0]))


def check_types(sentences, types, path):
    """UserError naming the file and line of the first entity type outside `types` (the model's)."""
    known = set(types)
    for s in sentences:
        for kind, _, _ in s.entities or ():
            if kind not in known:
                raise UserError(f"{path}:{s.line}: entity type {kind!r} is not one of the model's "
                                f"({', '.join(types)})")


def span_windows(sentences, tokenizer, types, max_seq_length, doc_stride=None):
    """(windows, entities [windows, most entities a window holds, 3]): each window's entities as (type
    index, start position, end position), both ends inclusive, rows of -1 after its last."""
    room = max_seq_length - 2
    doc_stride = room // 2 if doc_stride is None else doc_stride
    if room < 1 or not 0 < doc_stride < room:
        raise UserError(f"--doc_stride={doc_stride}: must be above 0 and below the {room} pieces a window holds "
                        f"(--max_seq_length={max_seq_length} less [CLS] and [SEP])")
    index = {kind: i for i, kind in enumerate(types)}
    pieces = word_pieces(tokenizer, [w for s in sentences for w in s.tokens])
    at, windows, held = 0, [], []
    for n, s in enumerate(sentences):
        flat, first = [], []
        for k, ids in enumerate(pieces[at:at + len(s.tokens)]):
            flat.extend(ids)
            first.extend([k] + [-1] * (len(ids) - 1))
        at += len(s.tokens)
        for window in sentence_windows(n, flat, first, room, doc_stride, tokenizer.cls_id, tokenizer.sep_id):
            place = {word: p for p, word in enumerate(window.words) if word >= 0}
            held.append([(index[kind], place[start], place[end - 1]) for kind, start, end in s.entities or ()
                         if kind in index and start in place and end - 1 in place])
            windows.append(window)
    out = np.full((len(windows), max(1, max((len(h) for h in held), default=0)), 3), -1, np.int32)
    for i, h in enumerate(held):
        if h:
            out[i, :len(h)] = h
    return windows, out


def window_entities(windows, scores, sentences, found=None, threshold=0.0):
    """Each sentence's entities {(type index, first word, end word exclusive)} from its windows' span scores
    [windows, types, width, width] (in windows' order): a span above `threshold` that starts and ends on a
    word's first piece, read from the window that owns its first word. `found`: the sets to add to (a
    prediction in chunks of windows), else new ones."""
    found = [set() for _ in range(sentences)] if found is None else found
    for window, score in zip(windows, scores, strict=True):
        words = np.asarray(window.words)
        n = len(words)
        types, starts, ends = np.nonzero(np.asarray(score)[:, :n, :n] > threshold)
        for kind, start, end in zip(types, starts, ends):
            first, last = words[start], words[end]
            if first >= 0 and last >= first and first in window.owned:
                found[window.sentence].add((int(kind), int(first), int(last) + 1))
    return found


def entity_offsets(rows, words, found):
    """Each input's entities [(type, first word, end word)] as dicts {"type", "text", "start", "end"}: for a raw
    text (`words` its `split_words`), character offsets into it, end exclusive; for a list of tokens (`words`
    None), token indices, the text the tokens joined by a space."""
    out = []
    for row, split, entities in zip(rows, words, found):
        if split is None:
            out.append([{"type": k, "text": " ".join(row[s:e]), "start": s, "end": e} for k, s, e in entities])
        else:
            out.append([{"type": k, "text": row[split[s][1]:split[e - 1][2]], "start": split[s][1],
                         "end": split[e - 1][2]} for k, s, e in entities])
    return out


def by_position(found, types):
    """Each sentence's {(type index, start, end)} as [(type name, start, end)] by position."""
    return [sorted(((types[k], a, b) for k, a, b in row), key=lambda e: (e[1], e[2], e[0])) for row in found]
