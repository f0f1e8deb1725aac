"""Users' data files read with their line numbers: UTF-8 (or U+FFFD, counted), TSV/CSV rows, JSON lines.

Every problem is a UserError naming the file and the line, so a bad row costs one look, not a traceback.
"""

import codecs
import csv
import io
import json
import logging
import os

from bert_mgpu.core.errors import UserError

log = logging.getLogger("bert_mgpu")


def _read(path, invalid_utf8):
    if not os.path.exists(path):
        raise UserError(f"{path}: file not found")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    return decode_utf8(path, data, invalid_utf8)


def decode_utf8(path, data, invalid_utf8="error"):
    """Bytes -> text. Invalid UTF-8 is an error naming line and column, or (`replace`) U+FFFD, counted."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        if invalid_utf8 != "replace":
            raise UserError(f"{path}:{line}: invalid UTF-8 at byte {column} of the line ({e.reason}); fix the "
                            "file or pass --invalid_utf8=replace") from None
    bad = [i + 1 for i, raw in enumerate(data.split(b"\n")) if _invalid(raw)]
    log.warning("%s: invalid UTF-8 replaced by U+FFFD on %d line(s), the first at line %d", path, len(bad), bad[0])
    return data.decode("utf-8", errors="replace")


def _invalid(raw):
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def read_rows(path, delimiter="\t", quotechar=None, invalid_utf8="error"):
    """Rows of a TSV/CSV file, each with its 1-based line number; UserError naming the file and line for
    input that cannot be read right (no file, NUL byte, invalid UTF-8, a quote that never closes)."""
    text = _read(path, invalid_utf8)
    if "\x00" in text:
        at = text.index("\x00")
        raise UserError(f"{path}:{text.count(chr(10), 0, at) + 1}: NUL byte at column "
                        f"{at - text.rfind(chr(10), 0, at)}; is it a binary or UTF-16 file?")
    rows = []
    # A field as long as the file is a long document, not a broken row (csv's default limit is 128 KiB).
    csv.field_size_limit(max(csv.field_size_limit(), len(text)))
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quotechar=quotechar, strict=True)
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            if "unexpected end of data" in str(e):
                raise UserError(f"{path}:{line}: a quote opened on this line never closes") from None
            raise UserError(f"{path}:{line}: malformed row ({e})") from None
        if row:
            rows.append((line, row))
    return rows


def read_text(path, invalid_utf8="error"):
    """A text file's whole text; UserError for a NUL byte (a binary or UTF-16 file), naming its line."""
    text = _read(path, invalid_utf8)
    if "\x00" in text:
        raise UserError(f"{path}:{text.count(chr(10), 0, text.index(chr(0))) + 1}: NUL byte; is it a binary or "
                        "UTF-16 file?")
    return text


def read_lines(path, invalid_utf8="error"):
    """(line number, text) for each non-blank line of a text file (no line ending kept)."""
    text = read_text(path, invalid_utf8)
    return [(i, line.rstrip("\r")) for i, line in enumerate(text.split("\n"), 1) if line.strip()]


def json_kind(value):
    """JSON's name for the kind of a parsed value: "object", "list", "string", "number", "boolean", "null"."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def read_json_lines(path, invalid_utf8="error"):
    """(line number, object) for each non-blank line of a JSON-lines file."""
    out = []
    for line, raw in enumerate(_read(path, invalid_utf8).split("\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{line}: not a JSON object ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{line}: a JSON {json_kind(obj)}, not an object")
        out.append((line, obj))
    return out


def read_texts(path, text_column, text_b_column, pairs):
    """(texts, second texts or None) from `path`: a .tsv/.csv with a header row or .jsonl (columns
    `text_column`, `text_b_column` where `pairs`; None: text/text_a/sentence/sentence1 and text_b/sentence2),
    else one text a line (a pair as 'text_a ||| text_b'). Each bad row is one line naming the file and line."""
    ext = os.path.splitext(path)[1].lower()
    if ext in (".tsv", ".csv", ".jsonl", ".json"):
        if ext in (".jsonl", ".json"):
            rows = read_json_lines(path)
            names = sorted({k for _, row in rows for k in row})
        else:
            rows = read_rows(path, "\t" if ext == ".tsv" else ",", None if ext == ".tsv" else '"')
            if not rows:
                raise UserError(f"{path}: empty file (a header row is expected)")
            names, rows = rows[0][1], [(line, dict(zip(rows[0][1], row))) for line, row in rows[1:]]
        defaults = {"--text_column": ("text", "text_a", "sentence", "sentence1"), "--text_b_column": ("text_b",
                                                                                                 "sentence2")}
        given = {"--text_column": text_column, "--text_b_column": text_b_column}
        columns = {}
        for flag in ("--text_column", "--text_b_column") if pairs else ("--text_column",):
            columns[flag] = given[flag] or next((c for c in defaults[flag] if c in names), None)
            if columns[flag] not in names:
                what = repr(given[flag]) if given[flag] else f"named {' or '.join(defaults[flag])}; give {flag}"
                raise UserError(f"{path}: no column {what}; the file has {', '.join(map(str, names))}")
        text, second = columns["--text_column"], columns.get("--text_b_column")
        out = ([], [] if pairs else None)
        for line, row in rows:
            for column, values in ((text, out[0]), (second, out[1])):
                if values is None:
                    continue
                value = row.get(column)
                if not isinstance(value, str):
                    raise UserError(f"{path}:{line}: no text in {column!r}" + (
                        "" if value is None else f" (a {type(value).__name__})"))
                values.append(value)
        return out
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    if not pairs:
        return lines, None
    parts = [line.partition(" ||| ") for line in lines]
    for number, (_, sep, _) in enumerate(parts, 1):
        if not sep:
            raise UserError(f"{path}:{number}: this model reads pairs: write 'text_a ||| text_b'")
    return [a for a, _, _ in parts], [b for _, _, b in parts]
