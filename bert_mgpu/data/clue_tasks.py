"""CLUE's tasks: each task's files as CLUE's download lays them out (train.json, dev.json, test.json), its
labels, the text pair it makes (WSC's span marks, CSL's keywords), the recipe of CLUE's BERT baseline and its
leaderboard file. CLUENER (data/tagged.py), CMRC 2018 (SQuAD's JSON, data/squad.py), CHID and C3
(data/choices.py) join the classification tasks. The suite that trains them all is api/clue.py.

Example:
    examples, ids = TASKS["tnews"].read("clue/tnews", "test")      # ids: the test file's own, for submission
"""

import dataclasses
import json
import os

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import choices
from bert_mgpu.data.tasks import Example
from bert_mgpu.data.text_files import read_json_lines

NLI = ["contradiction", "entailment", "neutral"]


@dataclasses.dataclass(frozen=True)
class ClueTask:
    """One CLUE task.

    Args:
        name: bert_mgpu's name (`--tasks`), also its folder in CLUE's download (or `<name>_public`).
        title: its column in the CLUE table.
        keys: (first text, second text) keys of a row; WSC and CSL build theirs (`pair`).
        labels: the fixed label set; None: labels.json in its folder, else the training file's.
        submission: its leaderboard file.
        epochs, learning_rate, batch_size, max_seq_length: CLUE's BERT-base baseline scripts' recipe (their
            one-GPU batch, here per tower as in the GLUE suite).
    """

    name: str
    title: str
    keys: tuple = ("sentence1", "sentence2")
    labels: tuple = None
    submission: str = None
    epochs: float = 3.0
    learning_rate: float = 2e-5
    batch_size: int = 32
    max_seq_length: int = 128
    folders: tuple = ()
    head: str = "classifier"  # its head's name (io/heads.py): "tagger" (CLUENER), "question_answerer" (CMRC
    # 2018), "multiple_choice" (CHID, C3)
    metric: str = "eval_accuracy"  # its score in CLUE's table

    def find(self, clue_dir):
        """Its folder: `<name>`, `<name>_public` (the zip's name) or another name CLUE used; None."""
        for folder in (self.name, f"{self.name}_public", *self.folders):
            path = os.path.join(clue_dir, folder)
            if os.path.isdir(path):
                return path
        return None

    def directory(self, clue_dir):
        """`find`, or a UserError saying what is missing."""
        found = self.find(clue_dir)
        if found:
            return found
        raise UserError(f"{clue_dir}: no {self.name}/ folder ({self.title}'s train.json, dev.json, test.json)")

    def test_file(self, folder):
        """The test file to predict for the leaderboard, or None: test.json; a multiple-choice task's
        test1.1.json (or test1.0.json)."""
        if self.head == "multiple_choice":
            try:
                return choices.find_split(folder, "test")[0]
            except UserError:
                return None
        path = os.path.join(folder, "test.json")
        return path if os.path.exists(path) else None

    def label_list(self, folder):
        """The task's labels: fixed, or labels.json's ({"label": ..., "label_desc"/"label_des": ...} a line),
        or None (the training file decides)."""
        if self.labels:
            return list(self.labels)
        descriptions = self.descriptions(folder)
        return list(descriptions) if descriptions else None

    def descriptions(self, folder):
        """{label: description} from labels.json (TNEWS's codes, IFLYTEK's numbers), {} without it."""
        path = os.path.join(folder, "labels.json")
        if not os.path.exists(path):
            return {}
        out = {}
        for line, obj in read_json_lines(path):
            if "label" not in obj:
                raise UserError(f"{path}:{line}: no key 'label'")
            out[str(obj["label"])] = str(obj.get("label_desc", obj.get("label_des", "")))
        return out

    def pair(self, obj, path, line):
        """A row -> (text_a, text_b)."""
        if self.name == "cluewsc2020":
            return wsc_text(obj, path, line), None
        if self.name == "csl":
            keywords = _key(obj, "keyword", path, line)
            return " ".join(map(str, keywords)) if isinstance(keywords, list) else str(keywords), \
                str(_key(obj, "abst", path, line))
        first, second = self.keys
        return str(_key(obj, first, path, line)), (str(_key(obj, second, path, line)) if second else None)

    def read(self, folder, split, labels=None):
        """Examples of `split` and the rows' ids (the test file's `id`, else the row's place). Training and
        dev rows labelled "-" (NLI's undecided pairs) are left out, as CLUE's baselines do; a label not in
        `labels` is a UserError naming its file and line."""
        path = os.path.join(folder, f"{split}.json")
        if not os.path.exists(path):
            raise UserError(f"{path}: no such file (CLUE's {self.title} has train.json, dev.json, test.json)")
        examples, ids = [], []
        for line, obj in read_json_lines(path):
            label = obj.get("label")
            if split != "test" and label is None:
                raise UserError(f"{path}:{line}: no key 'label'")
            label = None if label is None else str(label)
            if label == "-" and split != "test":
                continue
            if label is not None and labels is not None and label not in labels:
                raise UserError(f"{path}:{line}: label {label!r} is not one of {self.title}'s "
                                f"({', '.join(labels[:8])}{', ...' if len(labels) > 8 else ''})")
            text_a, text_b = self.pair(obj, path, line)
            examples.append(Example(f"{split}-{len(examples)}", text_a, text_b, label if split != "test" else None))
            ids.append(obj.get("id", obj.get("idx", len(ids))))
        if not examples:
            raise UserError(f"{path}: no examples")
        return examples, ids


