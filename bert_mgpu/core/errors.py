"""The exceptions a run ends with: the scripts print the message as one line, no traceback, and exit 1
(UserError, RunError) or with a code that asks a scheduler to start them again (Interrupted)."""


class UserError(Exception):
    """Bad input or flags: the message names the file, the line and what is wrong."""


class RunError(Exception):
    """The run cannot go on (repeated non-finite steps, out of memory): the message names the step, the
    tower or the last good checkpoint, and what to change."""


class Interrupted(Exception):
    """A signal stopped the run after it saved a checkpoint; the same command resumes it. The scripts exit
    with `exit_code`, 128 + the signal's number as a shell reports a process the signal ended (SIGTERM 143,
    Ctrl-C 130): not 0, which Kubeflow's TFJob, a Kubernetes Job and SLURM read as a job done, and in the
    128-255 range TFJob's restartPolicy ExitCode retries. A stop another worker's signal caused exits 143."""

    def __init__(self, message, signal_name=None):
        super().__init__(message)
        self.signal_name = signal_name

    @property
    def exit_code(self):
        import signal

        return 128 + int(signal.Signals.__members__.get(self.signal_name or "", signal.SIGTERM))


def disk_full(error):
    """The one line for an exception that is a full disk (Python's ENOSPC/EDQUOT or TensorFlow's
    "No space left on device"), or None for any other exception. TensorFlow's half-written `*_temp`
    checkpoint directory is removed: checkpoints written before it are complete, so the rerun resumes."""
    import errno
    import os
    import re
    import shutil

    path = None
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        path = error.filename
    elif type(error).__name__ == "ResourceExhaustedError" and "No space left on device" in str(error):
        found = re.search(r"(/\S+?)[;:]? No space left on device", str(error))
        path = found.group(1) if found else None
    else:
        return None
    path = os.path.abspath(os.fsdecode(path)) if path else None
    temp = re.match(r"(.*/ckpt-\d+_temp)(/|$)", path or "")
    if temp:
        shutil.rmtree(temp.group(1), ignore_errors=True)
        path = temp.group(1)[: -len("_temp")]
    where = path or os.getcwd()
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free
    newest = _newest_checkpoint_bytes(os.path.dirname(path) if temp else where)
    need = f"; a checkpoint here takes {_size(newest)}" if newest else ""
    return (f"no space left on device writing {path or 'a file'} ({_size(free)} free{need}): files written "
            "before this are complete; free some space and rerun the same command to go on from the last checkpoint")


def _newest_checkpoint_bytes(directory):
    import os
    import re

    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    steps = [int(m.group(1)) for m in map(re.compile(r"ckpt-(\d+)\.index$").match, names) if m]
    if not steps:
        return 0
    prefix = f"ckpt-{max(steps)}."
    return sum(os.path.getsize(os.path.join(directory, n)) for n in names if n.startswith(prefix))


def _size(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
