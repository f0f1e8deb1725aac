"""The distillation scripts' flags and student (run_distill_mgpu.py for a classifier, run_distill_ner_mgpu.py
for a tagger): the teacher opened beside the student on the same towers, the student made of its layers or
another checkpoint, the unlabelled file read, and the summary's lines on both. Each script reads its flags
into `Options` at its top; nothing here reads them.

Example:
    student = Student(Options.from_flags(FLAGS), bert_mgpu.BertTagger, read_unlabeled, "tagger")
    run_ner_mgpu.run(student.open, ("data_format", *SETTINGS), "run_distill_ner_mgpu.py", student.facts)
"""

import dataclasses
import time

from absl import flags

from bert_mgpu.core.errors import UserError

SETTINGS = ("teacher", "teacher_layers", "temperature", "soft_weight", "hard_weight", "unlabeled_file",
            "hidden_weight", "attention_weight", "layer_map", "student_init")


def define_flags(head, unlabeled_help):
    """The teacher's and the loss's flags (`head`: "classifier" or "tagger", in the help)."""
    flags.DEFINE_string("teacher", None, f"The fine-tuned {head} that teaches: a bert_mgpu {head} run (its output "
                        "directory, or its best/), or its export (hf, google, saved_model).")
    flags.DEFINE_list("teacher_layers", None, "The student: these encoder layers of the teacher (e.g. 0,2,4), with "
                      "its embeddings, pooler and head (DistilBERT's start). Default: --init_checkpoint's model, "
                      "with a fresh head.")
    flags.DEFINE_string("student_init", None, "Where the student starts, in one flag: teacher_layers=0,2,4 (as "
                        "--teacher_layers) or a checkpoint bert_mgpu reads (as --init_checkpoint).")
    flags.DEFINE_float("temperature", 2.0, "Both softmaxes' temperature in the soft loss (Hinton's T).")
    flags.DEFINE_float("soft_weight", 1.0, "The soft loss's weight (it is also multiplied by T^2).")
    flags.DEFINE_float("hard_weight", 1.0, "The labels' loss's weight.")
    flags.DEFINE_float("hidden_weight", 0.0, "The hidden states' loss weight (TinyBERT): their mean squared "
                       "difference, the embeddings' output and each student layer's against its --layer_map "
                       "layer's; a student of another hidden size through a learnt projection (checkpointed "
                       "with the run, not part of the student).")
    flags.DEFINE_float("attention_weight", 0.0, "The attention loss's weight (TinyBERT's layers, MiniLM's "
                       "measure): the KL divergence of each student layer's attention distributions from its "
                       "--layer_map layer's. As many heads in both.")
    flags.DEFINE_list("layer_map", None, "The teacher's encoder layer (from 0) each student layer learns from in "
                      "the two losses above, e.g. 1,3,5. Default: --teacher_layers, else TinyBERT's uniform map "
                      "(the last from the last).")
    flags.DEFINE_string("teacher_logits", None, "A file (safetensors) that keeps the teacher's outputs on the training "
                        "rows: predicted once, at the start, if it does not exist; read if it was made from the "
                        "same rows and teacher (else refused). The steps then run the student alone. Not with "
                        "--hidden_weight or --attention_weight.")
    flags.DEFINE_string("unlabeled_file", None, "In-domain text without labels, added to every epoch's training "
                        f"rows with the soft loss alone: {unlabeled_help}")


@dataclasses.dataclass(frozen=True)
class Options:
    """The flags the student's opening reads."""

    do_train: bool
    do_eval: bool
    teacher: str | None
    teacher_layers: tuple | None
    temperature: float
    soft_weight: float
    hard_weight: float
    unlabeled_file: str | None
    eval_batch_size: int
    columns: tuple = (None, None)  # a TSV/JSONL unlabelled file's --text_column, --text_b_column if given
    hidden_weight: float = 0.0
    attention_weight: float = 0.0
    layer_map: tuple | None = None
    teacher_logits: str | None = None
    student_checkpoint: str | None = None  # --student_init=PATH

    @classmethod
    def from_flags(cls, values):
        given = lambda name: values[name].value if name in values and values[name].present else None  # noqa: E731
        layers, checkpoint = values.teacher_layers, None
        if values.student_init:  # the one flag for --teacher_layers or the student's --init_checkpoint
            if layers or given("init_checkpoint"):
                raise UserError("--student_init with --teacher_layers or --init_checkpoint: give one of them")
            if values.student_init.startswith("teacher_layers="):
                layers = [v for v in values.student_init.split("=", 1)[1].split(",") if v]
            else:
                checkpoint = values.student_init
        return cls(values.do_train, values.do_eval, values.teacher,
                   _layers_of("teacher_layers", layers), values.temperature,
                   values.soft_weight, values.hard_weight, values.unlabeled_file, values.eval_batch_size,
                   (given("text_column"), given("text_b_column")), values.hidden_weight, values.attention_weight,
                   _layers_of("layer_map", values.layer_map), values.teacher_logits, checkpoint)


