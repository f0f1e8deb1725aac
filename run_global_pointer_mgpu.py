"""GlobalPointer NER (nested and overlapping entities) on every GPU, with run_ner_mgpu.py's flags.

    python run_global_pointer_mgpu.py --data_dir=data/cluener --init_checkpoint=chinese_L-12_H-768_A-12 \
        --output_dir=out --do_train=true --do_eval=true --do_predict=true --n_gpus=4

train/dev/test files in --data_dir: CLUENER's JSON lines (overlapping entities kept), JSON lines of
{"tokens": [...], "entities": [{"type", "start", "end"}]} (token indices, end exclusive; entities may nest),
or any file run_ner_mgpu.py reads (its tags as entities). A thin wrapper over `bert_mgpu.BertGlobalPointer`;
a user mistake ends in one line and exit status 1.
"""

import time

from absl import app, flags

import run_ner_mgpu  # noqa: F401 (its flags are this script's: --data_format, --doc_stride, --labels, ...)
from bert_mgpu.cli import fine_tuning

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(run_ner_mgpu)
flags.DEFINE_integer("head_size", None, "Each entity type's query and key width (bert4keras' head_size; default: "
                     "the checkpoint's, else 64).")


def run():
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data import spans, tagged
    from bert_mgpu.io import outputs

    started = time.monotonic()
    cli.check_numbers(FLAGS, at_least={**fine_tuning.AT_LEAST, "doc_stride": 1, "head_size": 2},
                      positive=fine_tuning.POSITIVE, fraction=("warmup_proportion",))
    if FLAGS.crf:
        raise UserError("--crf: a GlobalPointer scores spans, not tag sequences; use run_ner_mgpu.py for a CRF")
    tag_map = fine_tuning.tag_map(FLAGS)  # a bad --tag_map ends the run before anything is set up
    begun = fine_tuning.begin(FLAGS, "run_global_pointer_mgpu.py", "global_pointer")
    if begun is None:
        return
    towers, exports = begun
    files = {split: tagged.find_split(FLAGS.data_dir, split) for split in fine_tuning.wanted(FLAGS)}
    options = {} if FLAGS.data_format == "auto" else {"data_format": FLAGS.data_format}
    read = {split: spans.read_spans(path, FLAGS.invalid_utf8, split, tag_column=FLAGS.tag_column,
                                    tag_map=tag_map, **options) for split, path in files.items()}
    train, dev, test = read.get("train"), read.get("dev"), read.get("test")
    for split, rows in (("train", train), ("dev", dev)):
        if rows is not None and any(s.entities is None for s in rows):
            raise UserError(f"{files[split]}: has no entities (tags, CLUENER's \"label\" or \"entities\")")
    types = FLAGS.labels or (spans.entity_types(train) if train else None)
    init = FLAGS.init_checkpoint or (None if FLAGS.do_train else FLAGS.output_dir)
    given_length = FLAGS["max_seq_length"].present or FLAGS.do_train  # else the run directory's windows
    gp = bert_mgpu.BertGlobalPointer.from_pretrained(
        init, types=types, towers=towers, precision=FLAGS.precision,
        max_seq_length=FLAGS.max_seq_length if given_length else None, do_lower_case=FLAGS.do_lower_case,
        bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file, fused_encoder=FLAGS.fused_encoder,
        doc_stride=FLAGS.doc_stride, head_size=FLAGS.head_size)
    for split in ("train", "dev", "test"):  # a type the model has no output for, named by file and line
        if read.get(split) is not None:
            spans.check_types(read[split], gp.labels, files[split])
    cli.check_exports(gp, exports)
    if FLAGS.do_train:  # a signal ends it here, with a checkpoint and a retryable exit code
        fine_tuning.train(FLAGS, gp, train, dev, ("data_format", "head_size"))
    results = {}
    if FLAGS.do_eval:
        results = fine_tuning.evaluate_entities(FLAGS, gp, dev, towers.is_chief)
    if FLAGS.do_predict:
        predicted = gp.predict_entities(test, batch_size=FLAGS.predict_batch_size)
        if towers.is_chief:
            fine_tuning.write_entity_predictions(FLAGS, gp.reader().prediction_files(predicted, test), len(test))
    if towers.is_chief:
        cli.run_exports(FLAGS, gp, exports)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        print(fine_tuning.summary(FLAGS, "run_global_pointer_mgpu.py", towers, gp,
                                  {"entity types": len(gp.labels), "head size": gp.head_size}, results, started,
                                  "windows/s"))


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
