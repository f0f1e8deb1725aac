"""The fork server's bookkeeping of its runs (tests/script_runner.py), without forking anything."""

import io
import types

import script_runner


def test_a_reused_pid_does_not_take_an_earlier_runs_exit():
    """Linux reuses pids (pid_max 32768 on these machines): a run that gets the pid of one that ended
    earlier in the same server must not read that one's exit status as its own (a sweep test's driver
    once read as ended at once, and the test failed)."""
    server = object.__new__(script_runner.ForkServer)  # its state alone: no server process
    server.proc, server.ended = types.SimpleNamespace(stdin=io.BytesIO()), {}
    messages = [{"started": 4321}, {"pid": 4321, "status": 1}]
    server._message = lambda timeout: messages.pop(0) if messages else None
    earlier = server.start(["earlier.py"], {}, "out", "err")
    assert earlier.wait(1) == 1

    messages.append({"started": 4321})  # the same pid again, for the next run
    later = server.start(["later.py"], {}, "out", "err")
    assert later.pid == 4321 and later.poll() is None
    messages.append({"pid": 4321, "status": 0})
    assert later.wait(1) == 0 and earlier.returncode == 1


SCRIPT = '''
import os, signal, sys
from absl import app, flags
flags.DEFINE_integer("n", 1, "what to do")
FLAGS = flags.FLAGS


def run(argv):
    from tensorflow.python.framework import config

    from bert_mgpu.io import output_dir

    print(FLAGS.n, config.is_op_determinism_enabled(), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
          len(output_dir._HELD), os.getpid())
    config.enable_op_determinism()
    signal.signal(signal.SIGTERM, lambda *_: None)
    output_dir.lock_output_dir(os.path.dirname(os.path.abspath(__file__)))
    if FLAGS.n in (3, 9):
        sys.stdout.flush()
        sys.exit(3) if FLAGS.n == 3 else os.kill(os.getpid(), signal.SIGKILL)


def _console():
    app.run(run)
'''


def test_a_scripts_runs_share_a_resident_process_that_puts_back_what_each_run_leaves(tmp_path):
    """Runs of one script one after another: the same process, but each starts as a new process would
    (flags at their defaults, op determinism off, SIGTERM's default handler, no output directory locked),
    and ends with the exit status a process would: sys.exit's, or a signal's; after a signal, a new one.
    Each run knows the runs its process ran before it (a failure's report lists them)."""
    import os

    from conftest import _environment

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    run = lambda *args: script_runner.run([str(script), *args], _environment(None), 120)  # noqa: E731
    # The script has no `if __name__ == "__main__"`: a fresh interpreter would run nothing, and exit 0.
    assert script_runner._resident_key([str(script)], _environment(None)) is not None
    first, second = run("--n=5"), run()
    assert first.returncode == second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert first.stdout.split()[:4] == ["5", "False", "True", "0"]
    assert second.stdout.split()[:4] == ["1", "False", "True", "0"]
    assert first.stdout.split()[4] == second.stdout.split()[4] != str(os.getpid())  # one resident process
    failed = run("--n=3")
    assert failed.returncode == 3
    test = os.environ["PYTEST_CURRENT_TEST"]
    assert failed.earlier_runs == [[test, ["--n=5"], 0], [test, [], 0]]  # what a failure's report lists
    killed = run("--n=9")
    assert killed.returncode == -9 and killed.stdout.split()[0] == "9"
    after = run("--n=2")
    assert after.returncode == 0 and after.stdout.split()[:4] == ["2", "False", "True", "0"]
    assert after.stdout.split()[4] != first.stdout.split()[4]  # a new resident after the kill
    assert after.earlier_runs == []


def test_a_worker_whose_environment_changed_under_its_fork_server_gets_a_new_one(monkeypatch, capsys):
    """A TF_* variable an earlier test set in the worker and left: the server no longer stands for a fresh
    process of the worker's environment, so every run would start a fresh interpreter and none would reach a
    resident process. A new server is started in its place, saying why; the old one is let end."""
    import os

    old = object.__new__(script_runner.ForkServer)  # its state alone: no server process
    stdin = io.BytesIO()
    old.env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    old.proc = types.SimpleNamespace(poll=lambda: None, stdin=stdin)
    monkeypatch.setattr(script_runner, "_server", old)
    monkeypatch.setattr(script_runner, "_residents", {})
    monkeypatch.setattr(script_runner, "ForkServer", lambda env: types.SimpleNamespace(env=env))
    assert script_runner._fork_server() is old and not stdin.closed
    monkeypatch.setenv("TF_SCRIPT_RUNNER_PROBE", "1")
    new = script_runner._fork_server()
    assert new is not old and new.env["TF_SCRIPT_RUNNER_PROBE"] == "1" and stdin.closed
    assert "a new fork server (changed: TF_SCRIPT_RUNNER_PROBE)" in capsys.readouterr().err


def test_a_script_run_twice_in_one_process_trains_and_evaluates_the_same(sentiment_data, google_release, tmp_path):
    """run_classifier_mgpu.py's main twice in its resident process (the second run knows the first ran there):
    the same checkpoint, bit for bit, and the same eval results, as two processes of their own would give.
    Nothing a run leaves behind (flags, seeds, compiled kernels, the towers' strategy) changes the next."""
    from conftest import run_script
    from test_crash_resume import assert_bit_identical

    def args(out):
        return ["--task_name=tsv", f"--data_dir={sentiment_data}", f"--init_checkpoint={google_release}",
                f"--output_dir={out}", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8",
                "--max_seq_length=32", "--precision=float32", "--do_train", "--do_eval", "--num_train_epochs=1",
                "--learning_rate=1e-3", "--eval_batch_size=4"]

    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    run_script("run_classifier_mgpu.py", *args(first))
    proc = run_script("run_classifier_mgpu.py", *args(second))
    assert [argv for _, argv, _ in proc.earlier_runs][-1] == args(first), proc.earlier_runs
    assert_bit_identical(first, second, 4)  # 64 rows / (8 x 2 towers)
    results = [open(f"{out}/eval_results.txt").read() for out in (first, second)]
    assert results[0] == results[1] and "eval_accuracy = " in results[0]
