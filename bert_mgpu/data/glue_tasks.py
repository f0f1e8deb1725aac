"""GLUE's data: each task's files (the layouts of GLUE's download), official metrics and usual recipe, and the
TFDS `glue/*` columns. The readers are `tasks.ColumnTask`s by column position, as google-bert's processors
(and Hugging Face's) read them. MNLI has two dev and test sets: `mnli` is the matched pair, `mnli-mm` the
mismatched, both trained on MNLI's train.tsv; `ax` (GLUE's diagnostic set) is prediction only, with an MNLI
model. The suite that trains them all is glue.py.
"""

import dataclasses

from bert_mgpu.core.errors import UserError

NLI = ["contradiction", "entailment", "neutral"]
ENTAILMENT = ["entailment", "not_entailment"]


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    Args:
        name: bert_mgpu's task name (`--task_name`).
        directory: its folder in GLUE's download (`glue_data/MRPC`).
        title: its name in the GLUE table and its leaderboard file (`MRPC.tsv`).
        metrics: the official metrics, in the order papers print them ("F1/accuracy").
        epochs, learning_rate, batch_size: the usual recipe (google-bert's: 3 epochs, 2e-5, 32).
    """

    name: str
    directory: str
    title: str
    metrics: tuple
    epochs: float = 3.0
    learning_rate: float = 2e-5
    batch_size: int = 32


# In the order of the GLUE table.
TASKS = {t.name: t for t in (
    GlueTask("cola", "CoLA", "CoLA", ("eval_mcc",)),
    GlueTask("sst-2", "SST-2", "SST-2", ("eval_accuracy",)),
    GlueTask("mrpc", "MRPC", "MRPC", ("eval_f1", "eval_accuracy"), epochs=5),
    GlueTask("sts-b", "STS-B", "STS-B", ("eval_pearson", "eval_spearman"), epochs=5),
    GlueTask("qqp", "QQP", "QQP", ("eval_f1", "eval_accuracy")),
    GlueTask("mnli", "MNLI", "MNLI-m", ("eval_accuracy",)),
    GlueTask("mnli-mm", "MNLI", "MNLI-mm", ("eval_accuracy",)),
    GlueTask("qnli", "QNLI", "QNLI", ("eval_accuracy",)),
    GlueTask("rte", "RTE", "RTE", ("eval_accuracy",), epochs=5),
    GlueTask("wnli", "WNLI", "WNLI", ("eval_accuracy",), epochs=5),
    GlueTask("ax", "diagnostic", "AX", ()),
)}
ALIASES = {"sst2": "sst-2", "sst": "sst-2", "stsb": "sts-b", "sts": "sts-b", "mnli-m": "mnli",
           "mnli_mismatched": "mnli-mm", "diagnostic": "ax"}


def glue_reader(name):
    """(name, `tasks.ColumnTask` arguments, task type) reading GLUE task `name`'s files, or None if it is not
    a GLUE task. Columns by position (0 = the first)."""
    name = ALIASES.get(name, name)
    mnli = dict(text_a=8, text_b=9, label=-1, labels=NLI)
    readers = {
        # CoLA's train and dev have no header (source, label, mark, sentence); its test has one (index, sentence).
        "cola": dict(text_a=3, label=1, labels=["0", "1"], skip_header="test", test_text_a=1),
        "sst-2": dict(text_a=0, label=1, labels=["0", "1"], test_text_a=1),
        "mrpc": dict(text_a=3, text_b=4, label=0, labels=["0", "1"]),
        "sts-b": dict(text_a=7, text_b=8, label=9),
        # QQP: id, qid1, qid2, question1, question2, is_duplicate; its test: id, question1, question2.
        "qqp": dict(text_a=3, text_b=4, label=5, labels=["0", "1"], test_text_a=1, test_text_b=2),
        "mnli": dict(**mnli, files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"}),
        "mnli-mm": dict(**mnli, files={"train": "train.tsv", "dev": "dev_mismatched.tsv",
                                       "test": "test_mismatched.tsv"}),
        "qnli": dict(text_a=1, text_b=2, label=3, labels=ENTAILMENT),
        "rte": dict(text_a=1, text_b=2, label=3, labels=ENTAILMENT),
        "wnli": dict(text_a=1, text_b=2, label=3, labels=["0", "1"]),
        "ax": dict(text_a=1, text_b=2, labels=NLI, files={"test": "diagnostic.tsv"}),
    }
    if name not in readers:
        return None
    return name, readers[name], "regression" if name == "sts-b" else "classification"


# TFDS `glue/<config>`: (text column, second text column, splits as train, dev, test).
TFDS = {
    "cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"), "qqp": ("question1", "question2"), "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"), "mnli": ("premise", "hypothesis"),
    "mnli_matched": ("premise", "hypothesis"), "mnli_mismatched": ("premise", "hypothesis"),
    "ax": ("premise", "hypothesis"),
}


def tfds_columns(tfds_name):
    """(text, text_b, splits) for a TFDS `glue/*` name; None for other datasets."""
    config = tfds_name.split(":")[0].split("/", 1)[1] if tfds_name.startswith("glue/") else None
    if config is None:
        return None
    if config not in TFDS:
        raise UserError(f"--tfds_name={tfds_name}: not a GLUE configuration ({', '.join(sorted(TFDS))})")
    splits = {"mnli": ("train", "validation_matched", "test_matched"), "ax": ("test", "test", "test")}
    return (*TFDS[config], splits.get(config, ("train", "validation", "test")))
