"""Distil a fine-tuned tagger (NER) into a smaller one on every GPU: run_ner_mgpu.py's flags, plus the teacher
and the loss.

    python run_distill_ner_mgpu.py --teacher=out/ner --teacher_layers=0,2,4 --data_dir=data/msra \
        --output_dir=out/ner_student --do_train --do_eval --do_predict --temperature=2 --n_gpus=4

Each word's first WordPiece learns the teacher's softened tag distribution beside its tag
(bert_mgpu/model/distillation.py); the teacher runs in the same tower step, untrained. --unlabeled_file adds
in-domain sentences without tags, which the teacher tags on the fly. A teacher with a CRF is refused (its
words' scores are no distribution). The output directory is an ordinary tagger run (evaluate, predict, export
and resume it with run_ner_mgpu.py too). A thin wrapper over `bert_mgpu.Distiller`.
"""

from absl import app, flags

import run_ner_mgpu as ner
from bert_mgpu.cli import distill

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(ner)  # --help lists the tagger's flags as this script's own
distill.define_flags("tagger", "one text a line, cut into words as run_ner_mgpu.py's predictions cut them.")


def read_unlabeled(path, columns, teacher):
    """The file's non-blank lines."""
    from bert_mgpu.data.text_files import read_lines

    return [text for _, text in read_lines(path)]


def run():
    import bert_mgpu

    student = distill.Student(distill.Options.from_flags(FLAGS), bert_mgpu.BertTagger, read_unlabeled, "tagger")
    ner.run(student.open, ("data_format", *distill.SETTINGS), "run_distill_ner_mgpu.py", student.facts)


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
