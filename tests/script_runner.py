"""Scripts run as their own process without paying TensorFlow's import each time: a fork server.

Each test worker keeps one Python process that has imported TensorFlow, Keras and keras-hub (no TensorFlow
op run, so no runtime or device is set up yet). A script run is a fork of it: a process of its own with the
script's argv, environment, working directory, stdout and stderr (file descriptors 1 and 2, C++ output
included) and exit status, whose `__main__` is the script. What it saves is the import, ~6 s a run on
these machines, over a hundred runs in the suite (benchmarks/NOTES.md).

`run` waits for its run as subprocess.run does; `start` returns at once with a Popen-like handle (pid,
poll, wait, send_signal, kill), so several runs go side by side: the workers of a multi-worker test, a run
a test kills. The server never touches gRPC or a device before it forks, so each child sets up its own.

What the fork cannot give is what an interpreter or TensorFlow reads once as it starts: a run whose
environment changes a TF_*, PYTHON*, LD_*, MALLOC*, OMP_* or KMP_* variable against the server's starts a
fresh interpreter instead. So do runs that need what only subprocess gives (a preexec_fn, pipes).
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

FRESH_PREFIXES = ("TF_", "PYTHON", "LD_", "MALLOC", "OMP_", "KMP_")

SERVER = r"""
import atexit, json, os, runpy, select, signal, sys, tempfile, traceback
import tensorflow, keras, keras_hub  # noqa: F401  the import every run would pay

answers = int(sys.argv[1])


def say(message):
    os.write(answers, (json.dumps(message) + "\n").encode())


def child(job):
    os.setsid()  # its own process group: a kill reaches what it starts too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.close(answers)
    os.environ.clear()
    os.environ.update(job["env"])
    tempfile.tempdir = None  # read TMPDIR again
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


running, pending, open_ = set(), b"", True
while open_ or running:
    ready, _, _ = select.select([0] if open_ else [], [], [], 0.05 if running else None)
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            break
        running.discard(pid)
        say({"pid": pid, "status": os.waitstatus_to_exitcode(status)})
    if ready:
        chunk = os.read(0, 1 << 16)
        open_ = bool(chunk)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = os.fork()
            if pid == 0:
                child(json.loads(line))
            running.add(pid)
            say({"started": pid})
"""


class ForkServer:
    """The per-worker server; `start` forks one script run from it."""

    def __init__(self, env):
        self.env = dict(env)
        read, write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(write)], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
                                     pass_fds=(write,))
        os.close(write)
        self.answers, self.pending, self.ended = read, b"", {}

    def fits(self, env):
        """Whether a fork can stand for a fresh interpreter in `env`."""
        keys = (set(env) | set(self.env)) - {"PYTHONPATH"}  # the run's own PYTHONPATH is put on its sys.path
        return self.proc.poll() is None and not any(
            k.startswith(FRESH_PREFIXES) and env.get(k) != self.env.get(k) for k in keys)

    def _message(self, timeout):
        """The server's next message, or None after `timeout` s (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.answers], [], [], left)[0]:
                return None
            chunk = os.read(self.answers, 1 << 16)
            if not chunk:
                raise RuntimeError("the script fork server died")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def start(self, argv, env, out, err):
        """Fork a run of `python *argv` writing its stdout and stderr to the files `out` and `err` -> Forked."""
        self.proc.stdin.write((json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "out": out,
                                           "err": err}) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            message = self._message(60)
            if message is None:
                raise RuntimeError("the script fork server did not start the run")
            if "started" in message:
                # Linux reuses pids (pid_max is 32768 here, and TensorFlow's threads take pids too): an
                # earlier run's exit under this pid is not this run's. Its end always came before this start.
                self.ended.pop(message["started"], None)
                return Forked(self, message["started"], [sys.executable, *argv])
            self.ended[message["pid"]] = message["status"]

    def status(self, pid, timeout):
        """The exit status of run `pid` (as Popen.returncode), or None while it runs after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.ended:
            message = self._message(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if message is None:
                return None
            self.ended[message["pid"]] = message["status"]
        return self.ended[pid]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


class Forked:
    """A forked run, used as a subprocess.Popen: pid, returncode, poll, wait, send_signal, terminate, kill."""

    def __init__(self, server, pid, args):
        self.server, self.pid, self.args, self.returncode = server, pid, args, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.status(self.pid, 0)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = self.server.status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        if self.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)


_server = None


def start(argv, env, out, err, fresh=False):
    """`python *argv` in `env` with stdout and stderr written to the files `out` and `err`, not waited for:
    a fork of this worker's server where that stands for a fresh interpreter (unless `fresh`), else a
    fresh one -> a Popen-like handle."""
    global _server
    if _server is None and not fresh:
        _server = ForkServer({**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    if not fresh and _server.fits(env):
        return _server.start(argv, env, out, err)
    with open(out, "w") as o, open(err, "w") as e:
        return subprocess.Popen([sys.executable, *argv], stdout=o, stderr=e, env=env)


def run(argv, env, timeout, fresh=False):
    """`python *argv` in `env`, waited for -> a CompletedProcess as subprocess.run(capture_output=True,
    text=True) gives it, or TimeoutExpired (the run killed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        proc = start(argv, env, out, err, fresh)
        read = lambda path: open(path, encoding="utf-8", errors="replace").read()  # noqa: E731
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, read(out), read(err)) from None
        return subprocess.CompletedProcess([sys.executable, *argv], proc.returncode, read(out), read(err))
