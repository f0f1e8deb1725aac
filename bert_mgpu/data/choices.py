"""Multiple-choice questions as people have them: JSON lines, SWAG's CSV, C3's JSON and CHID's idiom blanks.

Every reader gives `ChoiceQuestion`s: a context, a question and its choices, each choice read with the
context (data/choice_input.py), and the right choice's index. A bad row is one line naming the file and line.

Example:
    questions = read_choices("data/c3/d-dev.json")          # format told from the file
    questions[0].choices, questions[0].label                  # (["...", "..."], 1)
"""

import dataclasses
import json
import os
import re

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.inputs import check_text, rows_of
from bert_mgpu.data.text_files import json_kind, read_json_lines, read_rows, read_text

FORMATS = ("auto", "jsonl", "swag", "c3", "chid")
BLANK = re.compile(r"#idiom\d+#")  # CHID's blanks
CHID_BLANK = "＿＿＿＿"  # what the other blanks of a CHID paragraph read as (an idiom is four characters)
SLOT = "\x00"  # in a context: where each choice is read (a CHID blank), instead of after the question


@dataclasses.dataclass
class ChoiceQuestion:
    """One question.

    Args:
        guid: its id (the file's own where it has one: the leaderboard files name it).
        context: the passage (SWAG's first sentence, C3's dialogue, a CHID paragraph around its blank).
        question: what is asked (SWAG's second sentence's start, C3's question; "" for CHID).
        choices: the candidate answers; each is read as `context [SEP] question choice`, or in the context's
            SLOT where it has one (a CHID blank).
        label: the right choice's index, or None (a test file).
        where: "file:line" for messages.
    """

    guid: str
    context: str
    question: str
    choices: list
    label: int | None = None
    where: str = ""


def _label(where, label, choices, answer=None):
    """A row's right choice -> its index, or UserError: `label` an index (a number or digits), `answer` its
    text (C3's "answer", a JSON line's)."""
    if answer not in (None, ""):
        if answer in choices:
            return choices.index(answer)
        raise UserError(f"{where}: answer {answer!r} is not one of its choices ({', '.join(map(repr, choices))})")
    if label is None or label == "":
        return None
    text = str(label).strip()
    if isinstance(label, bool) or not (isinstance(label, int) or text.isdigit()):
        if isinstance(label, str) and label in choices:  # a label given as the answer's text
            return choices.index(label)
        raise UserError(f"{where}: label {label!r} is not one of its choices ({', '.join(map(repr, choices))})")
    if 0 <= int(text) < len(choices):
        return int(text)
    raise UserError(f"{where}: label {label} is not one of its {len(choices)} choices (0 to {len(choices) - 1})")


def _question(where, guid, context, question, choices, label=None, answer=None):
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise UserError(f"{where}: \"choices\" must be a list of at least two strings")
    if not any(c.strip() for c in choices):
        raise UserError(f"{where}: every choice is empty")
    if not isinstance(context, str) or not isinstance(question, str):
        raise UserError(f"{where}: \"context\" and \"question\" must be strings")
    return ChoiceQuestion(str(guid), context, question, list(choices), _label(where, label, choices, answer), where)


def read_jsonl(path, invalid_utf8="error"):
    """{"context", "question", "choices": [...], "label"} a line (label: an index or the answer's text; "answer"
    is read as well; "id" kept). SWAG's columns (sent1, sent2, ending0..) are read too, as Hugging Face's."""
    out = []
    for line, row in read_json_lines(path, invalid_utf8):
        where = f"{path}:{line}"
        if "ending0" in row:
            out.append(_swag_row(where, row, len(out)))
            continue
        if "choices" not in row:
            raise UserError(f"{where}: no \"choices\" (expected {{\"context\", \"question\", \"choices\", \"label\"}})")
        out.append(_question(where, row.get("id", len(out)), row.get("context", ""), row.get("question", ""),
                             row["choices"], row.get("label"), row.get("answer")))
    return out


def _swag_row(where, row, n):
    endings = []
    while f"ending{len(endings)}" in row:
        endings.append(row[f"ending{len(endings)}"])
    label = row.get("label")
    return _question(where, row.get("id", row.get("video-id", n)) or n, row.get("sent1", ""), row.get("sent2", ""),
                     endings, None if label in (None, "") else str(label))


