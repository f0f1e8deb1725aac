"""Under a memory limit (`ulimit -v`, `ulimit -d`, a cgroup's memory.max), run the script in a child process.

TensorFlow's CPU kernels (oneDNN's above all) do not check every allocation: at the limit the process dies
of SIGSEGV or SIGABRT instead of raising the out-of-memory error `guards` turns into one line. Only a parent
that survives can then say what happened. Signals sent to the parent (Ctrl-C, SIGTERM) are passed on, and
the child dies with the parent (kill -9 included), so the run behaves as one process.
"""

import os
import resource
import signal
import subprocess
import sys

CHILD = "BERT_MGPU_SUPERVISED"  # set in the child: it runs the script itself
OUT_OF_MEMORY = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGKILL)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def memory_limit():
    """(bytes, where it comes from) of the tightest memory limit on this process, or None."""
    limits = []
    for name, which in (("ulimit -v", resource.RLIMIT_AS), ("ulimit -d", resource.RLIMIT_DATA)):
        soft = resource.getrlimit(which)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append((soft, name))
    cgroup = _cgroup_limit()
    if cgroup:
        limits.append(cgroup)
    return min(limits) if limits else None


def _cgroup_limit():
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            candidates.append(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.max"))
        elif "memory" in controllers.split(","):
            candidates.append(os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.limit_in_bytes"))
    candidates += ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]  # a container's own
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in candidates:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < physical:  # v1 writes a huge number for "no limit"
            return int(text), f"cgroup {os.path.dirname(path)}"
    return None


def _die_with_parent():
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def call_forwarding(argv, env=None):
    """Run `argv` in a child that dies with this process (kill -9 included) and hears each signal this one
    gets, as one process would -> (its exit status, the name of the first signal passed on, or None). Its own
    process group, so a terminal's Ctrl-C reaches it once, through this process."""
    got = []
    child = subprocess.Popen(argv, env=env, process_group=0, preexec_fn=_die_with_parent)

    def forward(signum, frame):
        got.append(signal.Signals(signum).name)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, (got[0] if got else None)


def run_in_child(script, limit):
    """Run this same command line in a child; return the exit status the parent should end with, after one
    line on stderr when the child died of a signal."""
    env = {**os.environ, CHILD: "1"}
    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env=env, process_group=0,
                             preexec_fn=_die_with_parent)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    if code >= 0:
        return code
    if -code not in OUT_OF_MEMORY:
        return 128 - code  # as a shell reports a process a signal ended
    name = signal.Signals(-code).name
    why = "the kernel's out-of-memory killer, or a kill -9" if -code == signal.SIGKILL else \
        "out of memory inside TensorFlow's CPU kernels, which cannot report it"
    size, source = limit
    print(f"{script}: error: the run died of {name} with its memory limited to {size / 2**30:.1f} GiB ({source}): "
          f"{why}; checkpoints written before are complete. Lower --train_batch_size (--gradient_accumulation_steps "
          "keeps the global batch) or --max_seq_length, or raise the limit, and rerun the same command to resume",
          file=sys.stderr)
    return 1
