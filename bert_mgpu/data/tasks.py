"""Tasks: files on disk -> lists of `Example`s and a label list, as google-research/bert's processors.

`get_task(name, ...)` gives every GLUE task from the files of GLUE's download (glue_tasks.py), XNLI, a generic
`tsv`/`csv` task whose columns are named by flags, and `tfds` for a dataset already prepared in a local
TFDS data_dir (nothing is downloaded; `glue/*` with GLUE's columns). Bad rows raise UserError naming the
file and line.
"""

import collections
import dataclasses
import logging
import os

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import glue_tasks
from bert_mgpu.data.examples import Example
from bert_mgpu.data.text_files import read_json_lines, read_rows
from bert_mgpu.model.objectives import KINDS, is_number, objective

log = logging.getLogger("bert_mgpu")


def _cell(path, line, row, index):
    if index >= len(row) or -index > len(row):
        raise UserError(f"{path}:{line}: expected at least {index + 1 if index >= 0 else -index} "
                        f"columns, found {len(row)}")
    return row[index]


def _text(path, line, row, index):
    text = _cell(path, line, row, index)
    if not text.strip():
        raise UserError(f"{path}:{line}: empty text in column {index + 1 if index >= 0 else len(row) + index + 1}")
    return text


TASK_TYPES = tuple(KINDS)


def check_widths(path, rows, delimiter):
    """UserError at the first row with more cells than the file's first row (its header, or its first
    example): a tab inside a TSV text (a comma outside quotes in a CSV) that would cut the text there."""
    if not rows:
        return
    width = len(rows[0][1])
    for line, row in rows[1:]:
        if len(row) > width:
            inside = "a tab inside a text" if delimiter == "\t" else "a comma outside quotes"
            raise UserError(f"{path}:{line}: {len(row)} cells but the first row has {width}; {inside}? (the text "
                            "would be cut there)")


