"""Write the golden run directories (issue 34's safety net), with the code of the commit that made them.

    python tests/golden/make_golden.py      # from the repository root; rewrites tests/golden/{classifier,pretraining}

Each is a tiny real run, in float32 with --deterministic on one tower, made with paths relative to its own
directory (a run records its flags, and a rerun must give the same ones). It keeps the checkpoints of steps 4
and 8 and its result files; `expected.json` holds what the run printed. tests/test_golden.py checks that
today's code evaluates, predicts, exports and resumes from them with the same numbers. Rewrite them only
on purpose: they are what "old run directories still load" means.
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))

CLASSIFIER = ["--task_name=tsv", "--data_dir=data", "--init_checkpoint=release", "--output_dir=out", "--n_gpus=0",
              "--train_batch_size=8", "--max_seq_length=16", "--precision=float32", "--num_train_epochs=2",
              "--save_checkpoints_steps=4", "--learning_rate=1e-3", "--deterministic", "--seed=7",
              "--save_total_limit=2"]
PRETRAINING = ["--input_file=data/pretrain.tfrecord-*", "--bert_config_file=release/bert_config.json",
               "--vocab_file=release/vocab.txt", "--output_dir=out", "--n_gpus=0", "--train_batch_size=8",
               "--max_seq_length=32", "--max_predictions_per_seq=5", "--num_train_steps=8",
               "--save_checkpoints_steps=4", "--learning_rate=1e-3", "--precision=float32", "--deterministic",
               "--seed=7", "--save_total_limit=2", "--log_every_steps=4"]


def run(directory, script, *args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=directory, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{script} failed:\n{proc.stderr[-3000:]}")
    return proc


def results(path):
    return {k: float(v) for k, v in (line.split(" = ") for line in open(path).read().splitlines())}


def trim(out):
    """What a user's run directory holds, less what the tests do not read (events, pictures)."""
    for name in os.listdir(out):
        if name in ("train", "eval") or name.endswith(".png"):
            shutil.rmtree(os.path.join(out, name)) if os.path.isdir(os.path.join(out, name)) else \
                os.remove(os.path.join(out, name))


def classifier():
    from conftest import sentiment_rows, write_google_release, write_tsv

    d = os.path.join(HERE, "classifier")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "data"))
    write_google_release(os.path.join(d, "release"))
    write_tsv(os.path.join(d, "data", "train.tsv"), sentiment_rows(32, seed=1))
    write_tsv(os.path.join(d, "data", "dev.tsv"), sentiment_rows(16, seed=2))
    write_tsv(os.path.join(d, "data", "test.tsv"), [("", t) for _, t in sentiment_rows(8, seed=3)], ("label", "text"))
    run(d, "run_classifier_mgpu.py", *CLASSIFIER, "--do_train", "--do_eval", "--do_predict")
    trim(os.path.join(d, "out"))
    expected = {"flags": CLASSIFIER, "eval": results(os.path.join(d, "out", "eval_results.txt"))}
    json.dump(expected, open(os.path.join(d, "expected.json"), "w"), indent=1, sort_keys=True)


def pretraining():
    from conftest import tiny_config, write_vocab
    from test_pretraining_records import write_corpus

    d = os.path.join(HERE, "pretraining")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "data"))
    os.makedirs(os.path.join(d, "release"))
    tokens = write_vocab(os.path.join(d, "release", "vocab.txt"))
    tiny_config(len(tokens)).to_json_file(os.path.join(d, "release", "bert_config.json"))
    write_corpus(os.path.join(d, "data", "corpus.txt"))
    run(d, "create_pretraining_data.py", "--input_file=data/corpus.txt", "--output_file=data/pretrain.tfrecord",
        "--vocab_file=release/vocab.txt", "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=2",
        "--num_output_shards=2", "--random_seed=7")
    os.remove(os.path.join(d, "data", "corpus.txt"))
    run(d, "run_pretraining_mgpu.py", *PRETRAINING, "--do_train", "--do_eval", "--max_eval_steps=4")
    trim(os.path.join(d, "out"))
    expected = {"flags": PRETRAINING, "eval": results(os.path.join(d, "out", "eval_results.txt"))}
    json.dump(expected, open(os.path.join(d, "expected.json"), "w"), indent=1, sort_keys=True)


if __name__ == "__main__":
    classifier()
    pretraining()