def read_swag(path, invalid_utf8="error"):
    """SWAG's CSV (train.csv, val.csv, test.csv): a header, then sent1 (the context), sent2 (the start of the
    next sentence), ending0..3 and label (not in test.csv), as Hugging Face's run_swag reads them."""
    rows = read_rows(path, ",", '"', invalid_utf8)
    if not rows:
        raise UserError(f"{path}: empty")
    _, header = rows[0]
    for need in ("sent1", "sent2", "ending0", "ending1"):
        if need not in header:
            raise UserError(f"{path}:1: no {need} column (SWAG's header: sent1, sent2, ending0..3, label)")
    out = []
    for line, cells in rows[1:]:
        if len(cells) != len(header):
            raise UserError(f"{path}:{line}: {len(cells)} fields where the header has {len(header)}")
        row = dict(zip(header, cells))
        row["id"] = f"{os.path.basename(path)}-{len(out)}"
        out.append(_swag_row(f"{path}:{line}", row, len(out)))
    return out


def _json_document(path, invalid_utf8):
    text = read_text(path, invalid_utf8)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not JSON ({e.msg} at column {e.colno})") from None


def read_c3(path, invalid_utf8="error"):
    """C3's JSON (d-train.json, m-dev.json, test1.1.json): [[paragraphs], [{"question", "choice", "answer",
    "id"}], id] items; the paragraphs are the context (a dialogue's turns a line). The answer is the right
    choice's text; a test file has none."""
    data = _json_document(path, invalid_utf8)
    if not isinstance(data, list):
        raise UserError(f"{path}: C3's file is a JSON list of [paragraphs, questions, id] items")
    out = []
    for n, item in enumerate(data):
        where = f"{path}: item {n}"
        if not (isinstance(item, list) and len(item) >= 2 and isinstance(item[0], list) and isinstance(item[1], list)):
            raise UserError(f"{where}: not [paragraphs, questions, id]")
        if not all(isinstance(p, str) for p in item[0]):
            bad = next(p for p in item[0] if not isinstance(p, str))
            raise UserError(f"{where}: its paragraphs must be strings, and one is a JSON {json_kind(bad)}")
        context = "\n".join(item[0])
        for k, qa in enumerate(item[1]):
            if not isinstance(qa, dict) or "choice" not in qa:
                raise UserError(f"{where}, question {k}: no \"choice\"")
            guid = qa.get("id", f"{item[2] if len(item) > 2 else n}-{k}")
            out.append(_question(f"{where}, question {k}", guid, context, qa.get("question", ""), qa["choice"],
                                 answer=qa.get("answer")))
    return out


def read_chid(path, answers=None, context_chars=60, invalid_utf8="error"):
    """CHID's JSON lines ({"candidates": [10 idioms], "content": [paragraphs with #idiom000001# blanks]}) and
    its answer file ({"#idiom000001#": index}; default: `<name>_answer.json` beside it, if there). Each blank
    is a question: its paragraph, cut to `context_chars` characters each side, with the blank where each
    candidate is read; the paragraph's other blanks read as ＿＿＿＿."""
    if answers is None:
        beside = re.sub(r"\.json$", "_answer.json", path)
        answers = beside if beside != path and os.path.isfile(beside) else None
    key = {}
    if answers:
        key = _json_document(answers, invalid_utf8)
        if not isinstance(key, dict):
            raise UserError(f"{answers}: CHID's answers are one JSON object {{\"#idiom000001#\": index}}")
    out = []
    for line, row in read_json_lines(path, invalid_utf8):
        where = f"{path}:{line}"
        candidates, content = row.get("candidates"), row.get("content")
        if not isinstance(candidates, list) or not isinstance(content, list):
            raise UserError(f"{where}: expected {{\"candidates\": [...], \"content\": [...]}} (CHID)")
        for k, paragraph in enumerate(content):
            if not isinstance(paragraph, str):
                raise UserError(f"{where}: \"content\" paragraph {k} is a JSON {json_kind(paragraph)}, not a string")
            for blank in BLANK.finditer(paragraph):
                tag = blank.group()
                if answers and tag not in key:
                    raise UserError(f"{where}: blank {tag} has no answer in {answers}")
                left = BLANK.sub(CHID_BLANK, paragraph[:blank.start()])[-context_chars:]
                right = BLANK.sub(CHID_BLANK, paragraph[blank.end():])[:context_chars]
                out.append(_question(where, tag, left + SLOT + right, "", candidates, key.get(tag)))
    return out


def detect_format(path):
    """The format of a file: swag for .csv, c3 for a JSON list, chid for lines with "candidates", else jsonl."""
    if path.endswith(".csv"):
        return "swag"
    with open(path, "rb") as f:
        start = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"["):
        return "c3"
    return "chid" if b'"candidates"' in start and b'"content"' in start else "jsonl"