class ColumnTask:
    """Reads `{split}.tsv` files by column position, the shape of every google-bert processor."""

    delimiter, quotechar = "\t", None
    invalid_utf8 = "error"  # or "replace" (set by get_task)
    task_type = "classification"  # or "regression": labels are scores (STS-B); or "multi_label"
    label_separator = ","  # multi_label: what separates an example's labels

    def __init__(self, name, text_a, text_b=None, label=None, labels=None, skip_header=True,
                 files=None, test_label=None, test_text_a=None, test_text_b=None, row_filter=None):
        self.name, self.text_a, self.text_b, self.label = name, text_a, text_b, label
        self._labels, self.skip_header = labels, skip_header
        self.files = files or {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
        self.test_text_a = text_a if test_text_a is None else test_text_a
        self.test_text_b = text_b if test_text_b is None else test_text_b
        self.test_label, self.row_filter = test_label, row_filter

    def get_labels(self, data_dir=None, train_examples=None):
        """The fixed label set, else the training data's (from `train_examples` when already read);
        none for regression.

        Once known, the labels are checked on every dev/test row read after, with file and line.
        """
        kind = self.objective
        if not kind.has_classes:
            return []
        if self._labels is None:
            self._labels = kind.label_set(train_examples or self.get_examples(data_dir, "train"))
        return list(self._labels)

    @property
    def objective(self):
        """The head kind of --task_type, which checks and encodes this task's labels."""
        return objective(self.task_type, self.label_separator)

    def get_examples(self, data_dir, split):
        if split not in self.files:
            raise UserError(f"--task_name={self.name} has no {split} set, only {', '.join(self.files)} "
                            f"({', '.join(self.files.values())})")
        path = os.path.join(data_dir, self.files[split])
        rows = read_rows(path, self.delimiter, self.quotechar, self.invalid_utf8)
        check_widths(path, rows, self.delimiter)
        if self.skip_header is True or (split == "test" and self.skip_header == "test"):
            rows = rows[1:]
        if split == "test":
            return self._examples(path, rows, split, self.test_text_a, self.test_text_b, self.test_label)
        return self._examples(path, rows, split, self.text_a, self.text_b, self.label)

    def _examples(self, path, rows, split, ia, ib, il):
        """Rows (line number, cells) -> Examples, taking text and label from the given column positions."""
        out = []
        for line, row in rows:
            if self.row_filter and not self.row_filter(row):
                continue
            text_a = _text(path, line, row, ia)
            text_b = _text(path, line, row, ib) if ib is not None else None
            label = _cell(path, line, row, il).strip() if il is not None else None  # "fresh " is "fresh"
            if split == "test" and not label:
                label = None  # an empty label cell in a test file: nothing to check
            elif label == "" and not self.objective.empty_label_allowed():  # multi-label: the empty set
                raise UserError(f"{path}:{line}: empty label in column {il + 1 if il >= 0 else len(row) + il + 1}")
            if label is not None:
                self._check_label(path, line, label)
            out.append(Example(f"{split}-{len(out)}", text_a, text_b, label))
        if not out:
            raise UserError(f"{path}: no examples")
        return out


    def _check_label(self, path, line, label):
        problem = self.objective.check_label(label, self._labels if isinstance(self._labels, (list, tuple)) else None)
        if problem:
            raise UserError(f"{path}:{line}: {problem}")


class NamedColumnTask(ColumnTask):
    """Generic TSV/CSV: text, optional second text and label columns named by flags. Names read a header
    row; numbers (0 = the first column) read a file without one, as google-bert's processors and bert-ad's
    `label<TAB>text` files."""

    def __init__(self, kind, text_column, label_column, text_b_column=None, labels=None):
        ext = "csv" if kind == "csv" else "tsv"
        super().__init__(kind, None, labels=labels, files={s: f"{s}.{ext}" for s in ("train", "dev", "test")})
        self.columns = (text_column, text_b_column, label_column)
        if kind == "csv":
            self.delimiter, self.quotechar = ",", '"'
        given = [c for c in self.columns if c is not None]
        if label_column is not None and label_column in (text_column, text_b_column):
            raise UserError(f"--label_column={label_column} is also a text column: the model would read its label")
        numbers = [str(c).isdigit() for c in given]
        if any(numbers) and not all(numbers):
            raise UserError(f"--text_column, --text_b_column, --label_column: all names (a header row) or all "
                            f"numbers (no header), not both ({', '.join(map(str, given))})")
        self.by_number = all(numbers)

    def get_examples(self, data_dir, split):
        path = os.path.join(data_dir, self.files[split])
        rows = read_rows(path, self.delimiter, self.quotechar, self.invalid_utf8)
        if self.by_number:
            text, text_b, label = (None if c is None else int(c) for c in self.columns)
            if split == "test" and label is not None and rows and label >= len(rows[0][1]):
                label = None  # a test file without the label column
            if split != "test" and label is not None:
                self._refuse_a_header(path, rows, label)
            return self._examples(path, rows, split, text, text_b, label)
        if not rows:
            raise UserError(f"{path}: empty file (a header row is expected)")
        header = rows[0][1]
        index = {}
        for role, name in zip(("text", "text_b", "label"), self.columns):
            if name is None or (role == "label" and split == "test" and name not in header):
                index[role] = None
            elif name in header:
                index[role] = header.index(name)
            else:
                raise UserError(f"{path}:{rows[0][0]}: no column {name!r} in header {header}")
        check_widths(path, rows, self.delimiter)
        return self._examples(path, rows[1:], split, index["text"], index["text_b"], index["label"])


    def _refuse_a_header(self, path, rows, label):
        """Columns by number mean no header row: a first row whose label no other row has (a name among
        repeated classes, or a word among scores) is a header that would become a class or a bad score."""
        cells = [row[label].strip() for _, row in rows if label < len(row)]
        if len(cells) < 3 or cells[0] in cells[1:]:
            return
        if not self.objective.has_classes:  # scores
            header = not is_number(cells[0]) and all(is_number(c) for c in cells[1:])
        else:  # every other class is in two rows or more
            counts = collections.Counter(cells[1:])
            header = len(cells) > 10 and min(counts.values()) >= 2 and not isinstance(self._labels, (list, tuple))
        if header:
            raise UserError(f"{path}:{rows[0][0]}: looks like a header row (label {cells[0]!r} is in no other row), "
                            "but columns given by number read files without one: name the columns instead")


class JsonLinesTask(ColumnTask):
    """One JSON object a line (`{split}.jsonl`, or `.json` as CLUE names them): the text, second text and
    label under keys named by flags (CLUE: `sentence`, or `sentence1` and `sentence2`; `label`)."""

    def __init__(self, text_column, label_column, text_b_column=None, labels=None):
        super().__init__("jsonl", None, labels=labels)
        self.columns = (text_column, text_b_column, label_column)

    def get_examples(self, data_dir, split):
        paths = [os.path.join(data_dir, f"{split}.{ext}") for ext in ("jsonl", "json")]
        path = next((p for p in paths if os.path.exists(p)), paths[0])
        rows = []
        for line, obj in read_json_lines(path, self.invalid_utf8):
            cells = []
            for role, key in zip(("text", "text_b", "label"), self.columns):
                if key is None or (role == "label" and split == "test" and key not in obj):
                    cells.append("")
                elif key not in obj:
                    raise UserError(f"{path}:{line}: no key {key!r} (its keys: {', '.join(obj)})")
                else:
                    cells.append(str(obj[key]))
            rows.append((line, cells))
        return self._examples(path, rows, split, 0, 1 if self.columns[1] else None,
                              2 if split != "test" or any(r[2] for _, r in rows) else None)


class TfdsTask:
    """A TFDS dataset already prepared in a local data_dir; `download=False`, so nothing is fetched."""

    def __init__(self, name, data_dir, text_column, label_column, text_b_column=None,
                 splits=("train", "validation", "test")):
        self.name, self.data_dir = name, data_dir
        self.columns = (text_column, text_b_column, label_column)
        self.splits = dict(zip(("train", "dev", "test"), splits))

    def _load(self, split):
        import tensorflow_datasets as tfds

        try:
            return tfds.load(self.name, split=split, data_dir=self.data_dir, download=False, with_info=True)
        except Exception as e:  # tfds raises several types for an unknown or unprepared dataset
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"tfds dataset {self.name!r} is not prepared in {self.data_dir} ({first}); "
                            "bert_mgpu never downloads: prepare it with `tfds build` first") from None

    def get_labels(self, data_dir=None, train_examples=None):
        _, info = self._load(self.splits["train"])
        return list(getattr(info.features[self.columns[2]], "names", None) or [])  # none: a score (regression)

    def get_examples(self, data_dir, split):
        import tensorflow_datasets as tfds

        ds, info = self._load(self.splits[split])
        labels = list(getattr(info.features[self.columns[2]], "names", None) or [])
        text, text_b, label = self.columns
        out = []
        for i, row in enumerate(tfds.as_numpy(ds)):
            value = row.get(label)
            if not labels:  # a float feature: a score; GLUE's unlabelled test rows hold -1
                value = None if value is None or float(value) < 0 else f"{float(value):g}"
            else:
                value = labels[int(value)] if value is not None and 0 <= int(value) < len(labels) else None
            out.append(Example(f"{split}-{i}", row[text].decode("utf-8"),
                               row[text_b].decode("utf-8") if text_b else None, value))
        if not out:
            raise UserError(f"tfds dataset {self.name!r} split {self.splits[split]!r}: no examples")
        return out


