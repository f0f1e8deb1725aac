"""The CLUE suite on every GPU: each task fine-tuned with CLUE's baseline recipe (the classification tasks,
CLUENER, CMRC 2018, CHID, C3), then CLUE's table and the leaderboard's submission files. The twin of run_glue_mgpu.py.

    python run_clue_mgpu.py --clue_dir=CLUEdataset --init_checkpoint=chinese_L-12_H-768_A-12 --output_dir=clue \
        --tasks=all --n_gpus=4

`--clue_dir` holds CLUE's downloads, a folder a task (afqmc/, tnews/, iflytek/, cmnli/, ocnli/, cluewsc2020/,
csl/, cluener/, cmrc2018/, or the zips' <task>_public/), each with train.json, dev.json, test.json (and
labels.json). Writes OUTPUT_DIR/<task>/ (a run directory each; rerun to resume), clue_results.md and
clue_results.tsv, and with --do_predict the leaderboard files in OUTPUT_DIR/submission/
({task}_predict.json). With --seeds and --grid, the suite runs once per configuration and seed
(bert_mgpu.cli.sweep). A thin wrapper over `bert_mgpu.api.clue.run`.
"""

from absl import app, flags

from bert_mgpu.cli import suite

FLAGS = flags.FLAGS
flags.DEFINE_string("clue_dir", None, "CLUE's data, a folder a task as its downloads lay them out.")
suite.define_suite_flags(
    "Tasks to run (afqmc, tnews, iflytek, cmnli, ocnli, cluewsc2020, csl, cluener, cmrc2018), or all: those "
    "whose folders --clue_dir holds.",
    "A run directory per task, the CLUE table and the leaderboard files.",
    "Write the leaderboard files (OUTPUT_DIR/submission/{task}_predict.json).")
flags.DEFINE_integer("max_seq_length", None, "Replaces every task's recipe (default: 128; 256 for CSL).")
flags.DEFINE_float("learning_rate", None, "Replaces every task's recipe (default: 2e-5; 1e-5 for CSL).")
flags.DEFINE_float("num_train_epochs", None, "Replaces every task's recipe (default: 3; 50 for WSC).")
flags.DEFINE_integer("train_batch_size", None, "Per tower; replaces every task's recipe (default: 32; 8 for WSC, "
                     "4 for CSL).")


def run():
    from bert_mgpu.api import clue

    suite.run_suite(FLAGS, __file__, "clue_dir", "CLUE", clue)


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
