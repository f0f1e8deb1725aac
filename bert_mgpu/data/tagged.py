"""Token-tagged sentences (NER) read from the files people have, with line numbers in every error.

Formats (`data_format`, or "auto" to tell from the file):
  - "conll": a token a line, columns split by white space, the tag in `tag_column` (last by default), a blank
    line between sentences, `-DOCSTART-` lines skipped: CoNLL-2003 (`EU NNP B-NP B-ORG`) and the Chinese
    one-character-a-line files of MSRA / People's Daily / BERT-BiLSTM-CRF-NER (`海 O`). A file of one
    column is untagged (a test set).
  - "segmented": a sentence a line of `word/pos` items (`中共中央/nt 总书记/n`, bracketed compounds
    `[中央/n 电视台/n]nt` too), turned into a tag a character; `tag_map` says which parts of speech are
    entities ({"nr": "PER", "ns": "LOC", "nt": "ORG"}), the others are O.
  - "cluener": CLUENER2020's JSON lines, `{"text": ..., "label": {type: {entity: [[start, end], ...]}}}`, end
    inclusive; a tag a character, BIO.
  - "jsonl": JSON lines `{"tokens": [...], "tags": [...]}` (`tags` left out: untagged).
Tags are O or a scheme prefix (B, I, E, S, L, U) and a type: BIO, IOB1, IO, BIOES and BILOU all read.

Example:
    sentences = read_tagged("data/msra/train.txt")         # conll, detected
    labels = tag_set(sentences)                             # ["O", "B-LOC", "I-LOC", ...]
"""

import dataclasses
import json
import logging
import os
import re

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import text_files
from bert_mgpu.data.inputs import check_text, rows_of

log = logging.getLogger("bert_mgpu")
FORMATS = ("conll", "segmented", "cluener", "jsonl")
PREFIXES = ("B", "I", "E", "S", "L", "U")
_ARTICLE = re.compile(r"^\d{8}-\d{2}-\d{3}-\d{3}/m$")  # People's Daily's article number opening a line
_WORD = re.compile(r"^(\[?)(.+)/([A-Za-z]+)(?:\](\w+))?$")  # [中央/n ... 电台/n]nt: the compound's tag after "]"


@dataclasses.dataclass
class Sentence:
    """One sentence: its tokens (words, or characters for Chinese), their tags (None: untagged), where it
    starts in its file, and whether each token has its own line (CoNLL columns)."""

    guid: str
    tokens: list
    tags: list | None
    line: int
    token_a_line: bool = False

    def where(self, k):
        """The file line of token k."""
        return self.line + k if self.token_a_line else self.line


def check_tag(tag, where):
    """UserError unless `tag` is O or a scheme prefix, "-" and a type."""
    prefix, dash, kind = tag.partition("-")
    if tag != "O" and not (dash and kind and prefix in PREFIXES):
        raise UserError(f"{where}: tag {tag!r} is not O or one of {'/'.join(PREFIXES)} with a type (B-PER)")


def detect_format(path, invalid_utf8="error"):
    """The format of a file, from its first non-blank lines (see the module's docstring): JSON from the first;
    segmented when every item of the first 20 is `word/pos` (a CoNLL line's tag, O or B-X, never is), so
    that a first line of one or two words is not taken for CoNLL columns."""
    lines = text_files.read_lines(path, invalid_utf8)
    if not lines:
        raise UserError(f"{path}: no sentences")
    first = lines[0][1].strip()
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = {}
        return "jsonl" if "tokens" in obj else "cluener"
    if all(_WORD.match(item) for _, line in lines[:20] for item in line.split()):
        return "segmented"
    return "conll"


def read_tagged(path, data_format="auto", tag_column=-1, tag_map=None, invalid_utf8="error", split=None):
    """The sentences of one file -> [Sentence]; `split` (train, dev, test) names their guids."""
    data_format = detect_format(path, invalid_utf8) if data_format == "auto" else data_format
    if data_format not in FORMATS:
        raise UserError(f"--data_format={data_format}: expected auto or one of {', '.join(FORMATS)}")
    readers = {"conll": lambda: _conll(path, invalid_utf8, tag_column),
               "segmented": lambda: _segmented(path, invalid_utf8, tag_map or {}),
               "cluener": lambda: _cluener(path, invalid_utf8), "jsonl": lambda: _jsonl(path, invalid_utf8)}
    sentences = readers[data_format]()
    name = split or os.path.splitext(os.path.basename(path))[0]
    for i, s in enumerate(sentences):
        s.guid = f"{name}-{i}"
        for k, tag in enumerate(s.tags or ()):  # a CoNLL sentence's tokens are its lines in a row
            check_tag(tag, f"{path}:{s.where(k)}")
    _warn_stray_inside(sentences, path)
    return sentences


