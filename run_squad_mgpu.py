"""Extractive question answering (SQuAD 1.1/2.0, CMRC 2018, DRCD) on every GPU: google-bert's run_squad.py
flags plus --n_gpus.

    python run_squad_mgpu.py --vocab_file=$BERT_BASE_DIR/vocab.txt --bert_config_file=$BERT_BASE_DIR/bert_config.json \
        --init_checkpoint=$BERT_BASE_DIR/bert_model.ckpt --do_train=True --train_file=$SQUAD_DIR/train-v1.1.json \
        --do_predict=True --predict_file=$SQUAD_DIR/dev-v1.1.json --train_batch_size=12 --learning_rate=3e-5 \
        --num_train_epochs=2.0 --max_seq_length=384 --doc_stride=128 --output_dir=/tmp/squad_base/ --n_gpus=4

Writes predictions.json, nbest_predictions.json and (v2) null_odds.json as run_squad does; --do_eval (or
--do_predict on a file with answers) scores them with the official rules into eval_results.txt. A thin
wrapper over `bert_mgpu.BertQuestionAnswerer`; a user mistake ends in one line and exit status 1.
"""

import math
import os
import time

from absl import app, flags

from bert_mgpu.cli import fine_tuning
from bert_mgpu.cli.fine_tuning import define_fine_tuning_flags

FLAGS = flags.FLAGS
define_fine_tuning_flags(
    "Where to find the files when --train_file or --predict_file is not given (train*.json, dev*.json).",
    "WordPieces a window holds: [CLS] question [SEP] context [SEP]; a longer context is read in windows "
    "--doc_stride apart.",
    "Answer --predict_file; writes predictions.json, nbest_predictions.json and (v2) null_odds.json.",
    "What picks the model kept in best/: f1 (the default) or exact_match.",
    "Train with the largest per-tower batch that fits")
flags.adopt_module_key_flags(fine_tuning)  # --help lists them as this script's own
FLAGS.set_default("max_seq_length", 384)  # run_squad's defaults
flags.DEFINE_string("train_file", None, "SQuAD JSON for training (train-v1.1.json; CMRC 2018 and DRCD too).")
flags.DEFINE_string("predict_file", None, "SQuAD JSON to answer (dev-v1.1.json); with answers, --do_eval scores it.")
flags.DEFINE_integer("doc_stride", 128, "WordPieces between the starts of a long context's windows.")
flags.DEFINE_integer("max_query_length", 64, "WordPieces of a question kept; the rest is cut.")
flags.DEFINE_integer("n_best_size", 20, "Spans kept per question in nbest_predictions.json.")
flags.DEFINE_integer("max_answer_length", 30, "WordPieces an answer may have at most.")
flags.DEFINE_bool("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer.")
flags.DEFINE_float("null_score_diff_threshold", 0.0, "v2: no answer when the null score exceeds the best "
                   "answer's by more than this (tune it with eval_results.txt's best_f1_thresh).")
flags.DEFINE_enum("metric", "auto", ["auto", "squad", "cmrc"], "The official rules to score with: SQuAD's or "
                  "CMRC 2018's (Chinese); auto: cmrc when the contexts are Chinese.")
flags.DEFINE_bool("verbose_logging", False, "Accepted for google-bert compatibility; unused.")


def _find(kind, wanted):
    """--train_file / --predict_file, else the one train*.json / dev*.json in --data_dir."""
    given = FLAGS.train_file if kind == "train" else FLAGS.predict_file
    if given or not wanted:
        return given
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError

    flag = "--train_file" if kind == "train" else "--predict_file"
    if not FLAGS.data_dir:
        raise UserError(f"{flag} is required")
    found = sorted(storage.glob(os.path.join(FLAGS.data_dir, f"{kind}*.json")))
    if len(found) != 1:
        raise UserError(f"{FLAGS.data_dir}: {len(found) or 'no'} {kind}*.json files; give {flag}")
    return found[0]


RUN_SETTINGS = ("doc_stride", "max_query_length", "n_best_size", "max_answer_length")  # kept in the run


