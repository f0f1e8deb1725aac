"""Named-entity recognition (token classification) on every GPU, with google-bert's flags plus --n_gpus.

    python run_ner_mgpu.py --data_dir=data/msra --init_checkpoint=chinese_L-12_H-768_A-12 --output_dir=out \
        --do_train=true --do_eval=true --do_predict=true --n_gpus=4

train/dev/test files in --data_dir in CoNLL columns, one character a line, segmented words, CLUENER's JSON
or JSON lines (--data_format, detected by default). A thin wrapper over `bert_mgpu.BertTagger`; a user
mistake ends in one line and exit status 1.
"""

import time

from absl import app, flags

from bert_mgpu.cli import fine_tuning
from bert_mgpu.cli.fine_tuning import define_fine_tuning_flags

FLAGS = flags.FLAGS
define_fine_tuning_flags(
    "Directory with train, dev and test files (train.txt, dev.txt, test.txt; CoNLL-2003's eng.train, "
    "eng.testa, eng.testb; CLUENER's train.json, dev.json, test.json).",
    "WordPieces a window holds; a longer sentence is read in windows --doc_stride apart, never cut short.",
    "Predict test; writes predict.txt (CoNLL columns), predictions.jsonl (entities with character offsets; "
    "and cluener_predict.json for CLUENER's data).",
    "What picks the model kept in best/: f1 (entity-level, the default), precision, recall, accuracy, loss.",
    "Train with the largest per-tower batch that fits")
flags.adopt_module_key_flags(fine_tuning)  # --help lists them as this script's own
flags.DEFINE_enum("data_format", "auto", ["auto", "conll", "segmented", "cluener", "jsonl"], "How the files are "
                  "written: conll (a token a line, columns, blank lines between sentences; also one Chinese "
                  "character a line), segmented (word/pos items, --tag_map), cluener (CLUENER2020's JSON lines), "
                  "jsonl ({\"tokens\": [...], \"tags\": [...]}); auto tells from each file.")
flags.DEFINE_integer("tag_column", -1, "conll: the column of the tag (0 = first; default: the last).")
flags.DEFINE_list("tag_map", None, "segmented: parts of speech that are entities and their types, e.g. "
                  "nr=PER,ns=LOC,nt=ORG (the others are O).")
flags.DEFINE_integer("doc_stride", None, "WordPieces between the starts of a long sentence's windows (default: "
                     "half a window).")
flags.DEFINE_bool("crf", None, "A linear-chain CRF over the tag scores: transitions learnt, Viterbi decoding "
                  "(default: whether --init_checkpoint is a tagger with one). Exports as google or saved_model.")
flags.DEFINE_list("labels", None, "The tags, comma-separated, O first (default: the tags of the training data).")


def run(open_tagger=None, settings=("data_format",), script="run_ner_mgpu.py", facts=None):
    """The script; run_distill_ner_mgpu.py runs it with its own `open_tagger(init, **from_pretrained's
    keywords)` (a student taught by a teacher), the `settings` (flag names) a resumed run must share, its name
    and `facts(tagger, dev)` ({name: value}) for the summary."""
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data import tagged
    from bert_mgpu.io import outputs

    started = time.monotonic()
    cli.check_numbers(FLAGS, at_least={**fine_tuning.AT_LEAST, "doc_stride": 1}, positive=fine_tuning.POSITIVE,
                      fraction=("warmup_proportion",))
    tag_map = fine_tuning.tag_map(FLAGS)
    if FLAGS.do_export and FLAGS.crf and "hf" in FLAGS.export_format:
        raise UserError("--crf --export_format=hf: transformers' BertForTokenClassification has no CRF; export "
                        "google or saved_model")
    begun = fine_tuning.begin(FLAGS, "run_ner_mgpu.py", "tagger")
    if begun is None:
        return
    towers, exports = begun
    files = {split: tagged.find_split(FLAGS.data_dir, split) for split in fine_tuning.wanted(FLAGS)}
    forms = {split: tagged.detect_format(path, FLAGS.invalid_utf8) if FLAGS.data_format == "auto" else FLAGS.data_format
             for split, path in files.items()}
    read = {split: tagged.read_tagged(path, forms[split], FLAGS.tag_column, tag_map, FLAGS.invalid_utf8, split)
            for split, path in files.items()}
    train, dev, test = read.get("train"), read.get("dev"), read.get("test")
    if train is not None and any(s.tags is None for s in train):
        raise UserError(f"{files['train']}: has no tags (a tag column, \"tags\" or \"label\")")
    labels = FLAGS.labels or (tagged.tag_set(train) if train else None)
    if dev is not None and any(s.tags is None for s in dev):
        raise UserError(f"{files['dev']}: has no tags to evaluate with")
    init = FLAGS.init_checkpoint or (None if FLAGS.do_train else FLAGS.output_dir)
    given_length = FLAGS["max_seq_length"].present or FLAGS.do_train  # else the run directory's windows
    tagger = (open_tagger or bert_mgpu.BertTagger.from_pretrained)(
        init, labels=labels, towers=towers, precision=FLAGS.precision,
        max_seq_length=FLAGS.max_seq_length if given_length else None, do_lower_case=FLAGS.do_lower_case,
        bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file, fused_encoder=FLAGS.fused_encoder,
        doc_stride=FLAGS.doc_stride, crf=FLAGS.crf)
    for split in ("train", "dev", "test"):  # a tag the model has no output for, named by file and line
        if read.get(split) is not None:
            tagged.check_known(read[split], tagger.labels, files[split])
    cli.check_exports(tagger, exports)  # the formats the model itself rules out, before any training
    if FLAGS.do_train:  # a signal ends it here, with a checkpoint and a retryable exit code
        fine_tuning.train(FLAGS, tagger, train, dev, settings)
    results = {}
    if FLAGS.do_eval:
        results = fine_tuning.evaluate_entities(FLAGS, tagger, dev, towers.is_chief)
    if FLAGS.do_predict:
        predicted = tagger.predict_tags(test, batch_size=FLAGS.predict_batch_size)
        if towers.is_chief:
            fine_tuning.write_entity_predictions(
                FLAGS, tagger.reader(data_format=forms["test"]).prediction_files(predicted, test), len(test))
    if towers.is_chief:
        cli.run_exports(FLAGS, tagger, exports)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        print(fine_tuning.summary(FLAGS, script, towers, tagger, {"tags": len(tagger.labels),
                                                           **(facts(tagger, dev) if facts else {})}, results,
                                  started, "windows/s"))

def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
