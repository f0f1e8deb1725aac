"""google-research/bert's run_classifier.py on every GPU: the same flags, plus --n_gpus and friends.

    python run_classifier_mgpu.py --task_name=mrpc --data_dir=glue/MRPC --init_checkpoint=uncased_L-12_H-768_A-12 \
        --output_dir=out --do_train=true --do_eval=true --do_predict=true --n_gpus=4

A thin wrapper over `bert_mgpu.BertClassifier`; a user mistake ends in one line and exit status 1.
"""

import logging
import time

from absl import app, flags

from bert_mgpu.cli import define_export_flags, define_reliability_flags, define_tower_flags

FLAGS = flags.FLAGS
# google-research/bert's flags
flags.DEFINE_string("data_dir", None, "Directory with the task's train/dev/test files.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: beside the checkpoint).")
flags.DEFINE_string("task_name", None, "A GLUE task (cola, sst-2, mrpc, sts-b, qqp, mnli, mnli-mm, qnli, rte, "
                    "wnli, ax), xnli, tsv, csv or tfds.")
flags.DEFINE_string("vocab_file", None, "vocab.txt (default: beside the checkpoint).")
flags.DEFINE_string("output_dir", None, "Checkpoints, logs and results go here; rerun to resume.")
flags.DEFINE_string("init_checkpoint", None, "Google bert_model.ckpt, Hugging Face or keras-hub directory, "
                    "or a bert_mgpu output directory (default for eval/predict: --output_dir).")
flags.DEFINE_bool("do_lower_case", None, "Lower-case and strip accents (default: what the checkpoint says, "
                  "else true, as google-bert).")
flags.DEFINE_integer("max_seq_length", 128, "Longer inputs are truncated (batches are padded only to "
                     "their longest example).")
flags.DEFINE_bool("do_train", False, "Fine-tune.")
flags.DEFINE_bool("do_eval", False, "Evaluate on dev; writes eval_results.txt.")
flags.DEFINE_bool("do_predict", False, "Predict test; writes test_results.tsv, predict.txt, predictions.tsv.")
flags.DEFINE_integer("train_batch_size", 32, "Per tower; the global batch is this x towers x "
                     "--gradient_accumulation_steps.")
flags.DEFINE_integer("gradient_accumulation_steps", 1, "Batches each tower runs per step, their gradients "
                     "averaged: a larger global batch in the same memory.")
flags.DEFINE_integer("eval_batch_size", 8, "Per tower.")
flags.DEFINE_integer("predict_batch_size", 8, "Per tower.")
for _kind in ("train", "eval", "predict"):  # the same flags, named for what they are
    flags.DEFINE_alias(f"per_tower_{_kind}_batch_size", f"{_kind}_batch_size")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate of AdamW.")
flags.DEFINE_float("num_train_epochs", 3.0, "Epochs; steps = examples / global batch x epochs.")
flags.DEFINE_float("warmup_proportion", 0.1, "Share of the steps with linear warmup.")
flags.DEFINE_integer("num_warmup_steps", None, "Warmup steps as given (wins over --warmup_proportion).")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every this many steps.")
flags.DEFINE_integer("iterations_per_loop", 1000, "Accepted for google-bert compatibility; unused.")
flags.DEFINE_bool("use_tpu", False, "Accepted for compatibility; must be false.")
# bert_mgpu's flags
define_tower_flags()
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
flags.DEFINE_integer("seed", 12345, "Random seed (initialization, shuffling, dropout).")
# evaluation while training (Hugging Face's names)
flags.DEFINE_enum("evaluation_strategy", "no", ["no", "steps", "epoch"], "Evaluate on dev while training: "
                  "every --eval_every_steps (steps) or every epoch; writes eval_history.tsv and best/.")
flags.DEFINE_integer("eval_every_steps", None, "Evaluate on dev every this many steps (implies "
                     "--evaluation_strategy=steps).")
flags.DEFINE_string("metric_for_best_model", None, "What picks the model kept in best/: accuracy, loss, f1 "
                    "(MRPC), mcc (CoLA); default the task's (f1 for MRPC, mcc for CoLA, else accuracy).")
flags.DEFINE_bool("greater_is_better", None, "Whether a larger --metric_for_best_model is better (default: "
                  "true but for a loss).")
flags.DEFINE_bool("load_best_model_at_end", False, "Evaluate and predict with best/ rather than the last step.")
flags.DEFINE_integer("early_stopping_patience", None, "Stop after this many evaluations without improvement.")
flags.DEFINE_float("early_stopping_threshold", 0.0, "An improvement must exceed this to count.")
flags.DEFINE_alias("eval_strategy", "evaluation_strategy")  # Hugging Face's newer names for the two
flags.DEFINE_alias("eval_steps", "eval_every_steps")
# reliability (shared with the other script)
define_reliability_flags("Train with the largest per-tower batch that fits")
define_export_flags()
flags.DEFINE_enum("invalid_utf8", "error", ["error", "replace"], "Invalid UTF-8 in the data: stop naming the "
                  "line, or replace it by U+FFFD and count the lines.")


