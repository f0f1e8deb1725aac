"""google-research/bert's run_classifier.py on every GPU: the same flags, plus --n_gpus and friends.

    python run_classifier_mgpu.py --task_name=mrpc --data_dir=glue/MRPC --init_checkpoint=uncased_L-12_H-768_A-12 \
        --output_dir=out --do_train=true --do_eval=true --do_predict=true --n_gpus=4

A thin wrapper over `bert_mgpu.BertClassifier`; a user mistake ends in one line and exit status 1.
"""

import os
import time

from absl import app, flags

from bert_mgpu.cli import fine_tuning, sweep
from bert_mgpu.cli.fine_tuning import define_fine_tuning_flags

FLAGS = flags.FLAGS
define_fine_tuning_flags(
    "Directory with the task's train/dev/test files.",
    "Longer inputs are truncated (batches are padded only to their longest example).",
    "Predict test; writes test_results.tsv, predict.txt, predictions.tsv.",
    "What picks the model kept in best/: accuracy, loss, f1 (MRPC), mcc (CoLA); default the task's (f1 for "
    "MRPC, mcc for CoLA, else accuracy).", "Train with the largest per-tower batch that fits")
sweep.define_sweep_flags()
flags.adopt_module_key_flags(fine_tuning)  # --help lists them as this script's own
flags.DEFINE_string("task_name", None, "A GLUE task (cola, sst-2, mrpc, sts-b, qqp, mnli, mnli-mm, qnli, rte, "
                    "wnli, ax), xnli, tsv, csv or tfds.")
flags.DEFINE_enum("task_type", None, ["classification", "regression", "multi_label"], "regression: the labels "
                  "are scores, one output trained with mean squared error, Pearson and Spearman reported; "
                  "multi_label: each label a set (--label_separator), sigmoid outputs, binary cross-entropy, micro "
                  "and macro F1 (default: the task's; sts-b is a regression, tsv/csv a classification).")
flags.DEFINE_string("label_separator", ",", "multi_label: what separates an example's labels in its label cell.")
flags.DEFINE_float("threshold", 0.5, "multi_label: a label is predicted when its probability is above this.")
flags.DEFINE_list("labels", None, "Label set, comma-separated (default: the labels of the training data).")
flags.DEFINE_string("text_column", "text", "tsv/csv/jsonl/tfds: column of the (first) text: a header name, or a "
                    "number (0 = first) for a file without a header row (jsonl default: sentence).")
flags.DEFINE_string("text_b_column", None, "tsv/csv/jsonl/tfds: column of the second text of a pair.")
flags.DEFINE_string("label_column", "label", "tsv/csv/jsonl/tfds: column of the label.")
flags.DEFINE_list("metrics", None, "Evaluation adds these (eval_<name>): accuracy, f1, f1_macro, f1_micro, mcc, "
                  "auc, pearson, spearman; also for --metric_for_best_model.")
flags.DEFINE_enum("predict_format", "label", ["label", "index"], "predict.txt: the predicted label a line, or its "
                  "index in the label list (bert-ad's two forms).")
flags.DEFINE_string("tfds_name", None, "tfds: dataset name, prepared in --tfds_data_dir (never downloaded).")
flags.DEFINE_string("tfds_data_dir", None, "tfds: its local data_dir.")
flags.DEFINE_list("tfds_splits", ["train", "validation", "test"], "tfds: the splits used as train,dev,test.")
flags.DEFINE_string("xnli_language", "zh", "xnli: language of train and dev.")
flags.DEFINE_enum("truncation", None, ["head", "tail", "head+tail"], "Which pieces of a text longer than "
                  "--max_seq_length stay: its start (google-bert's), its end, or its first quarter and the rest "
                  "from its end (Sun et al. 2019: 128 + 382 at 512). Default: the run's, else head.")
flags.DEFINE_integer("doc_stride", None, "Read each text in windows of --max_seq_length pieces this many apart "
                     "and pool the windows' outputs into one a text (--window_pooling); training sees every "
                     "window, each text counting once. Default: the run's, else one window, truncated.")
flags.DEFINE_enum("window_pooling", None, ["mean", "max"], "With --doc_stride: the mean or the maximum of a "
                  "text's windows' logits. Default: the run's, else mean.")