def read_choices(path, data_format="auto", invalid_utf8="error", answers=None):
    """The questions of one file in `data_format` (one of FORMATS; auto: `detect_format`)."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: file not found")
    kind = detect_format(path) if data_format == "auto" else data_format
    readers = {"jsonl": read_jsonl, "swag": read_swag, "c3": read_c3,
               "chid": lambda p, u: read_chid(p, answers, invalid_utf8=u)}
    if kind not in readers:
        raise UserError(f"--data_format={data_format}: expected one of {', '.join(FORMATS)}")
    questions = readers[kind](path, invalid_utf8)
    if not questions:
        raise UserError(f"{path}: no questions")
    return questions


# The files of a split in a data directory, by format: [names], read and put end to end.
SPLIT_FILES = {
    "train": (["train.jsonl", "train.json"], ["train.csv"], [["d-train.json", "m-train.json"]]),
    "dev": (["dev.jsonl", "dev.json", "val.jsonl"], ["val.csv", "dev.csv"], [["d-dev.json", "m-dev.json"]]),
    "test": (["test.jsonl", "test1.1.json", "test1.0.json", "test.json"], ["test.csv"], []),
}


def find_split(data_dir, split):
    """The file(s) of a split in data_dir: C3's d- and m- files together, else the first of SPLIT_FILES."""
    for group in SPLIT_FILES[split]:
        for names in group:
            names = [names] if isinstance(names, str) else names
            paths = [os.path.join(data_dir, name) for name in names]
            if all(os.path.isfile(p) for p in paths):
                return paths
    tried = ", ".join(n if isinstance(n, str) else "+".join(n) for group in SPLIT_FILES[split] for n in group)
    raise UserError(f"--data_dir={data_dir}: no {split} file ({tried})")


def read_split(data_dir, split, data_format="auto", invalid_utf8="error"):
    """(the split's questions, its files)."""
    paths = find_split(data_dir, split)
    questions = [q for path in paths for q in read_choices(path, data_format, invalid_utf8)]
    return questions, paths


def as_questions(rows):
    """`ChoiceQuestion`s from ChoiceQuestions, (context, question, choices[, label]) tuples or dicts
    ({"context", "question", "choices", "label"}; Hugging Face's swag rows: sent1, sent2, ending0..3, label)."""
    out = []
    for n, row in enumerate(rows_of(rows)):  # a DataFrame: its rows, as dicts
        if isinstance(row, ChoiceQuestion):
            out.append(row)
            continue
        if isinstance(row, dict):
            if "ending0" in row:
                endings = [row[f"ending{i}"] for i in range(10) if f"ending{i}" in row]
                row = {"context": row.get("sent1", ""), "question": row.get("sent2", ""), "choices": endings,
                       "label": row.get("label")}
            row = (row.get("context", ""), row.get("question", ""), row.get("choices"), row.get("label"),
                   row.get("id", n))
        context, question, choices, *rest = row
        label = rest[0] if rest else None
        if not isinstance(choices, (list, tuple)) or len(choices) < 2:
            raise UserError(f"question {n}: needs a list of at least two choices")
        if label is not None and not (isinstance(label, (int, np.integer)) and 0 <= label < len(choices)):
            raise UserError(f"question {n}: label {label!r} is not one of its {len(choices)} choices")
        out.append(ChoiceQuestion(str(rest[1] if len(rest) > 1 else n), context or "", question or "",
                                  [str(c) for c in choices], None if label is None else int(label)))
    for q in out:
        for what, text in (("context", q.context), ("question", q.question), *(
                (f"choice {k}", c) for k, c in enumerate(q.choices))):
            check_text(text, f"question {q.guid}'s {what}")
    return out


def choice_texts(question, choice):
    """(first text, second text) of one choice: `context`, `question choice`; a context holding SLOT (a
    CHID blank) reads the choice there, and the question (if any) second."""
    if SLOT in question.context:
        return question.context.replace(SLOT, choice), question.question
    if not question.context.strip():
        return (question.question, choice) if question.question.strip() else (choice, "")
    return question.context, " ".join(t for t in (question.question, choice) if t)


def chosen(questions, probabilities):
    """Each question's choice from its probabilities over its own choices: {"label" (the index), "answer"
    (its text), "probabilities"}, as `BertMultipleChoice.predict` and a served export give them."""
    out = []
    for q, p in zip(questions, probabilities):
        k = int(np.argmax(p))
        out.append({"label": k, "answer": q.choices[k], "probabilities": [float(x) for x in p]})
    return out
