"""--seeds and --grid: a run per configuration and seed, each its own resumable run directory, then
sweep_results.md/.tsv; a sweep killed in its second run and rerun ends with the uninterrupted sweep's table."""

import json
import os
import signal
import statistics
import time

import pytest
from absl import flags
from conftest import run_script, start_python
from test_crash_resume import classifier_run, latest_step

from bert_mgpu.cli import sweep
from bert_mgpu.core.errors import UserError

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def flag_values(argv):
    fv = flags.FlagValues()
    flags.DEFINE_float("learning_rate", 5e-5, "", flag_values=fv)
    flags.DEFINE_integer("train_batch_size", 32, "", flag_values=fv)
    flags.DEFINE_float("num_train_epochs", 3.0, "", flag_values=fv)
    flags.DEFINE_integer("eval_every_steps", None, "", flag_values=fv)
    flags.DEFINE_alias("eval_steps", "eval_every_steps", flag_values=fv)
    flags.DEFINE_bool("do_eval", False, "", flag_values=fv)
    flags.DEFINE_string("output_dir", None, "", flag_values=fv)
    flags.DEFINE_integer("seed", 12345, "", flag_values=fv)
    flags.DEFINE_list("seeds", None, "", flag_values=fv)
    flags.DEFINE_string("grid", None, "", flag_values=fv)
    flags.DEFINE_bool("sweep_member", False, "", flag_values=fv)
    fv(["script", *argv])
    return fv


def test_the_grid_is_every_combination_in_order_and_each_run_gets_the_commands_own_flags():
    fv = flag_values(["--learning_rate=1e-4", "--do_eval", "--eval_steps=50", "--output_dir=o", "--seeds=1,2",
                      "--grid=learning_rate=2e-5,3e-5 num_train_epochs=2,3"])
    configs = sweep.parse_grid(fv.grid, fv)
    assert [sweep.label(c) for c in configs] == [
        "learning_rate=2e-5,num_train_epochs=2", "learning_rate=2e-5,num_train_epochs=3",
        "learning_rate=3e-5,num_train_epochs=2", "learning_rate=3e-5,num_train_epochs=3"]
    planned = sweep.runs("o", configs, sweep.parse_seeds(fv.seeds))
    assert [(d, s) for _, s, d in planned[:2]] == [("o/learning_rate=2e-5,num_train_epochs=2/seed_1", 1),
                                                   ("o/learning_rate=2e-5,num_train_epochs=2/seed_2", 2)]
    config, seed, directory = planned[-1]
    argv = sweep.child_argv(config, seed, directory, fv)
    assert argv == ["--do_eval", "--eval_every_steps=50", f"--output_dir={directory}", "--sweep_member",
                    "--seed=2", "--learning_rate=3e-5", "--num_train_epochs=3"]
    assert [d for _, _, d in sweep.runs("o", [{}], [])] == ["o"]  # no sweep: the run directory itself


@pytest.mark.parametrize("grid, seeds, message", [
    ("learning_rate", None, "--grid: 'learning_rate' is not name=value1,value2,..."),
    ("warmup=0.1", None, "--grid: 'warmup' is not a flag this script varies"),
    ("seed=1,2", None, "--grid: 'seed' is not a flag this script varies (use --seeds)"),
    ("train_batch_size=16,x", None, "--grid: train_batch_size=x:"),
    ("eval_steps=1 eval_every_steps=2", None, "--grid: eval_every_steps is given twice"),
    (None, ["1", "one"], "--seeds: 'one' is not a seed"),
    (None, ["1", "1"], "--seeds: 1,1 names a seed twice"),
])
def test_a_bad_grid_or_seed_list_is_one_line(grid, seeds, message):
    fv = flag_values([])
    import re

    with pytest.raises(UserError, match="^" + re.escape(message)):
        sweep.parse_grid(grid, fv) if grid else sweep.parse_seeds(seeds)


def test_the_table_has_mean_sd_median_and_maximum_per_configuration_and_names_the_best():
    def member(accuracy, loss):
        return {"measures": {"eval_accuracy": accuracy, "eval_loss": loss}, "main": ["eval_accuracy"]}

    rows = [({"learning_rate": "2e-5"}, 1, member(0.80, 0.5)), ({"learning_rate": "2e-5"}, 2, member(0.84, 0.4)),
            ({"learning_rate": "2e-5"}, 3, member(0.83, 0.45)), ({"learning_rate": "5e-5"}, 1, member(0.86, 0.3)),
            ({"learning_rate": "5e-5"}, 2, member(0.78, 0.6))]
    md, tsv = sweep.tables(rows)
    lines = [line.split("\t") for line in tsv.splitlines()]
    assert lines[0][:7] == ["configuration", "measure", "runs", "mean", "sd", "median", "max"]
    accuracy = {r[0]: [float(x) for x in r[3:7]] for r in lines[1:] if r[1] == "eval_accuracy"}
    a = [0.80, 0.84, 0.83]
    assert accuracy["learning_rate=2e-5"] == pytest.approx([statistics.fmean(a), statistics.stdev(a), 0.83, 0.84])
    assert accuracy["learning_rate=5e-5"] == pytest.approx([0.82, statistics.stdev([0.86, 0.78]), 0.82, 0.86])
    assert "best configuration by mean eval_accuracy: learning_rate=2e-5 (0.8233)" in md
    assert "| learning_rate=5e-5 | eval_accuracy | 2 | 0.8200 |" in md