def run(open_classifier=None, settings=("task_name",), script="run_classifier_mgpu.py", facts=None):
    """The script; run_distill_mgpu.py runs it with its own `open_classifier(init, **from_pretrained's
    keywords)` (a student taught by a teacher), the `settings` (flag names) a resumed run must share, its
    name and `facts(classifier, dev)` ({name: value}) for the summary."""
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.core import storage
    from bert_mgpu.io import outputs
    from bert_mgpu.parallel import precision

    started = time.monotonic()
    cli.check_numbers(FLAGS, at_least={**fine_tuning.AT_LEAST, "doc_stride": 1}, positive=fine_tuning.POSITIVE,
                      fraction=("warmup_proportion", "threshold"))
    if sweep.requested(FLAGS):  # one run a configuration and seed, each a process of its own, then the table
        return sweep.run_sweep(FLAGS, os.path.join(os.path.dirname(os.path.abspath(__file__)), script))
    begun = cli.prelude(FLAGS, ("do_train", "do_eval", "do_predict"), ("task_name", "data_dir", "output_dir"),
                        lambda plan: FLAGS.train_batch_size,
                        lambda plan: "precision: %s (%s)" % precision.resolve_precision(FLAGS.precision, plan))
    if begun is None:
        return
    towers, exports = begun
    task = bert_mgpu.get_task(
        FLAGS.task_name, text_column=FLAGS.text_column, label_column=FLAGS.label_column,
        text_b_column=FLAGS.text_b_column, labels=FLAGS.labels, tfds_name=FLAGS.tfds_name,
        tfds_data_dir=FLAGS.tfds_data_dir, xnli_language=FLAGS.xnli_language, tfds_splits=tuple(FLAGS.tfds_splits),
        invalid_utf8=FLAGS.invalid_utf8, task_type=FLAGS.task_type, label_separator=FLAGS.label_separator)
    from bert_mgpu.model.objectives import objective

    objective(task.task_type).check_metrics(FLAGS.metrics)
    train = task.get_examples(FLAGS.data_dir, "train") if FLAGS.do_train else None
    # Known labels make the task check every dev row against them, naming file and line.
    labels = FLAGS.labels or (task.get_labels(FLAGS.data_dir, train) if FLAGS.do_train else None)
    dev = task.get_examples(FLAGS.data_dir, "dev") if "dev" in fine_tuning.wanted(FLAGS) else None
    test = task.get_examples(FLAGS.data_dir, "test") if FLAGS.do_predict else None

    init = FLAGS.init_checkpoint or (None if FLAGS.do_train else FLAGS.output_dir)
    clf = (open_classifier or bert_mgpu.BertClassifier.from_pretrained)(
        init, labels=labels, towers=towers, precision=FLAGS.precision, max_seq_length=FLAGS.max_seq_length,
        do_lower_case=FLAGS.do_lower_case, bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file,
        task=task.name, fused_encoder=FLAGS.fused_encoder, truncation=FLAGS.truncation,
        doc_stride=FLAGS.doc_stride, window_pooling=FLAGS.window_pooling,
        # Evaluating or predicting with a run directory, unless told: the task type it was trained for.
        task_type=FLAGS.task_type or (None if task.task_type == "classification" and not FLAGS.do_train
                                      else task.task_type))
    clf.metrics = FLAGS.metrics or []
    for name in ("label_separator", "threshold"):  # given ones win over what a run directory recorded
        if FLAGS[name].present:
            setattr(clf, name, getattr(FLAGS, name))
    cli.check_exports(clf, exports)  # the formats the model itself rules out, before any training
    if FLAGS.do_train:  # a signal ends it here, with a checkpoint and a retryable exit code
        fine_tuning.train(FLAGS, clf, train, dev, settings)
    results = {}
    if FLAGS.do_eval:
        results, path = fine_tuning.evaluate(FLAGS, clf, dev, towers.is_chief)
        if towers.is_chief:
            main = clf.main_metric
            print(f"eval: {main[len('eval_'):]} {results[main]:.4f} on {len(dev)} examples -> {path}")
    if FLAGS.do_predict:
        predicted = clf.predict(test, batch_size=FLAGS.predict_batch_size)
        if towers.is_chief:
            files = clf.reader(predict_format=FLAGS.predict_format).prediction_files(predicted, test)
            paths = storage.write_set(FLAGS.output_dir, files)
            print(f"predict: {len(test)} examples -> {', '.join(paths)}")
    if towers.is_chief:
        cli.run_exports(FLAGS, clf, exports, [e.text_a for e in (dev or test or [])[:64]])
        if FLAGS.do_eval and clf.confusion is not None:
            outputs.draw("write_confusion", FLAGS.output_dir, clf.confusion, clf.labels)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        print(fine_tuning.summary(FLAGS, script, towers, clf, {"task": task.name, **(facts(clf, dev) if facts else {})},
                                  results, started))
        if FLAGS.sweep_member:  # last: a run killed before this line is run again
            sweep.write_member(FLAGS.output_dir, {k: v for k, v in results.items() if k.startswith("eval_")},
                               [clf.main_metric])

def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