def run():
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.core import storage
    from bert_mgpu.io import outputs
    from bert_mgpu.parallel import precision

    started = time.monotonic()
    cli.check_numbers(
        at_least={"max_seq_length": 3, "train_batch_size": 1, "eval_batch_size": 1, "predict_batch_size": 1,
                  "gradient_accumulation_steps": 1, "save_checkpoints_steps": 1, "log_every_steps": 1,
                  "num_warmup_steps": 0, "eval_every_steps": 1, "early_stopping_patience": 1,
                  "max_consecutive_skips": 0, "seed": 0, "save_total_limit": 1},
        positive=("num_train_epochs", "learning_rate"), fraction=("warmup_proportion", "threshold"))
    begun = cli.prelude(("do_train", "do_eval", "do_predict"), ("task_name", "data_dir", "output_dir"),
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
    watch = FLAGS.do_train and (FLAGS.evaluation_strategy != "no" or FLAGS.eval_every_steps)
    dev = task.get_examples(FLAGS.data_dir, "dev") if FLAGS.do_eval or watch else None
    test = task.get_examples(FLAGS.data_dir, "test") if FLAGS.do_predict else None

    init = FLAGS.init_checkpoint or (None if FLAGS.do_train else FLAGS.output_dir)
    clf = bert_mgpu.BertClassifier.from_pretrained(
        init, labels=labels, towers=towers, precision=FLAGS.precision, max_seq_length=FLAGS.max_seq_length,
        do_lower_case=FLAGS.do_lower_case, bert_config_file=FLAGS.bert_config_file, vocab_file=FLAGS.vocab_file,
        task=task.name, fused_encoder=FLAGS.fused_encoder,
        # Evaluating or predicting with a run directory, unless told: the task type it was trained for.
        task_type=FLAGS.task_type or (None if task.task_type == "classification" and not FLAGS.do_train
                                      else task.task_type))
    clf.metrics = FLAGS.metrics or []
    for name in ("label_separator", "threshold"):  # given ones win over what a run directory recorded
        if FLAGS[name].present:
            setattr(clf, name, getattr(FLAGS, name))
    if FLAGS.do_train:
        if FLAGS.auto_batch_size:
            clf.auto_batch_size(memory_limit_mb=FLAGS.memory_limit_mb, output_dir=FLAGS.output_dir,
                                memory_per_tower_mb=FLAGS.gpu_memory_per_tower_mb, use_xla=FLAGS.use_xla)
        settings = {name: getattr(FLAGS, name) for name in (
            "task_name", "data_dir", "init_checkpoint", "do_lower_case", "auto_batch_size", "deterministic")}
        clf.fit(train, FLAGS.output_dir, cli.train_config(), dev=dev, settings=settings)
        if clf.interrupted:
            print(f"interrupted by {clf.interrupted} at step {clf.global_step}; checkpoint saved in "
                  f"{FLAGS.output_dir}. Rerun the same command to resume")
            return
    results = {}
    if FLAGS.do_eval:
        results = clf.evaluate(dev, batch_size=FLAGS.eval_batch_size)
        for key in sorted(results):
            logging.info("  %s = %s", key, results[key])
        if towers.is_chief:
            path = outputs.write_eval_results(FLAGS.output_dir, results, clf.report)
            main = clf.main_metric
            print(f"eval: {main[len('eval_'):]} {results[main]:.4f} on {len(dev)} examples -> {path}")
    if FLAGS.do_predict:
        predicted = clf.predict(test, batch_size=FLAGS.predict_batch_size)
        if towers.is_chief:
            guids = [e.guid for e in test]
            files = clf.objective.prediction_files(predicted, clf.labels, guids, clf.threshold, FLAGS.predict_format)
            paths = storage.write_set(FLAGS.output_dir, files)
            print(f"predict: {len(test)} examples -> {', '.join(paths)}")
    if towers.is_chief:
        cli.run_exports(clf, exports, [e.text_a for e in (dev or test or [])[:64]])
        if FLAGS.do_eval and clf.confusion is not None:
            outputs.draw("write_confusion", FLAGS.output_dir, clf.confusion, clf.labels)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        rates = [r["examples_per_second"] for r in clf.history if "examples_per_second" in r]
        print(cli.summary("run_classifier_mgpu.py", towers, clf, {
            "task": task.name,
            "trained": f"{clf.trained_steps} steps ({clf.stop})" if FLAGS.do_train and clf.stop else None,
            "best model": f"step {clf.best_step}" if clf.best_step is not None else None,
            "examples/s": rates[-1] if rates else None,
            **{k: v for k, v in sorted(results.items()) if k.startswith("eval_")}}, started))


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
