"""Scripts run as their own process without paying TensorFlow's import each time: a fork server.

Each test worker keeps one Python process that has imported TensorFlow, Keras and keras-hub (no TensorFlow
op run, so no runtime or device is set up yet). A script run is a fork of it: a process of its own with the
script's argv, environment, working directory, stdout and stderr (file descriptors 1 and 2, C++ output
included) and exit status, whose `__main__` is the script. What it saves is the import, ~6 s a run on
these machines, over a hundred runs in the suite (benchmarks/NOTES.md).

`start` returns at once with a Popen-like handle (pid, poll, wait, send_signal, kill), so several runs go
side by side: the workers of a multi-worker test, a run a test kills. The server never touches gRPC or a
device before it forks, so each child sets up its own.

`run` waits for its run as subprocess.run does. A script's runs that need no process of their own go, one
after another, to a resident process of that script (forked once, then kept), as runs in a notebook do:
what each new process paid again, compiling the fused kernels with XLA, is then paid once (about half of
a small run's CPU; benchmarks/NOTES.md item 56). Between runs it puts back what a run leaves behind for
its process's life (flags, signal handlers, log levels, op determinism, locks on output directories).

What the fork cannot give is what an interpreter or TensorFlow reads once as it starts: a run whose
environment changes a TF_*, PYTHON*, LD_*, MALLOC*, OMP_* or KMP_* variable against the server's starts a
fresh interpreter instead. So do runs that need what only subprocess gives (a preexec_fn, pipes).
"""

import atexit
import json
import os
import select
import shutil
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


def setup(job):
    os.environ.clear()
    os.environ.update(job["env"])
    tempfile.tempdir = None  # read TMPDIR again
    os.chdir(job["cwd"])
    for fd, path in ((1, job["out"]), (2, job["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)


def exit_code(call):
    # Run `call()` as a process's main -> the exit status the process would have.
    try:
        call()
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def child(job):
    os.setsid()  # its own process group: a kill reaches what it starts too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.close(answers)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    setup(job)
    extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    argv = job["argv"]
    if argv[0] == "-c":
        sys.argv, sys.path = ["-c", *argv[2:]], ["", *extra, *sys.path[1:]]
        code = exit_code(lambda: exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"}))
    elif argv[0] == "-resident":
        sys.argv, sys.path = [argv[1]], [os.path.dirname(os.path.abspath(argv[1])), *extra, *sys.path[1:]]
        code = resident(argv[1], job["jobs"], job["done"])
    else:
        sys.argv, sys.path = list(argv), [os.path.dirname(os.path.abspath(argv[0])), *extra, *sys.path[1:]]
        code = exit_code(lambda: runpy.run_path(argv[0], run_name="__main__"))
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF)


def resident(script, jobs, done):
    # Run `script` once per line of the FIFO `jobs` ({argv, env, cwd, out, err}), in this process, writing
    # each run's exit status to the FIFO `done`: what the script leaves for the process's life is put back
    # between runs (flags, signal handlers, log levels, op determinism, output-directory locks).
    import importlib.util
    import logging

    from absl import flags
    from tensorflow.python.framework import config as tf_config

    from bert_mgpu.io import output_dir

    spec = importlib.util.spec_from_file_location("_resident_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    with open(jobs) as requests, open(done, "w") as replies:
        for line in requests:
            job = json.loads(line)
            handlers = {s: signal.getsignal(s) for s in signals}
            levels = {n: logging.getLogger(n).level for n in ("", "bert_mgpu", "tensorflow", "absl")}
            setup(job)
            sys.argv = list(job["argv"])
            flags.FLAGS.unparse_flags()
            code = exit_code(module._console)
            sys.stdout.flush()
            sys.stderr.flush()
            for s, h in handlers.items():
                signal.signal(s, h)
            for n, level in levels.items():
                logging.getLogger(n).setLevel(level)
            if tf_config.is_op_determinism_enabled():
                tf_config.disable_op_determinism()
            for key in list(output_dir._HELD):
                output_dir.unlock_output_dir(key)
            replies.write(json.dumps({"status": code}) + "\n")
            replies.flush()
    return 0


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

    def start(self, argv, env, out, err, **extra):
        """Fork a run of `python *argv` writing its stdout and stderr to the files `out` and `err` -> Forked."""
        self.proc.stdin.write((json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "out": out,
                                           "err": err, **extra}) + "\n").encode())
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


class Resident:
    """One script kept running in a process forked from the server, for the runs `run` hands it one after
    another: TensorFlow's runtime, traced kernels and XLA executables stay from run to run, as in a
    notebook, which is what each new process paid again (half a small run's CPU, benchmarks/NOTES.md)."""

    def __init__(self, server, script, env):
        self.dir = tempfile.mkdtemp(prefix="resident-")
        self.jobs, self.done = os.path.join(self.dir, "jobs"), os.path.join(self.dir, "done")
        os.mkfifo(self.jobs)
        os.mkfifo(self.done)
        self.replies = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)
        log = os.path.join(self.dir, "log")
        self.proc = server.start(["-resident", script], env, log, log, jobs=self.jobs, done=self.done)
        deadline, self.requests = time.monotonic() + 120, None
        while self.requests is None:
            try:
                self.requests = os.open(self.jobs, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # not open for reading yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the resident run of {script} did not start: "
                                       f"{open(log, errors='replace').read()[-2000:]}") from None
                time.sleep(0.02)
        os.set_blocking(self.requests, True)
        self.pending = b""
        self.history = []  # (test, argv, status) of each run handed to this process, for a failure's report

    def alive(self):
        return self.proc.poll() is None

    def run(self, argv, env, out, err, timeout):
        """-> the run's exit status; the process's own (a signal: negative) if it died in the run, as a
        process of the run's own would have; None when the run did not end in `timeout` s (then it is
        killed). Once it died or was killed, `alive()` is False and the caller starts another."""
        os.write(self.requests, (json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "out": out,
                                             "err": err}) + "\n").encode())
        code = self._wait(timeout)
        self.history.append([env.get("PYTEST_CURRENT_TEST", "?"), argv[1:], code])
        return code

    def _wait(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if not self.alive():
                code = self.proc.returncode
                self.close()
                return code
            if left <= 0:
                self.close()
                return None
            if select.select([self.replies], [], [], min(left, 0.5))[0]:
                try:
                    self.pending += os.read(self.replies, 1 << 16)
                except BlockingIOError:
                    pass
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)["status"]

    def close(self, clean=False):
        """Kill the process; with `clean`, first let it end as a script's process ends (no more runs: its
        atexit functions run, and remove AutoGraph's generated files from the temporary directory)."""
        if self.requests is None:
            return
        os.close(self.requests)
        self.requests = None
        if clean and self.alive():
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self.proc.kill()
        self.proc.wait(60)
        os.close(self.replies)
        shutil.rmtree(self.dir, ignore_errors=True)