def get_task(name, text_column="text", label_column="label", text_b_column=None, labels=None,
             tfds_name=None, tfds_data_dir=None, xnli_language="zh", tfds_splits=("train", "validation", "test"),
             invalid_utf8="error", task_type=None, label_separator=","):
    """A task by google-bert name (cola, mrpc, mnli, xnli, sst-2, sts-b) or tsv / csv / tfds.

    invalid_utf8: "error" (name the line) or "replace" (U+FFFD, and count the lines).
    task_type: "classification", "regression" (scores as labels) or "multi_label" (each label a set,
    separated by `label_separator`); None: the task's own (STS-B: regression, else classification).
    """
    if invalid_utf8 not in ("error", "replace"):
        raise UserError(f"--invalid_utf8={invalid_utf8!r}: expected error or replace")
    if labels:
        stripped = [str(x).strip() for x in labels]
        twice = next((x for i, x in enumerate(stripped) if x in stripped[:i]), None)
        if "" in stripped or twice is not None:
            raise UserError(f"--labels={','.join(map(str, labels))}: "
                            + ("an empty label" if "" in stripped else f"{twice!r} is listed twice"))
        labels = stripped
    if task_type not in (None, *TASK_TYPES):
        raise UserError(f"--task_type={task_type}: expected {', '.join(TASK_TYPES)}")
    task = _task(name.lower(), text_column, label_column, text_b_column, labels, tfds_name, tfds_data_dir,
                 xnli_language, tfds_splits)
    own = getattr(task, "task_type", "classification")
    if task_type and task_type != own and not isinstance(task, NamedColumnTask | JsonLinesTask | TfdsTask):
        raise UserError(f"--task_type={task_type}: {task.name} is a {own} task")
    task.task_type = task_type or own
    if not objective(task.task_type).has_classes and labels:
        raise UserError("--labels are classes; a regression task has scores")
    for reader in (task, *vars(task).values()):
        if isinstance(reader, ColumnTask):
            reader.invalid_utf8, reader.label_separator = invalid_utf8, label_separator
            reader.task_type = task.task_type
    task.label_separator = label_separator
    return task