def _warn_stray_inside(sentences, path):
    """One warning counting I- tags that follow O or another type in a file that also has B- tags (BIO): read
    as conlleval reads them, each starts an entity. IO files (no B-) are left alone."""
    tags = [s.tags for s in sentences if s.tags]
    if not any(t.startswith("B-") for row in tags for t in row):
        return
    stray, first = 0, None
    for s in sentences:
        for k, tag in enumerate(s.tags or ()):
            before = s.tags[k - 1] if k else "O"
            if tag.startswith("I-") and before[2:] != tag[2:]:
                stray += 1
                first = first or f"{path}:{s.where(k)}"
    if stray:
        log.warning("%s: %d I- tag(s) follow O or another type (first at %s); read as conlleval reads them, "
                    "each starts an entity", path, stray, first)


def tag_set(sentences):
    """The tags of tagged sentences, O first, then by type and prefix (B-LOC, I-LOC, B-PER, ...)."""
    tags = {t for s in sentences for t in (s.tags or ())} - {"O"}
    order = {p: i for i, p in enumerate(PREFIXES)}
    return ["O", *sorted(tags, key=lambda t: (t.partition("-")[2], order.get(t.partition("-")[0], 9)))]


SPLIT_NAMES = {"train": ("train", "eng.train"), "dev": ("dev", "valid", "validation", "eng.testa"),
               "test": ("test", "eng.testb")}
EXTENSIONS = ("", ".txt", ".conll", ".bio", ".bmes", ".char.bmes", ".json", ".jsonl", ".tsv")


def find_split(data_dir, split):
    """The file of a split in data_dir (train.txt, dev.json, valid.txt, eng.testa, ...), or UserError."""
    for name in SPLIT_NAMES[split]:
        for ext in EXTENSIONS:
            path = os.path.join(data_dir, name + ext)
            if os.path.isfile(path):
                return path
    tried = ", ".join(SPLIT_NAMES[split])
    raise UserError(f"--data_dir={data_dir}: no {split} file ({tried}, with {'/'.join(e for e in EXTENSIONS if e)} "
                    "or no extension)")


def check_known(sentences, labels, path):
    """UserError naming the file and line of the first tag outside `labels` (the training tags)."""
    known = set(labels)
    for s in sentences:
        for k, tag in enumerate(s.tags or ()):
            if tag not in known:
                raise UserError(f"{path}:{s.where(k)}: tag {tag!r} is not one of the training tags "
                                f"({', '.join(labels)})")


def as_sentences(rows, split_words=None):
    """What a notebook has -> [Sentence]: Sentences, (tokens, tags) pairs, {"tokens", "tags"} dicts, lists of
    tokens, or raw strings (cut into words by `split_words(text)` -> [(word, start, end)])."""
    rows = [rows] if isinstance(rows, Sentence) else rows_of(rows)  # a DataFrame: its rows, as dicts
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Sentence):
            out.append(row)
            continue
        tokens, tags = row, None
        if isinstance(row, dict) and "tokens" not in row and "text" in row:
            row = row["text"]
        if isinstance(row, str):
            tokens = [w for w, _, _ in split_words(check_text(row, f"input {i}"))]
        elif isinstance(row, dict):
            tokens, tags = row.get("tokens"), row.get("tags")
        elif isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], list | tuple):
            tokens, tags = row
        if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) and t for t in tokens):
            raise UserError(f"input {i}: expected a Sentence, a text, a list of tokens or (tokens, tags)")
        for token in tokens:
            check_text(token, f"input {i}")
        if tags is not None and len(tags) != len(tokens):
            raise UserError(f"input {i}: {len(tags)} tags for {len(tokens)} tokens")
        for tag in tags or ():
            check_tag(tag, f"input {i}")
        out.append(Sentence(str(i), list(tokens), None if tags is None else list(tags), 0))
    return out


def _conll(path, invalid_utf8, tag_column):
    text = text_files.read_text(path, invalid_utf8)
    sentences, tokens, tags, start, columns = [], [], [], None, None
    for number, raw in enumerate([*text.split("\n"), ""], 1):
        cells = raw.split()
        if cells and cells[0] == "-DOCSTART-":
            cells = []
        if not cells:
            if tokens:
                sentences.append(Sentence("", tokens, tags if columns > 1 else None, start, True))
            tokens, tags, start = [], [], None
            continue
        if columns is None:
            columns = len(cells)
            if columns > 1 and not -columns <= tag_column < columns:
                raise UserError(f"{path}:{number}: --tag_column={tag_column} but the line has {columns} columns")
        elif len(cells) != columns:
            raise UserError(f"{path}:{number}: {len(cells)} columns but line {_first_line(text)} has {columns}")
        start = number if start is None else start
        tokens.append(cells[0])
        tags.append(cells[tag_column] if columns > 1 else None)
    return sentences


