"""Scripts run as their own process without paying TensorFlow's import each time: a fork server.

Each test worker keeps one Python process that has imported TensorFlow, Keras and keras-hub (no TensorFlow
op run, so no runtime or device is set up yet). A script run is a fork of it: a process of its own with the
script's argv, environment, working directory, stdout and stderr (file descriptors 1 and 2, C++ output
included) and exit status, whose `__main__` is the script. What it saves is the import, ~6 s a run on
these machines, over a hundred runs in the suite (benchmarks/NOTES.md).

What the fork cannot give is what an interpreter or TensorFlow reads once as it starts: a run whose
environment changes a TF_*, PYTHON*, LD_*, MALLOC*, OMP_* or KMP_* variable against the server's starts a
fresh interpreter instead (`run` decides). Tests of the process itself (signals, kill -9, several workers,
memory limits) start theirs with subprocess as before.
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

FRESH_PREFIXES = ("TF_", "PYTHON", "LD_", "MALLOC", "OMP_", "KMP_")

SERVER = r"""
import atexit, json, os, runpy, signal, sys, traceback
import tensorflow, keras, keras_hub  # noqa: F401  the import every run would pay

answers = os.fdopen(int(sys.argv[1]), "w", buffering=1)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the run: a process of its own
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        answers.close()
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, job["out"]), (2, job["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        argv = job["argv"]
        code = 0
        try:
            if argv[0] == "-c":
                sys.argv, sys.path = ["-c", *argv[2:]], ["", *extra, *sys.path[1:]]
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv, sys.path = list(argv), [os.path.dirname(os.path.abspath(argv[0])), *extra, *sys.path[1:]]
                runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 130
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code & 0xFF)
    answers.write(json.dumps({"pid": pid}) + "\n")
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
"""


class ForkServer:
    """The per-worker server; `run` forks one script run from it."""

    def __init__(self, env):
        self.env = dict(env)
        read, write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(write)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
                                     pass_fds=(write,), text=True)
        os.close(write)
        self.answers = os.fdopen(read, "r")

    def fits(self, env):
        """Whether a fork can stand for a fresh interpreter in `env`."""
        keys = (set(env) | set(self.env)) - {"PYTHONPATH"}  # the run's own PYTHONPATH is put on its sys.path
        return self.proc.poll() is None and not any(
            k.startswith(FRESH_PREFIXES) and env.get(k) != self.env.get(k) for k in keys)

    def _answer(self, timeout):
        ready, _, _ = select.select([self.answers], [], [], timeout)
        if not ready:
            return None
        line = self.answers.readline()
        if not line:
            raise RuntimeError("the script fork server died")
        return json.loads(line)

    def run(self, argv, env, timeout):
        """A CompletedProcess as subprocess.run(capture_output=True, text=True) gives it, or TimeoutExpired
        (the run killed)."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "out": out,
                                              "err": err}) + "\n")
            self.proc.stdin.flush()
            pid = self._answer(60)["pid"]
            answer = self._answer(timeout)
            if answer is None:
                os.killpg(pid, signal.SIGKILL)
                self._answer(60)
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, open(out).read(), open(err).read())
            return subprocess.CompletedProcess([sys.executable, *argv], answer["status"],
                                               open(out, encoding="utf-8", errors="replace").read(),
                                               open(err, encoding="utf-8", errors="replace").read())

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


_server = None


def run(argv, env, timeout, fresh=False):
    """`python *argv` in `env`: a fork of this worker's server where that stands for a fresh interpreter
    (unless `fresh`), else a fresh one."""
    global _server
    if _server is None and not fresh:
        _server = ForkServer({**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    if not fresh and _server.fits(env):
        return _server.run(argv, env, timeout)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env)