class Student:
    """`open(init, labels, **from_pretrained's keywords)`: the student a script trains (taught by the teacher)
    or, without --do_train, the run's own model; `facts(model, dev)`: the summary's lines on both.
    `head`: BertClassifier or BertTagger; `read_unlabeled(path, columns, teacher)`: the unlabelled file's
    rows as `head.unlabelled_rows` takes them; `name`: the head's, in messages."""

    def __init__(self, options, head, read_unlabeled, name):
        self.options, self.head, self.read_unlabeled, self.teacher = options, head, read_unlabeled, None
        self.distiller = None  # the teacher's and the student's, once `open` made it
        self.name = name  # the head's, in messages: classifier, tagger

    def open(self, init, labels=None, **keywords):
        import bert_mgpu

        o = self.options
        if not o.do_train:
            return self.head.from_pretrained(init, labels=labels, **keywords)
        init = o.student_checkpoint or init
        if not o.teacher:
            raise UserError(f"--teacher is required to train: the fine-tuned {self.name} run that teaches")
        shared = {k: keywords[k] for k in ("towers", "precision", "max_seq_length")}
        teacher = self.head.from_pretrained(o.teacher, **shared)
        unknown = sorted(set(labels or ()) - set(teacher.labels))
        if unknown:
            raise UserError(f"--teacher={o.teacher}: its labels ({', '.join(teacher.labels)}) do not include "
                            f"{', '.join(unknown)} of the training data")
        if o.teacher_layers and init:
            raise UserError("--teacher_layers and --init_checkpoint: the student starts from one of them, not both")
        if o.teacher_layers:
            student = bert_mgpu.Distiller.student_from_layers(teacher, o.teacher_layers)
        elif init:
            student = self.head.from_pretrained(init, labels=teacher.labels, **keywords)
        else:
            raise UserError("--teacher_layers or --init_checkpoint: where the student starts")
        unlabeled = None
        if o.unlabeled_file:
            unlabeled = self.read_unlabeled(o.unlabeled_file, o.columns, teacher)
            if not unlabeled:
                raise UserError(f"--unlabeled_file={o.unlabeled_file}: no text in it")
        self.teacher = teacher
        self.distiller = bert_mgpu.Distiller(teacher, student, o.temperature, o.soft_weight, o.hard_weight,
                                             unlabeled, o.hidden_weight, o.attention_weight, o.layer_map,
                                             o.teacher_logits)
        return self.distiller.attach()

    def facts(self, student, dev):
        """The teacher's and the student's depths, the unlabelled rows, and with --do_eval the teacher's score
        and the student's speed-up."""
        if self.teacher is None:
            return {"student": _layers(student)}
        out = {"teacher": f"{self.options.teacher} ({_layers(self.teacher)})", "student": _layers(student),
               **({"unlabeled rows": len(student.unlabelled)} if student.unlabelled else {})}
        cache = self.distiller.cache
        if cache is not None and cache.source:
            out["teacher logits"] = f"{cache.source} {cache.path}"
        if self.options.do_eval and dev:
            metric, size = self.teacher.main_metric, self.options.eval_batch_size
            out[f"teacher {metric}"] = self.teacher.evaluate(dev, batch_size=size, verbose=False)[metric]
            fast, slow = (rows_per_second(m, dev, size) for m in (student, self.teacher))
            if fast and slow:
                out["student speed-up"] = f"{fast / slow:.2f}x (predicting dev: {fast:.1f} against {slow:.1f} rows/s)"
        return out


def _layers_of(flag, values):
    """A list flag of layer numbers -> a tuple of ints, or UserError in one line."""
    if not values:
        return None
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        raise UserError(f"--{flag}={','.join(values)}: expected layer numbers, e.g. 0,2,4") from None


def _layers(model):
    n = model.config.num_hidden_layers
    return f"{n} encoder layer{'s' if n != 1 else ''}"


def rows_per_second(model, dev, batch_size, rows=512):
    """Dev rows a second `model` predicts (its `predict` for a classifier, `predict_tags` for a tagger), the
    best of 2 passes over up to `rows` of them in whole global batches (the shapes its evaluation compiled),
    or None for a dev set under one global batch."""
    n = min(len(dev), rows) // model.towers.batch(batch_size) * model.towers.batch(batch_size)
    if not n:
        return None
    predict = getattr(model, "predict_tags", model.predict)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        predict(dev[:n], batch_size=batch_size, verbose=False)
        times.append(time.perf_counter() - start)
    return n / min(times)