def _key(obj, key, path, line):
    if key not in obj:
        raise UserError(f"{path}:{line}: no key {key!r} (its keys: {', '.join(obj)})")
    return obj[key]


def wsc_text(obj, path, line):
    """CLUEWSC2020's text with its noun phrase marked _..._ and its pronoun [...], as CLUE's baseline marks
    them, so a sentence classifier sees which two it is asked about. UserError when a span's text is not
    at its index."""
    text, target = str(_key(obj, "text", path, line)), _key(obj, "target", path, line)
    spans = []
    for n, (left, right) in ((1, ("_", "_")), (2, ("[", "]"))):
        start, words = target.get(f"span{n}_index"), target.get(f"span{n}_text")
        if not isinstance(start, int) or not isinstance(words, str) or text[start:start + len(words)] != words:
            raise UserError(f"{path}:{line}: span{n}_text {words!r} is not at span{n}_index {start} of the text")
        spans.append((start, start + len(words), left, right))
    out, at = [], 0
    for start, end, left, right in sorted(spans):
        out += [text[at:start], left, text[start:end], right]
        at = end
    return "".join(out + [text[at:]])


# In the order of CLUE's table.
TASKS = {t.name: t for t in (
    ClueTask("afqmc", "AFQMC", labels=("0", "1"), submission="afqmc_predict.json"),
    ClueTask("tnews", "TNEWS", keys=("sentence", None), submission="tnews11_predict.json", folders=("tnews1.1",)),
    ClueTask("iflytek", "IFLYTEK", keys=("sentence", None), submission="iflytek_predict.json"),
    ClueTask("cmnli", "CMNLI", labels=tuple(NLI), submission="cmnli_predict.json"),
    ClueTask("ocnli", "OCNLI", labels=tuple(NLI), submission="ocnli_50k_predict.json"),
    ClueTask("cluewsc2020", "WSC", labels=("false", "true"), submission="cluewsc11_predict.json", epochs=50,
             batch_size=8, folders=("wsc", "cluewsc")),
    ClueTask("csl", "CSL", labels=("0", "1"), submission="csl_predict.json", learning_rate=1e-5, batch_size=4,
             max_seq_length=256),
    # NER and reading comprehension: run_ner_mgpu.py's and google-bert run_squad's recipes.
    ClueTask("cluener", "CLUENER", submission="cluener_predict.json", learning_rate=3e-5, head="tagger",
             metric="eval_f1"),
    ClueTask("cmrc2018", "CMRC2018", submission="cmrc2018_predict.json", epochs=2, learning_rate=3e-5,
             batch_size=12, max_seq_length=512, head="question_answerer", metric="eval_exact_match"),
    # Multiple choice: CLUE's PyTorch reading-comprehension baseline's run_c3.sh (a batch of 16 by
    # accumulation, 256 tokens) and bert4keras's CLUE chid.py (64 tokens around the blank, batch 12).
    ClueTask("chid", "CHID", submission="chid11_predict.json", epochs=5, batch_size=12, max_seq_length=64,
             head="multiple_choice"),
    ClueTask("c3", "C3", submission="c311_predict.json", epochs=8, batch_size=16, max_seq_length=256,
             head="multiple_choice"),
)}
ALIASES = {"wsc": "cluewsc2020", "cluewsc": "cluewsc2020", "tnews1.1": "tnews"}


def submission_lines(task, ids, labels, descriptions):
    """The leaderboard file's JSON lines: {"id", "label"} a test row (TNEWS and IFLYTEK add the label's
    description, as CLUE's examples do)."""
    out = []
    for i, label in zip(ids, labels):
        row = {"id": i, "label": label}
        if task.name in ("tnews", "iflytek") and descriptions:
            row["label_desc"] = descriptions.get(label, "")
        out.append(json.dumps(row, ensure_ascii=False) + "\n")
    return "".join(out)