@pytest.mark.process
def test_a_sweep_killed_in_its_second_run_and_rerun_ends_with_the_same_table(tmp_path, google_release):
    import psutil

    one_run = classifier_run(tmp_path, google_release, 160)
    args = lambda out: [*one_run(out), "--seeds=3,4"]  # noqa: E731

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    proc = run_script("run_classifier_mgpu.py", *args(whole))
    assert "sweep: 2 runs ->" in proc.stdout
    for seed in (3, 4):
        run = json.loads((whole / f"seed_{seed}" / "bert_mgpu.json").read_text())
        assert run["train_config"]["seed"] == seed and run["global_step"] == 20, run
    member = json.loads((whole / "seed_4" / "sweep_run.json").read_text())
    results = dict(line.split(" = ") for line in (whole / "seed_4" / "eval_results.txt").read_text().splitlines())
    assert member["main"] == ["eval_accuracy"]
    assert member["measures"]["eval_accuracy"] == float(results["eval_accuracy"])

    logs = tmp_path / "logs"
    logs.mkdir()
    driver = start_python([os.path.join(os.path.dirname(__file__), "..", "run_classifier_mgpu.py"), *args(parts)],
                          f"{logs}/out", f"{logs}/err")
    deadline = time.time() + 300
    while latest_step(str(parts / "seed_4")) <= 5 and driver.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    for process in [*psutil.Process(driver.pid).children(recursive=True), psutil.Process(driver.pid)]:
        process.send_signal(signal.SIGKILL)
    driver.wait(timeout=60)
    assert (parts / "seed_3" / "sweep_run.json").exists() and not (parts / "seed_4" / "sweep_run.json").exists()
    assert 5 < latest_step(str(parts / "seed_4")) < 20 and not (parts / "sweep_results.tsv").exists()

    proc = run_script("run_classifier_mgpu.py", *args(parts))
    assert "run 1 of 2: default, seed 3: done before" in proc.stderr, proc.stderr[-3000:]
    assert (parts / "sweep_results.tsv").read_text() == (whole / "sweep_results.tsv").read_text()
    assert (parts / "sweep_results.md").read_text() == (whole / "sweep_results.md").read_text()
    table = (whole / "sweep_results.tsv").read_text().splitlines()
    assert table[1].startswith("default\teval_accuracy\t2\t") and table[-1].startswith("# best by mean eval_accuracy")


def test_a_glue_sweep_ranks_each_task_and_the_average_by_the_numbers_of_the_glue_table():
    from bert_mgpu.api import glue

    results = {"mrpc": {"eval_f1": 0.9, "eval_accuracy": 0.86}, "mnli": {"eval_accuracy": 0.84},
               "mnli-mm": {"eval_accuracy": 0.82}, "cola": {"eval_mcc": 0.5}}
    scores = glue.task_scores(results)
    assert scores == pytest.approx({"CoLA": 50.0, "MRPC": 88.0, "MNLI-m": 83.0, "Average": (50 + 88 + 83) / 3})
    assert glue.table(results).splitlines()[-1].endswith(f"| {scores['Average']:.1f} |")


@pytest.mark.process
def test_sigterm_to_a_sweep_stops_its_run_as_one_run_stops_and_kill_9_takes_the_run_with_it(tmp_path,
                                                                                           google_release):
    """SIGTERM to the sweep reaches its running seed, which saves and exits 143: the sweep then ends with one line
    and exit 143, as a single run does (it once left the run going under PID 1). kill -9 of the sweep
    takes its run with it (a parent-death signal), so nothing holds the directory a rerun needs."""
    import psutil

    one_run = classifier_run(tmp_path, google_release, 4000)
    argv = [os.path.join(os.path.dirname(__file__), "..", "run_classifier_mgpu.py"),
            *one_run(tmp_path / "sweep"), "--seeds=3,4"]
    seed_3 = str(tmp_path / "sweep" / "seed_3")

    def start_and_wait_past(step, name):
        driver = start_python(argv, tmp_path / f"{name}.out", tmp_path / f"{name}.err")
        deadline = time.time() + 300
        while latest_step(seed_3) <= step and driver.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        assert driver.poll() is None, (tmp_path / f"{name}.err").read_text()[-2000:]
        return driver, psutil.Process(driver.pid).children(recursive=True)

    driver, runs = start_and_wait_past(5, "first")
    assert runs  # the seed's run, a process of its own
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 143, (tmp_path / "first.err").read_text()[-3000:]
    gone, alive = psutil.wait_procs(runs, timeout=30)
    assert not alive
    shown = (tmp_path / "first.out").read_text()
    step = latest_step(seed_3)
    assert f"interrupted by SIGTERM at step {step}" in shown, shown  # the run's own line: it saved there
    assert (f"sweep: run 1 of 2: default, seed 3 interrupted by SIGTERM; its checkpoint is in {seed_3}: rerun the "
            "same command to resume the sweep") in shown
    assert not (tmp_path / "sweep" / "seed_3" / "sweep_run.json").exists()

    driver, runs = start_and_wait_past(step, "second")  # resumed from that checkpoint
    driver.kill()
    driver.wait(timeout=60)
    gone, alive = psutil.wait_procs(runs, timeout=30)
    assert not alive, [p.pid for p in alive]
