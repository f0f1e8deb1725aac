"""What a notebook hands `predict` and `evaluate`: the kinds every head class takes alike (one value, a
list, a pandas DataFrame's rows) and the check every text passes before TensorFlow sees it."""

from bert_mgpu.core.errors import UserError


def is_frame(inputs):
    """Whether `inputs` is a pandas DataFrame, told without importing pandas."""
    return hasattr(inputs, "columns") and hasattr(inputs, "to_dict")


def rows_of(inputs):
    """A list of inputs from one string, a list or iterable of inputs, or a DataFrame (its rows as dicts,
    column name -> value; read without importing pandas). A DataFrame iterated directly gives its column
    names, which would read as texts."""
    if isinstance(inputs, str | bytes):
        return [inputs]
    if is_frame(inputs):
        return inputs.to_dict("records")
    if isinstance(inputs, dict):
        return [inputs]
    return list(inputs)


def check_text(text, where):
    """`text` if it is a string TensorFlow can take (UTF-8), else UserError naming `where`. A lone surrogate
    (U+D800-U+DFFF: a broken JSON escape, `errors="surrogateescape"` decoding) cannot be encoded, and
    TensorFlow's ValueError would not say which text."""
    if not isinstance(text, str):
        raise UserError(f"{where}: expected a string, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        around = text[max(0, e.start - 15):e.start + 15]
        raise UserError(f"{where}: a lone surrogate U+{ord(text[e.start]):04X} at character {e.start} "
                        f"({around!r}) is not text; repair or drop that character") from None
    return text
