"""Distil a fine-tuned classifier into a smaller one on every GPU: run_classifier_mgpu.py's flags, plus the
teacher and the loss.

    python run_distill_mgpu.py --teacher=out/teacher --teacher_layers=0,2,4 --task_name=tsv --data_dir=data \
        --output_dir=out/student --do_train --do_eval --do_predict --temperature=2 --n_gpus=4

The student learns the teacher's softened outputs beside the labels (bert_mgpu/model/distillation.py); the
teacher runs in the same tower step, untrained. --unlabeled_file adds in-domain text without labels, which the
teacher labels on the fly. The output directory is an ordinary classifier run (evaluate, predict, export and
resume it with run_classifier_mgpu.py too). A thin wrapper over `bert_mgpu.Distiller`; run_distill_ner_mgpu.py
does the same for a tagger.
"""

from absl import app, flags

import run_classifier_mgpu as classifier
from bert_mgpu.cli import distill

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(classifier)  # --help lists the classifier's flags as this script's own
distill.define_flags("classifier", "one text a line ('text_a ||| text_b' for a pair task), or a .tsv/.csv with a "
                     "header row or .jsonl (--text_column, else text, text_a, sentence or sentence1).")


def read_unlabeled(path, columns, teacher):
    """The file's texts (pairs for a pair classifier), blank lines left out."""
    from bert_mgpu.data.text_files import read_texts

    texts, second = read_texts(path, *columns, teacher.pairs)
    return [t for t in (texts if second is None else zip(texts, second)) if "".join(t).strip()]


def run():
    import bert_mgpu

    student = distill.Student(distill.Options.from_flags(FLAGS), bert_mgpu.BertClassifier, read_unlabeled,
                              "classifier")
    classifier.run(student.open, ("task_name", *distill.SETTINGS), "run_distill_mgpu.py", student.facts)


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
