"""Distil a fine-tuned classifier into a smaller one on every GPU: run_classifier_mgpu.py's flags, plus the
teacher and the loss.

    python run_distill_mgpu.py --teacher=out/teacher --teacher_layers=0,2,4 --task_name=tsv --data_dir=data \
        --output_dir=out/student --do_train --do_eval --do_predict --temperature=2 --n_gpus=4

The student learns the teacher's softened outputs beside the labels (bert_mgpu/model/distillation.py); the
teacher runs in the same tower step, untrained. --unlabeled_file adds in-domain text without labels, which the
teacher labels on the fly. The output directory is an ordinary classifier run (evaluate,
predict, export and resume it with run_classifier_mgpu.py too). A thin wrapper over `bert_mgpu.Distiller`.
"""

import time

from absl import app, flags

import run_classifier_mgpu as classifier

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(classifier)  # --help lists the classifier's flags as this script's own
flags.DEFINE_string("teacher", None, "The fine-tuned classifier that teaches: a bert_mgpu classifier run "
                    "(its output directory, or its best/).")
flags.DEFINE_list("teacher_layers", None, "The student: these encoder layers of the teacher (e.g. 0,2,4), with "
                  "its embeddings, pooler and head (DistilBERT's start). Default: --init_checkpoint's model, with a "
                  "fresh head.")
flags.DEFINE_float("temperature", 2.0, "Both softmaxes' temperature in the soft loss (Hinton's T).")
flags.DEFINE_float("soft_weight", 1.0, "The soft loss's weight (it is also multiplied by T^2).")
flags.DEFINE_float("hard_weight", 1.0, "The labels' cross-entropy's weight.")
flags.DEFINE_string("unlabeled_file", None, "In-domain text without labels, added to every epoch's training rows "
                    "with the soft loss alone: one text a line ('text_a ||| text_b' for a pair task), or a .tsv/.csv "
                    "with a header row or .jsonl (--text_column, else text, text_a, sentence or sentence1).")

_teacher = {}  # the teacher opened for this run, for the summary


def open_student(init, labels=None, **keywords):
    """The student to train (taught by --teacher), or to evaluate and predict with: then the run's own."""
    import bert_mgpu
    from bert_mgpu.core.errors import UserError

    if not FLAGS.do_train:
        return bert_mgpu.BertClassifier.from_pretrained(init, labels=labels, **keywords)
    if not FLAGS.teacher:
        raise UserError("--teacher is required to train: the fine-tuned classifier run that teaches")
    shared = {k: keywords[k] for k in ("towers", "precision", "max_seq_length")}
    teacher = bert_mgpu.BertClassifier.from_pretrained(FLAGS.teacher, **shared)
    unknown = sorted(set(labels or ()) - set(teacher.labels))
    if unknown:
        raise UserError(f"--teacher={FLAGS.teacher}: its labels ({', '.join(teacher.labels)}) do not include "
                        f"{', '.join(unknown)} of the training data")
    if FLAGS.teacher_layers and init:
        raise UserError("--teacher_layers and --init_checkpoint: the student starts from one of them, not both")
    if FLAGS.teacher_layers:
        student = bert_mgpu.Distiller.student_from_layers(teacher, FLAGS.teacher_layers)
    elif init:
        student = bert_mgpu.BertClassifier.from_pretrained(init, labels=teacher.labels, **keywords)
    else:
        raise UserError("--teacher_layers or --init_checkpoint: where the student starts")
    _teacher["model"] = teacher
    unlabeled = None
    if FLAGS.unlabeled_file:
        from bert_mgpu.data.text_files import read_texts

        given = lambda name: FLAGS[name].value if FLAGS[name].present else None  # noqa: E731
        texts, second = read_texts(FLAGS.unlabeled_file, given("text_column"), given("text_b_column"), teacher.pairs)
        unlabeled = [t for t in (texts if second is None else zip(texts, second)) if "".join(t).strip()]
        if not unlabeled:
            raise UserError(f"--unlabeled_file={FLAGS.unlabeled_file}: no text in it")
    return bert_mgpu.Distiller(teacher, student, FLAGS.temperature, FLAGS.soft_weight, FLAGS.hard_weight,
                               unlabeled).attach()


def facts(student, dev):
    """The summary's lines on the teacher and the student: their depths and, with --do_eval, the teacher's score."""
    teacher = _teacher.get("model")
    if teacher is None:
        return {"student": _layers(student)}
    out = {"teacher": f"{FLAGS.teacher} ({_layers(teacher)})", "student": _layers(student),
           **({"unlabeled examples": len(student.unlabelled)} if student.unlabelled else {})}
    if FLAGS.do_eval and dev:
        metric = teacher.main_metric
        out[f"teacher {metric}"] = teacher.evaluate(dev, batch_size=FLAGS.eval_batch_size, verbose=False)[metric]
        fast, slow = (examples_per_second(m, dev, FLAGS.eval_batch_size) for m in (student, teacher))
        if fast and slow:
            out["student speed-up"] = f"{fast / slow:.2f}x (predicting dev: {fast:.1f} against {slow:.1f} examples/s)"
    return out


def examples_per_second(model, dev, batch_size, rows=512):
    """Examples a second `model` predicts, the best of 2 passes over up to `rows` dev examples in whole global
    batches (the shapes its evaluation compiled), or None for a dev set under one global batch."""
    n = min(len(dev), rows) // model.towers.batch(batch_size) * model.towers.batch(batch_size)
    if not n:
        return None
    times = []
    for _ in range(2):
        start = time.perf_counter()
        model.predict(dev[:n], batch_size=batch_size, verbose=False)
        times.append(time.perf_counter() - start)
    return n / min(times)


def _layers(model):
    n = model.config.num_hidden_layers
    return f"{n} encoder layer{'s' if n != 1 else ''}"


def run():
    _teacher.clear()
    classifier.run(open_student, ("task_name", "teacher", "teacher_layers", "temperature", "soft_weight",
                                  "hard_weight", "unlabeled_file"), "run_distill_mgpu.py", facts)


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
