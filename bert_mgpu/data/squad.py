"""Extractive question answering's files: SQuAD v1.1 and v2.0 JSON, and CMRC 2018 and DRCD (the same JSON, Chinese).

`{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text",
"answer_start"}], "is_impossible"}]}]}]}`. Each question becomes a `Question` holding its paragraph and every
gold answer as character offsets. An answer whose text is not at its `answer_start` is looked for a few
characters around it (SQuAD's offsets are sometimes one off); one that is not there is skipped with one
warning naming the first few ids (google-bert's run_squad skips them too). Everything else that is wrong
stops with the file and line.

Example:
    questions, version_2 = read_squad("data/squad/dev-v1.1.json")
    metric_for(questions)   # "squad", or "cmrc" for Chinese contexts
"""

import dataclasses
import json
import logging
import re

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import text_files
from bert_mgpu.data.inputs import check_text, rows_of

log = logging.getLogger("bert_mgpu")
_NEAR = 20  # characters an answer may sit from its answer_start and still be taken
_CJK = re.compile("[\u4e00-\u9fff]")


@dataclasses.dataclass
class Question:
    """One question on one paragraph. `answers`: every gold answer as (text, character start), [] for a
    question with no answer (v2) or none given (a test set); `impossible`: SQuAD v2's is_impossible."""

    qid: str
    question: str
    context: str
    answers: list
    impossible: bool = False

    @property
    def answer(self):
        """The answer training uses, (start, end) character offsets (end exclusive), or None."""
        if self.impossible or not self.answers:
            return None
        text, start = self.answers[0]
        return start, start + len(text)


def as_questions(rows):
    """`Question`s from Questions, (question, context) pairs, or dicts as Hugging Face's squad datasets give
    them ({"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}})."""
    out = []
    for n, row in enumerate(rows_of(rows)):  # a DataFrame: its rows, as Hugging Face's squad columns
        if isinstance(row, Question):
            out.append(row)
        elif isinstance(row, dict):
            if "question" not in row or "context" not in row:
                raise UserError(f"question {row.get('id', n)}: needs \"question\" and \"context\" "
                                f"(it has {', '.join(map(str, row)) or 'nothing'})")
            given = row.get("answers") or {}
            answers = list(zip(given.get("text", []), given.get("answer_start", [])))
            out.append(Question(str(row.get("id", n)), row["question"], row["context"], answers,
                                bool(row.get("is_impossible", False))))
        elif isinstance(row, tuple | list) and len(row) == 2:
            question, context = row
            out.append(Question(str(n), question, context, []))
        else:
            raise UserError(f"question {n}: expected a Question, a (question, context) pair or a dict, not "
                            f"{type(row).__name__}")
    for q in out:
        check_text(q.question, f"question {q.qid}")
        check_text(q.context, f"question {q.qid}'s context")
        if not q.question.strip() or not q.context.strip():
            raise UserError(f"question {q.qid}: an empty question or context")
    return out


def _line_of(raw, needle):
    at = raw.find(needle)
    return raw.count("\n", 0, at) + 1 if at >= 0 else 1