def _task(name, text_column, label_column, text_b_column, labels, tfds_name, tfds_data_dir, xnli_language,
          tfds_splits):
    reader = glue_tasks.glue_reader(name)
    if reader is not None:
        task = ColumnTask(reader[0], **reader[1])
        task.task_type = reader[2]
        return task
    if name == "xnli":
        return XnliTask(xnli_language)
    if name in ("tsv", "csv"):
        return NamedColumnTask(name, text_column, label_column, text_b_column, labels)
    if name in ("jsonl", "json"):
        return JsonLinesTask("sentence" if text_column == "text" else text_column, label_column, text_b_column,
                             labels)
    if name == "tfds":
        if not tfds_name:
            raise UserError("--task_name=tfds needs --tfds_name")
        known = glue_tasks.tfds_columns(tfds_name)
        if known and text_column == "text":  # GLUE's own columns unless the flags name others
            text_column, text_b_column, splits = known
            tfds_splits = splits if tfds_splits == ("train", "validation", "test") else tfds_splits
        task = TfdsTask(tfds_name, tfds_data_dir, text_column, label_column, text_b_column, tfds_splits)
        if tfds_name.startswith("glue/stsb"):
            task.task_type = "regression"
        return task
    raise UserError(f"--task_name={name} is unknown; use {', '.join(glue_tasks.TASKS)}, xnli, tsv, csv, jsonl or tfds")


class XnliTask:
    """google-bert's XnliProcessor: MultiNLI machine-translated train, XNLI dev/test filtered by language."""

    LABELS = ["contradiction", "entailment", "neutral"]

    def __init__(self, language):
        self.name = "xnli"
        self._train = ColumnTask("xnli", 0, 1, label=2, labels=self.LABELS + ["contradictory"],
                                 files={"train": f"multinli/multinli.train.{language}.tsv"})
        self._eval = ColumnTask("xnli", 6, 7, label=1, labels=self.LABELS, test_label=1,
                                files={"dev": "xnli.dev.tsv", "test": "xnli.test.tsv"},
                                row_filter=lambda row: row[0] == language)

    def get_labels(self, data_dir=None, train_examples=None):
        return list(self.LABELS)

    def get_examples(self, data_dir, split):
        if split != "train":
            return self._eval.get_examples(data_dir, split)
        return [dataclasses.replace(e, label="contradiction" if e.label == "contradictory" else e.label)
                for e in self._train.get_examples(data_dir, split)]