def _segmented(path, invalid_utf8, tag_map):
    sentences = []
    for number, raw in text_files.read_lines(path, invalid_utf8):
        chars, tags, compound = [], [], None  # compound: the characters of an open [ ... ]
        for item in raw.split():
            if _ARTICLE.match(item):
                continue
            word = _WORD.match(item)
            if not word:
                raise UserError(f"{path}:{number}: {item!r} is not word/pos (as 中共中央/nt)")
            opens, text, pos, closing = word.groups()
            if opens:
                compound = []
            kind = tag_map.get(pos)
            if compound is not None:
                compound.append(text)
                if closing is not None:
                    whole = "".join(compound)
                    chars.extend(whole)
                    tags.extend(_bio(len(whole), tag_map.get(closing)))
                    compound = None
                continue
            chars.extend(text)
            tags.extend(_bio(len(text), kind))
        if compound is not None:
            raise UserError(f"{path}:{number}: a [ compound opened on this line never closes with ]pos")
        sentences.append(Sentence("", chars, tags, number))
    return sentences


def _bio(length, kind):
    return ["O"] * length if kind is None else [f"B-{kind}"] + [f"I-{kind}"] * (length - 1)


def _cluener(path, invalid_utf8):
    sentences = []
    for number, obj in text_files.read_json_lines(path, invalid_utf8):
        text = obj.get("text")
        if not isinstance(text, str) or not text:
            raise UserError(f"{path}:{number}: no \"text\" string")
        if "label" not in obj:
            sentences.append(Sentence("", list(text), None, number))
            continue
        tags = ["O"] * len(text)
        label = obj["label"] or {}
        if not isinstance(label, dict):
            raise UserError(f"{path}:{number}: \"label\" is a JSON {text_files.json_kind(label)}, not an object "
                            "{type: {entity: [[start, end], ...]}}")
        for kind, found in label.items():
            if not isinstance(found, dict):
                raise UserError(f"{path}:{number}: label {kind!r} holds a JSON {text_files.json_kind(found)}, not an "
                                "object {entity: [[start, end], ...]}")
            for entity, spans in found.items():
                if not isinstance(spans, list) or not all(_is_span(s) for s in spans):
                    raise UserError(f"{path}:{number}: {kind} {entity!r}: expected a list of [start, end] "
                                    f"integer pairs, got {json.dumps(spans, ensure_ascii=False)[:80]}")
                for start, end in spans:
                    if not 0 <= start <= end < len(text) or text[start:end + 1] != entity:
                        raise UserError(f"{path}:{number}: {kind} {entity!r} at [{start}, {end}] is "
                                        f"{text[start:end + 1]!r} in the text")
                    if any(t != "O" for t in tags[start:end + 1]):
                        raise UserError(f"{path}:{number}: {kind} {entity!r} at [{start}, {end}] overlaps "
                                        "another entity")
                    tags[start:end + 1] = _bio(end + 1 - start, kind)
        sentences.append(Sentence("", list(text), tags, number))
    return sentences


def _is_span(span):
    return (isinstance(span, list) and len(span) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in span))


def _jsonl(path, invalid_utf8):
    sentences = []
    for number, obj in text_files.read_json_lines(path, invalid_utf8):
        tokens, tags = obj.get("tokens"), obj.get("tags")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
            raise UserError(f"{path}:{number}: \"tokens\" must be a list of non-empty strings")
        if tags is not None and (not isinstance(tags, list) or len(tags) != len(tokens)):
            raise UserError(f"{path}:{number}: {len(tags) if isinstance(tags, list) else 'no list of'} tags for "
                            f"{len(tokens)} tokens")
        if tags is not None and not all(isinstance(t, str) for t in tags):
            bad = next(t for t in tags if not isinstance(t, str))
            raise UserError(f"{path}:{number}: \"tags\" must be strings, and {json.dumps(bad)} is not")
        sentences.append(Sentence("", tokens, tags, number))
    return sentences


def _first_line(text):
    return next(i for i, line in enumerate(text.split("\n"), 1) if line.split() and line.split()[0] != "-DOCSTART-")