def read_squad(path, version_2_with_negative=None, invalid_utf8="error", training=False):
    """The questions of a SQuAD-format file, in file order -> ([Question], whether it is v2 data).

    `version_2_with_negative`: what the caller expects (None: take the file's); v2 data read as v1 or the
    reverse is refused. `training`: a question needs an answer (or is_impossible)."""
    raw = text_files.read_text(path, invalid_utf8)
    try:
        top = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    if not isinstance(top, dict) or not isinstance(top.get("data"), list):
        raise UserError(f"{path}:1: not SQuAD JSON (no \"data\" list of articles with paragraphs)")
    questions, marked, unfound = [], False, []
    seen = set()
    for a, article in enumerate(top["data"]):
        record = f"article {a}"
        _check(path, record, article, dict, "an object with \"paragraphs\"")
        paragraphs = article.get("paragraphs") or []
        _check(path, f"{record}'s \"paragraphs\"", paragraphs, list, "a list")
        for p, paragraph in enumerate(paragraphs):
            record = f"article {a}, paragraph {p}"
            _check(path, record, paragraph, dict, "an object with \"context\" and \"qas\"")
            context = paragraph.get("context")
            qas = paragraph.get("qas") or []
            _check(path, f"{record}'s \"qas\"", qas, list, "a list")
            for k, qa in enumerate(qas):
                _check(path, f"{record}, question {k}", qa, dict, "an object with \"id\", \"question\" and "
                       "\"answers\"")
            if not isinstance(context, str) or not context.strip():
                where = _line_of(raw, json.dumps(qas[0].get("id"))) if qas else 1
                raise UserError(f"{path}:{where}: a paragraph with an empty context")
            for qa in qas:
                qid = str(qa.get("id", f"{len(questions)}"))
                def where(qid=qid):
                    return f"{path}:{_line_of(raw, json.dumps(qid, ensure_ascii=False))}"
                if qid in seen:
                    raise UserError(f"{where()}: question id {qid} is there twice")
                seen.add(qid)
                text = qa.get("question")
                if not isinstance(text, str) or not text.strip():
                    raise UserError(f"{where()}: question {qid} is empty")
                marked |= "is_impossible" in qa
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):  # "false" as a string would read as True
                    raise UserError(f"{where()}: question {qid}'s is_impossible is {impossible!r}; expected true "
                                    "or false")
                answers, given = [], [] if impossible else qa.get("answers") or []
                if not isinstance(given, list) or not all(isinstance(g, dict) for g in given):
                    raise UserError(f"{where()}: question {qid}'s \"answers\" must be a list of objects "
                                    "{\"text\", \"answer_start\"}")
                for gold in given:
                    answer = _place(gold, context, qid, where)
                    if answer is None:
                        unfound.append(qid)
                    else:
                        answers.append(answer)
                if training and not impossible and not answers:
                    if qa.get("answers"):
                        continue  # its answers were not found: counted in the warning
                    raise UserError(f"{where()}: training question {qid} has no answer (and no is_impossible)")
                questions.append(Question(qid, text, context, answers, impossible))
    if unfound:
        log.warning("%s: %d answers are not at their answer_start (nor within %d characters) and are skipped: %s",
                    path, len(unfound), _NEAR, ", ".join(unfound[:5]) + (" ..." if len(unfound) > 5 else ""))
    if not questions:
        raise UserError(f"{path}: holds no questions")
    if version_2_with_negative is not None and marked != bool(version_2_with_negative):
        raise UserError(f"{path}: is SQuAD v2 data (questions marked is_impossible): pass "
                        "--version_2_with_negative" if marked else
                        f"{path}: is SQuAD v1 data (no is_impossible marks); --version_2_with_negative is for v2")
    return questions, marked


def _check(path, record, value, kind, expected):
    """UserError naming the file, the record and what it is, unless `value` is a `kind` (JSON's shape)."""
    if not isinstance(value, kind):
        raise UserError(f"{path}: {record} is a JSON {text_files.json_kind(value)}, not {expected}")


def _place(answer, context, qid, where):
    """(text, start) of one gold answer in the context, or None when its text is not near answer_start."""
    text, start = answer.get("text"), answer.get("answer_start")
    if isinstance(start, bool) or not isinstance(text, str) or not text or not isinstance(start, int) or start < 0:
        raise UserError(f"{where()}: question {qid} has an answer without its text and answer_start")
    if start + len(text) > len(context):
        raise UserError(f"{where()}: question {qid}'s answer ends at character {start + len(text)}, past the "
                        f"end of its context ({len(context)} characters)")
    if context[start:start + len(text)] == text:
        return text, start
    found = [m.start() for m in re.finditer(re.escape(text), context) if abs(m.start() - start) <= _NEAR]
    return (text, min(found, key=lambda s: abs(s - start))) if found else None


def metric_for(questions):
    """"cmrc" when the contexts are mostly Chinese characters (CMRC 2018, DRCD), else "squad"."""
    sample = "".join(q.context for q in questions[:200])
    letters = sum(1 for c in sample if not c.isspace())
    return "cmrc" if letters and len(_CJK.findall(sample)) / letters > 0.3 else "squad"
