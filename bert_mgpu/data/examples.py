"""Examples: one classification example, and what a notebook holds (strings, pairs, a DataFrame) as a list of
them. Tasks (tasks.py) read files into the same `Example`s.
"""

import dataclasses

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.inputs import check_text, is_frame


@dataclasses.dataclass(frozen=True)
class Example:
    """One classification example, as google-bert's `InputExample`.

    Args:
        guid: a unique id (written beside predictions).
        text_a: the (first) text.
        text_b: the second text of a pair, or None.
        label: the label as a string; None for unlabelled test examples.

    Example:
        Example("train-1", "The movie was great.", label="fresh")
        Example("dev-7", "A man is eating.", "Someone eats.", label="entailment")
    """

    guid: str
    text_a: str
    text_b: str = None
    label: str = None  # None for unlabelled test examples


def as_examples(inputs, text_column=None, text_b_column=None, label_column="label"):
    """What a notebook has -> a list of `Example`s: `Example`s, plain strings, (text_a, text_b) pairs, or a
    pandas DataFrame (its `text_column`, default "text", "text_a" or "sentence"; `text_b_column`, default
    "text_b" if present; labels from `label_column` if present; ids from its index).

    Example:
        as_examples(["great film", "dull plot"])
        as_examples([("A man eats.", "Someone eats.")])
        as_examples(pandas.DataFrame({"text": ["great film"], "label": ["pos"]}))
    """
    if isinstance(inputs, str | Example):
        inputs = [inputs]
    if is_frame(inputs):
        return _checked(_from_frame(inputs, text_column, text_b_column, label_column))
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, Example):
            out.append(item)
        elif isinstance(item, str):
            out.append(Example(str(i), item))
        elif isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(t, str) for t in item):
            out.append(Example(str(i), item[0], item[1]))
        else:
            raise UserError(f"input {i}: expected an Example, a string or a (text_a, text_b) pair of strings, "
                            f"not {type(item).__name__}")
    return _checked(out)


def _checked(examples):
    for e in examples:
        check_text(e.text_a, f"input {e.guid}")
        if e.text_b is not None:
            check_text(e.text_b, f"input {e.guid}'s second text")
    return examples


def _from_frame(frame, text_column, text_b_column, label_column):
    columns = [str(c) for c in frame.columns]
    text = text_column or next((c for c in ("text", "text_a", "sentence") if c in columns), None)
    if text not in columns:
        raise UserError(f"the DataFrame has no text column {text_column or 'text, text_a or sentence'} "
                        f"(its columns: {', '.join(columns)})")
    if text_b_column and text_b_column not in columns:
        raise UserError(f"the DataFrame has no column {text_b_column!r} (its columns: {', '.join(columns)})")
    text_b = text_b_column or ("text_b" if "text_b" in columns else None)
    label = label_column if label_column in columns else None
    rows = frame.to_dict("records")

    def cell(guid, row, column, what):  # None and NaN (pandas' missing values) would become "None", "nan"
        value = row[column]
        if _missing(value):
            raise UserError(f"DataFrame row {guid}: no {what} in column {column!r} (None or NaN)")
        return str(value)

    return [Example(str(guid), cell(guid, row, text, "text"),
                    None if text_b is None else cell(guid, row, text_b, "second text"),
                    None if label is None or _missing(row[label]) else cell(guid, row, label, "label"))
            for guid, row in zip(frame.index, rows)]


def _missing(value):
    return value is None or (isinstance(value, float) and value != value)
