"""The GLUE suite on every GPU: each task fine-tuned with its usual recipe, then the GLUE table.

    python run_glue_mgpu.py --glue_dir=glue_data --init_checkpoint=uncased_L-12_H-768_A-12 --output_dir=glue \
        --tasks=all --n_gpus=4

`--glue_dir` holds GLUE's download (CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/, RTE/, WNLI/,
diagnostic/). Writes OUTPUT_DIR/<task>/ (a run directory each; rerun to resume), glue_results.md and
glue_results.tsv, and with --do_predict the leaderboard files in OUTPUT_DIR/submission/. With --seeds and
--grid, the suite runs once per configuration and seed (bert_mgpu.cli.sweep) and sweep_results.md names the
best configuration of each task. A thin wrapper over `bert_mgpu.api.glue.run`.
"""

from absl import app, flags

from bert_mgpu.cli import suite

FLAGS = flags.FLAGS
flags.DEFINE_string("glue_dir", None, "GLUE's data, one folder per task as its download lays them out.")
suite.define_suite_flags(
    "Tasks to run (cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli), or all. MNLI is evaluated matched and "
    "mismatched and predicts AX.",
    "A run directory per task, the GLUE table and the leaderboard files.",
    "Write the leaderboard files (OUTPUT_DIR/submission/<TASK>.tsv).")
flags.DEFINE_integer("max_seq_length", 128, "Longer inputs are truncated (--truncation).")
flags.DEFINE_enum("truncation", "head", ["head", "tail", "head+tail"], "Which pieces of a longer text stay: its "
                  "start (google-bert's), its end, or its first quarter and the rest from its end.")
flags.DEFINE_float("learning_rate", None, "Replaces every task's recipe (default: 2e-5).")
flags.DEFINE_float("num_train_epochs", None, "Replaces every task's recipe (default: 3; 5 for MRPC, STS-B, RTE, "
                   "WNLI).")
flags.DEFINE_integer("train_batch_size", None, "Per tower; replaces every task's recipe (default: 32).")


def run():
    from bert_mgpu.api import glue

    suite.run_suite(FLAGS, __file__, "glue_dir", "GLUE", glue, truncation=FLAGS.truncation)


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
