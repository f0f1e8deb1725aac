"""What a run can know before its first step, it checks then, in one line, with nothing written: a flag out of
range, a --metric_for_best_model the evaluation does not give, NaN weights in --init_checkpoint, and a
--bert_config_file or --vocab_file that is not a bert_mgpu run directory's own (issue 33, items 3 and 6)."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import run_script

from bert_mgpu.io import checkpoints


@pytest.fixture(scope="module")
def data(sentiment_data):
    return sentiment_data


def refused(data, release, out, *extra):
    proc = run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={data}",
                      f"--init_checkpoint={release}", f"--output_dir={out}", "--do_train", "--n_gpus=0",
                      "--train_batch_size=8", "--max_seq_length=16", "--precision=float32", *extra, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(out) or not [n for n in os.listdir(out) if n.startswith("ckpt")]
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, says", [
    ("--max_consecutive_skips=-1", "--max_consecutive_skips=-1: must be at least 0"),
    ("--seed=-1", "--seed=-1: must be at least 0"),
    ("--threshold=nan", "--threshold=nan: must be between 0 and 1"),
    ("--threshold=2", "--threshold=2.0: must be between 0 and 1"),
])
def test_flags_out_of_range_are_refused_before_anything_is_read(data, google_release, tmp_path, flag, says):
    assert refused(data, google_release, tmp_path / "out", flag).endswith(says)


def test_a_metric_the_evaluation_does_not_give_is_refused_before_the_first_step(data, google_release, tmp_path):
    last = refused(data, google_release, tmp_path / "out", "--eval_every_steps=2", "--metric_for_best_model=bogus")
    assert "--metric_for_best_model=bogus: the evaluation gives accuracy, loss" in last, last


def test_nan_weights_in_the_init_checkpoint_are_refused_before_training(data, google_release, tmp_path):
    weights = checkpoints.read_tf_checkpoint(os.path.join(google_release, "bert_model.ckpt"))
    name = "bert/encoder/layer_0/attention/self/query/kernel"
    weights[name] = weights[name].copy()
    weights[name][0, 0] = np.nan
    bad = tmp_path / "bad"
    bad.mkdir()
    checkpoints.write_google_checkpoint(weights, str(bad / "bert_model.ckpt"))
    for f in ("bert_config.json", "vocab.txt"):
        shutil.copy(os.path.join(google_release, f), bad / f)
    last = refused(data, bad, tmp_path / "out")
    assert f"{bad}: 1 tensor(s) hold NaN or infinity ({name}): a damaged checkpoint or a diverged run" in last


def test_a_run_directorys_own_config_and_vocabulary_are_the_only_ones_it_takes(data, google_release, tmp_path):
    first = tmp_path / "first"
    run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={google_release}",
               f"--output_dir={first}", "--do_train", "--n_gpus=0", "--train_batch_size=8", "--max_seq_length=16",
               "--precision=float32", "--num_train_epochs=1")
    other = tmp_path / "other_config.json"
    config = json.load(open(os.path.join(google_release, "bert_config.json")))
    other.write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] * 2}))
    last = refused(data, first, tmp_path / "second", f"--bert_config_file={other}")
    assert f"--bert_config_file={other} differs from the config of the bert_mgpu run {first}" in last
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(open(os.path.join(google_release, "vocab.txt")).read() + "extra\n")
    last = refused(data, first, tmp_path / "third", f"--vocab_file={vocab}")
    assert f"--vocab_file={vocab} differs from {first}/vocab.txt of the bert_mgpu run {first}" in last
    missing = refused(data, first, tmp_path / "fourth", f"--bert_config_file={tmp_path}/nope.json")
    assert "nope.json" in missing


def test_notebook_fit_refuses_unlabelled_examples_and_a_learning_rate_that_is_not_a_number(google_release, tmp_path):
    import bert_mgpu
    from bert_mgpu.core.errors import UserError

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=4)
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                   max_seq_length=16)
    with pytest.raises(UserError, match="^training example 0 has no label"):
        clf.fit(["a good film", "a dull plot"] * 8, str(tmp_path / "a"))
    labelled = [bert_mgpu.Example(str(i), "a good film", label="pos") for i in range(16)]
    with pytest.raises(UserError, match=r"^--learning_rate=nan: must be a finite number above 0"):
        clf.fit(labelled, str(tmp_path / "b"), learning_rate=float("nan"))
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


def test_without_init_checkpoint_the_classifier_trains_from_its_config_with_a_warning(data, google_release, tmp_path):
    out = tmp_path / "out"
    common = ["run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={data}", f"--output_dir={out}", "--n_gpus=0",
              "--max_seq_length=16", "--precision=float32", f"--bert_config_file={google_release}/bert_config.json",
              f"--vocab_file={google_release}/vocab.txt"]
    trained = run_script(*common, "--do_train", "--do_eval", "--train_batch_size=8", "--num_train_epochs=1")
    assert f"no --init_checkpoint: the encoder starts from random weights ({google_release}/bert_config.json)" \
        in trained.stderr
    evaluated = run_script(*common, "--do_eval")  # the run directory's own weights, not random ones
    loss = [line for line in trained.stdout.splitlines() if "eval_loss" in line]
    assert loss and loss == [line for line in evaluated.stdout.splitlines() if "eval_loss" in line]
    bare = run_script(*common[:-2], "--do_train", check=False)
    assert bare.returncode == 1 and "or --bert_config_file and --vocab_file to start from random weights" in \
        bare.stderr.strip().splitlines()[-1]
