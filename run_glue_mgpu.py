"""The GLUE suite on every GPU: each task fine-tuned with its usual recipe, then the GLUE table.

    python run_glue_mgpu.py --glue_dir=glue_data --init_checkpoint=uncased_L-12_H-768_A-12 --output_dir=glue \
        --tasks=all --n_gpus=4

`--glue_dir` holds GLUE's download (CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/, RTE/, WNLI/,
diagnostic/). Writes OUTPUT_DIR/<task>/ (a run directory each; rerun to resume), glue_results.md and
glue_results.tsv, and with --do_predict the leaderboard files in OUTPUT_DIR/submission/. With --seeds and
--grid, the suite runs once per configuration and seed (bert_mgpu.cli.sweep) and sweep_results.md names the
best configuration of each task. A thin wrapper over `bert_mgpu.api.glue.run`.
"""

import logging
import time

from absl import app, flags

from bert_mgpu.cli import define_tower_flags, sweep

FLAGS = flags.FLAGS
flags.DEFINE_string("glue_dir", None, "GLUE's data, one folder per task as its download lays them out.")
flags.DEFINE_list("tasks", ["all"], "Tasks to run (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli), or all. "
                  "MNLI is evaluated matched and mismatched and predicts AX.")
flags.DEFINE_string("init_checkpoint", None, "The model to fine-tune (any format run_classifier_mgpu.py reads).")
flags.DEFINE_string("output_dir", None, "A run directory per task, the GLUE table and the leaderboard files.")
flags.DEFINE_bool("do_predict", True, "Write the leaderboard files (OUTPUT_DIR/submission/<TASK>.tsv).")
flags.DEFINE_integer("max_seq_length", 128, "Longer inputs are truncated (--truncation).")
flags.DEFINE_enum("truncation", "head", ["head", "tail", "head+tail"], "Which pieces of a longer text stay: its "
                  "start (google-bert's), its end, or its first quarter and the rest from its end.")
flags.DEFINE_float("learning_rate", None, "Replaces every task's recipe (default: 2e-5).")
flags.DEFINE_float("num_train_epochs", None, "Replaces every task's recipe (default: 3; 5 for MRPC, STS-B, RTE, "
                   "WNLI).")
flags.DEFINE_integer("train_batch_size", None, "Per tower; replaces every task's recipe (default: 32).")
flags.DEFINE_integer("eval_batch_size", 32, "Per tower.")
flags.DEFINE_integer("seed", 12345, "Random seed.")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every this many steps.")
define_tower_flags()
sweep.define_sweep_flags()


def run():
    import bert_mgpu
    from bert_mgpu import cli
    from bert_mgpu.api import glue

    started = time.monotonic()
    cli.check_numbers(at_least={"max_seq_length": 3, "train_batch_size": 1, "eval_batch_size": 1,
                                "save_checkpoints_steps": 1, "log_every_steps": 1},
                      positive=("learning_rate", "num_train_epochs"))
    if sweep.requested():  # the suite once per configuration and seed; per task, which is best
        return sweep.run_sweep(__file__)
    for name in ("glue_dir", "init_checkpoint", "output_dir"):
        if not getattr(FLAGS, name):
            raise bert_mgpu.UserError(f"--{name} is required")
    import keras

    keras.utils.set_random_seed(FLAGS.seed)
    towers = cli.towers_from_flags(*cli.plan_from_flags(), FLAGS.train_batch_size or 32)
    logging.info("%s", towers.plan.describe())
    tasks = None if FLAGS.tasks == ["all"] else FLAGS.tasks
    results = glue.run(FLAGS.glue_dir, FLAGS.init_checkpoint, FLAGS.output_dir, tasks, towers,
                       do_predict=FLAGS.do_predict, precision=FLAGS.precision, max_seq_length=FLAGS.max_seq_length,
                       epochs=FLAGS.num_train_epochs, learning_rate=FLAGS.learning_rate,
                       batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size, seed=FLAGS.seed,
                       save_checkpoints_steps=FLAGS.save_checkpoints_steps, use_xla=FLAGS.use_xla,
                       truncation=FLAGS.truncation, recompute=FLAGS.recompute,
                       log_every=FLAGS.log_every_steps, report_to=tuple(FLAGS.report_to), verbose=False)
    if towers.is_chief:
        if FLAGS.sweep_member:
            scores = glue.task_scores(results)
            sweep.write_member(FLAGS.output_dir, scores, list(scores))
        print(glue.table(results))
        print(f"GLUE: {len(results)} results in {FLAGS.output_dir}/glue_results.md and glue_results.tsv"
              + (f", leaderboard files in {FLAGS.output_dir}/submission/" if FLAGS.do_predict else "")
              + f" ({time.monotonic() - started:.0f} s)")


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