# A run waited for goes to a resident process of its script unless it needs a process of its own: an
# environment a fork cannot stand for (ForkServer.fits), a cluster, or an --auto_batch_size search (it
# measures what the process's allocator holds). At most RESIDENTS live per test worker (each holds a
# TensorFlow runtime).
NOT_RESIDENT = ("--worker_hosts", "--auto_batch_size", "--multi_worker")
RESIDENTS = 2
_server, _residents = None, {}
atexit.register(lambda: [r.close(clean=True) for r in _residents.values()])


def _resident_key(argv, env):
    script = argv[0]
    if (script.startswith("-") or not script.endswith(".py") or not _fork_server().fits(env)
            or any(a.startswith(NOT_RESIDENT) and not a.endswith(("=false", "=0")) for a in argv[1:])):
        return None
    towers = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--towers_per_gpu=")]
    return os.path.abspath(script), towers[-1] if towers else "1"


def _fork_server():
    """This worker's ForkServer, started on first use, and again when the one it had cannot stand for a fresh
    process of this worker's own environment: it died, or a variable it read as it started (FRESH_PREFIXES)
    has changed in this worker since (set by an earlier test, and left). Without the restart every later run
    of the worker would start a fresh interpreter, and lose its resident process (a CI run once did)."""
    global _server
    base = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if _server is not None and not _server.fits(base):
        changed = sorted(k for k in set(base) | set(_server.env)
                         if k.startswith(FRESH_PREFIXES) and base.get(k) != _server.env.get(k))
        why = "the last one died" if _server.proc.poll() is not None else "changed: " + ", ".join(changed)
        print(f"script_runner: a new fork server ({why})", file=sys.stderr)
        for key in list(_residents):  # forked from the old server: its environment
            try:
                _residents.pop(key).close()
            except (RuntimeError, OSError, subprocess.TimeoutExpired):  # the server died under it
                pass
        if _server.proc.poll() is None:  # it ends once its runs have: handles to them keep working
            _server.proc.stdin.close()
        _server = None
    if _server is None:
        _server = ForkServer(base)
    return _server


def start(argv, env, out, err, fresh=False):
    """`python *argv` in `env` with stdout and stderr written to the files `out` and `err`, not waited for:
    a fork of this worker's server where that stands for a fresh interpreter (unless `fresh`), else a
    fresh one -> a Popen-like handle."""
    if not fresh and _fork_server().fits(env):
        return _server.start(argv, env, out, err)
    with open(out, "w") as o, open(err, "w") as e:
        return subprocess.Popen([sys.executable, *argv], stdout=o, stderr=e, env=env)


def run(argv, env, timeout, fresh=False):
    """`python *argv` in `env`, waited for -> a CompletedProcess as subprocess.run(capture_output=True,
    text=True) gives it, or TimeoutExpired (the run killed). A script's run goes to its resident process
    (Resident) when it needs no process of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        read = lambda path: open(path, encoding="utf-8", errors="replace").read()  # noqa: E731
        key = None if fresh else _resident_key(argv, env)
        if key is not None:
            resident = _residents.pop(key, None)
            if resident is None or not resident.alive():
                while len(_residents) >= RESIDENTS:
                    _residents.pop(next(iter(_residents))).close(clean=True)  # the least recently used
                resident = Resident(_server, key[0], env)
            code = resident.run(argv, env, out, err, timeout)
            if code is None:
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, read(out), read(err))
            if resident.alive():
                _residents[key] = resident
            done = subprocess.CompletedProcess([sys.executable, *argv], code, read(out), read(err))
            done.earlier_runs = resident.history[:-1]  # what ran before it in the same process
            return done
        proc = start(argv, env, out, err, fresh)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, read(out), read(err)) from None
        return subprocess.CompletedProcess([sys.executable, *argv], proc.returncode, read(out), read(err))