def run():
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data.squad import metric_for, read_squad
    from bert_mgpu.data.squad_input import check_lengths
    from bert_mgpu.io import outputs

    started = time.monotonic()
    cli.check_numbers(FLAGS, at_least={**fine_tuning.AT_LEAST, "doc_stride": 1, "max_query_length": 1, "n_best_size": 1,
                                "max_answer_length": 1}, positive=fine_tuning.POSITIVE,
                      fraction=("warmup_proportion",))
    # Training sets these; predicting from a run directory takes the run's own unless a flag is given.
    given = {n: getattr(FLAGS, n) for n in RUN_SETTINGS if FLAGS.do_train or FLAGS[n].present}
    if FLAGS.do_train:
        check_lengths(FLAGS.max_seq_length, FLAGS.max_query_length, FLAGS.doc_stride)
    if not math.isfinite(FLAGS.null_score_diff_threshold):  # nan compares false: every question answered
        raise UserError(f"--null_score_diff_threshold={FLAGS.null_score_diff_threshold}: must be a finite number")
    begun = fine_tuning.begin(FLAGS, "run_squad_mgpu.py", "question_answerer", ("output_dir",))
    if begun is None:
        return
    towers, exports = begun
    splits = fine_tuning.wanted(FLAGS)
    train_file = _find("train", FLAGS.do_train)
    predict_file = _find("dev", FLAGS.do_predict or "dev" in splits)
    v2 = FLAGS.version_2_with_negative
    train = read_squad(train_file, v2, FLAGS.invalid_utf8, training=True)[0] if FLAGS.do_train else None
    questions = read_squad(predict_file, v2, FLAGS.invalid_utf8)[0] if predict_file else None
    answered = questions is not None and any(q.answers or q.impossible for q in questions)
    if "dev" in splits and not answered:
        raise UserError(f"{predict_file}: holds no answers to evaluate with")
    init = FLAGS.init_checkpoint or (None if FLAGS.do_train else FLAGS.output_dir)
    given_length = FLAGS["max_seq_length"].present or FLAGS.do_train  # else the run directory's windows
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(
        init, towers=towers, precision=FLAGS.precision, max_seq_length=FLAGS.max_seq_length if given_length else None,
        do_lower_case=FLAGS.do_lower_case, bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file,
        fused_encoder=FLAGS.fused_encoder, version_2_with_negative=v2,
        null_score_diff_threshold=FLAGS.null_score_diff_threshold, **given)
    check_lengths(qa.max_seq_length, qa.max_query_length, qa.doc_stride)  # the run's, before any work
    qa.metric = None if FLAGS.metric == "auto" else FLAGS.metric
    if questions is not None and qa.metric is None:
        qa.metric = metric_for(questions)
    dev = questions if fine_tuning.watching(FLAGS) else None
    cli.check_exports(qa, exports)  # the formats the model itself rules out, before any training
    if FLAGS.do_train:  # a signal ends it here, with a checkpoint and a retryable exit code
        fine_tuning.train(FLAGS, qa, train, dev, ("train_file", "predict_file", "metric"))
    results, found = {}, None
    if FLAGS.do_eval or (FLAGS.do_predict and answered):
        results, path = fine_tuning.evaluate(FLAGS, qa, questions, towers.is_chief)
        found = qa.answers
        if towers.is_chief:
            print(f"eval: f1 {results['eval_f1']:.2f}, exact match {results['eval_exact_match']:.2f} "
                  f"({qa.metric}) on {len(questions)} questions -> {path}")
    if FLAGS.do_predict:
        found = found or qa.answer(questions, batch_size=FLAGS.predict_batch_size)
        if towers.is_chief:
            paths = storage.write_set(FLAGS.output_dir, qa.reader().prediction_files(found, questions))
            print(f"predict: {len(questions)} questions -> {', '.join(paths)}")
    if towers.is_chief:
        cli.run_exports(FLAGS, qa, exports)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        print(fine_tuning.summary(FLAGS, "run_squad_mgpu.py", towers, qa, {"metric": qa.metric}, results, started,
                                  "windows/s"))


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
