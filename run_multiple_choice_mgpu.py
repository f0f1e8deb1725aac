"""Multiple choice (SWAG, C3, CHID, your own JSON lines) on every GPU: google-bert's flags plus --n_gpus.

    python run_multiple_choice_mgpu.py --data_dir=data/swag --init_checkpoint=uncased_L-12_H-768_A-12 \
        --output_dir=out --do_train=true --do_eval=true --do_predict=true --n_gpus=4

train/dev/test files in --data_dir: JSON lines ({"context", "question", "choices", "label"}: train.jsonl,
dev.jsonl, test.jsonl), SWAG's CSV (train.csv, val.csv, test.csv), C3's JSON (d-train.json with m-train.json,
...) or CHID's (train.json with train_answer.json, ...); --data_format, told from the files by default. Each
choice is read with its context, and a softmax over the choices picks one. A thin wrapper over
`bert_mgpu.BertMultipleChoice`; a user mistake ends in one line and exit status 1.
"""

import time

from absl import app, flags

from bert_mgpu.cli import fine_tuning
from bert_mgpu.cli.fine_tuning import define_fine_tuning_flags

FLAGS = flags.FLAGS
define_fine_tuning_flags(
    "Directory with train, dev and test files (train.jsonl, dev.jsonl, test.jsonl; SWAG's train.csv, val.csv, "
    "test.csv; C3's d-/m-train.json, d-/m-dev.json, test1.1.json; CHID's train.json and train_answer.json, ...).",
    "WordPieces a choice's input holds (context, question and choice; the longer part is cut first).",
    "Predict test; writes predictions.jsonl (each question's choice and probabilities), predict.txt (the "
    "chosen index a line) and, for C3 and CHID, CLUE's leaderboard file.",
    "What picks the model kept in best/: accuracy (the default) or loss.",
    "Train with the largest per-tower batch that fits")
flags.adopt_module_key_flags(fine_tuning)  # --help lists them as this script's own
FLAGS.set_default("export_format", ["hf"])  # no served graph for multiple choice yet
flags.DEFINE_enum("data_format", "auto", ["auto", "jsonl", "swag", "c3", "chid"], "How the files are written: "
                  "jsonl, swag (SWAG's CSV), c3 (C3's JSON), chid (CHID's JSON lines and answer file); auto tells "
                  "from each file.")


def run():
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data import choices
    from bert_mgpu.io import outputs

    started = time.monotonic()
    cli.check_numbers(FLAGS, at_least=fine_tuning.AT_LEAST, positive=fine_tuning.POSITIVE,
                      fraction=("warmup_proportion",))
    begun = fine_tuning.begin(FLAGS, "run_multiple_choice_mgpu.py", "multiple_choice")
    if begun is None:
        return
    towers, exports = begun
    read = {split: choices.read_split(FLAGS.data_dir, split, FLAGS.data_format, FLAGS.invalid_utf8)
            for split in fine_tuning.wanted(FLAGS)}
    train, dev = (read[split][0] if split in read else None for split in ("train", "dev"))
    unlabelled = next((q for q in (dev or ()) if q.label is None), None)
    if unlabelled is not None:
        raise UserError(f"{unlabelled.where}: a dev question has no label to evaluate with")
    init = FLAGS.init_checkpoint or (None if FLAGS.do_train else FLAGS.output_dir)
    given_length = FLAGS["max_seq_length"].present or FLAGS.do_train  # else the run directory's
    mc = bert_mgpu.BertMultipleChoice.from_pretrained(
        init, towers=towers, precision=FLAGS.precision, max_seq_length=FLAGS.max_seq_length if given_length else None,
        do_lower_case=FLAGS.do_lower_case, bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file,
        fused_encoder=FLAGS.fused_encoder)
    if train:
        mc.probe_choices = max(len(q.choices) for q in train)  # what --auto_batch_size measures with
    cli.check_exports(mc, exports)  # the formats the model itself rules out, before any training
    if FLAGS.do_train:  # a signal ends it here, with a checkpoint and a retryable exit code
        fine_tuning.train(FLAGS, mc, train, dev if fine_tuning.watching(FLAGS) else None, ("data_format",))
    results = {}
    if FLAGS.do_eval:
        results, path = fine_tuning.evaluate(FLAGS, mc, dev, towers.is_chief)
        if towers.is_chief:
            print(f"eval: accuracy {results['eval_accuracy']:.4f} on {len(dev)} questions -> {path}")
    if FLAGS.do_predict:
        test, test_files = read["test"]
        predicted = mc.predict(test, batch_size=FLAGS.predict_batch_size)
        if towers.is_chief:
            form = choices.detect_format(test_files[0]) if FLAGS.data_format == "auto" else FLAGS.data_format
            files = mc.reader(submission=form).prediction_files([p["probabilities"] for p in predicted], test)
            paths = storage.write_set(FLAGS.output_dir, files)
            print(f"predict: {len(test)} questions -> {', '.join(paths)}")
    if towers.is_chief:
        cli.run_exports(FLAGS, mc, exports)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        most = max(len(q.choices) for rows in read.values() for q in rows[0])
        print(fine_tuning.summary(FLAGS, "run_multiple_choice_mgpu.py", towers, mc, {"choices": most}, results, started,
                                  "questions/s"))


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
