"""A tower that fails inside a step (out of memory first of all) ends the run on every tower at once, in one
line, with the last good checkpoint intact: TensorFlow's collectives, which the towers reduce with on GPUs
and CPUs alike, abort when a peer fails, where the legacy NCCL reduction waited for it forever."""

import os
import re
import time

import pytest
import tensorflow as tf
from conftest import run_python, sentiment_rows, write_tsv

# The classifier script, with tower 1 asking for 4 TiB from step 7 on: a real ResourceExhaustedError
# from TensorFlow's allocator, raised before that tower joins the step's collectives.
FAILING_TOWER = """
import sys
import run_classifier_mgpu
from bert_mgpu.cli import checks_gpu

checks_gpu.run_out_of_memory(tower=1, from_step=7)
sys.argv = ["run_classifier_mgpu.py", *sys.argv[1:]]
run_classifier_mgpu._console()
"""


@pytest.mark.process
def test_out_of_memory_on_one_tower_ends_every_tower_in_one_line_and_keeps_the_last_checkpoint(tmp_path,
                                                                                             google_release):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    write_tsv(data / "train.tsv", sentiment_rows(160, seed=1))
    args = ["--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={google_release}", f"--output_dir={out}",
            "--do_train", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=4", "--max_seq_length=16",
            "--precision=float32", "--num_train_epochs=1", "--save_checkpoints_steps=5", "--log_every_steps=1",
            "--collective_timeout_seconds=240"]
    start = time.monotonic()
    proc = run_python(FAILING_TOWER.replace("sys.argv[1:]", repr(args)), check=False)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert took < 240, took  # ended by the failure, not by the collective timeout
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"run_classifier_mgpu\.py: error: out of memory on tower 1 at per-tower batch 4 x "
                        r"sequence length \d+; try --train_batch_size=2 per tower .*", last), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-5")
    reader = tf.train.load_checkpoint(os.path.join(out, "ckpt-5"))
    assert len(reader.get_variable_to_shape_map()) > 20
