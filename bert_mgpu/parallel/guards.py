"""What ends a training run early, and how it ends cleanly: a signal, repeated non-finite steps, no memory.

- SIGTERM (a scheduler, `kill`) or Ctrl-C: the step under way finishes, the loop saves a checkpoint and
  returns; the script exits 0 and the same command resumes. A second Ctrl-C interrupts at once. With
  several workers, a signal to any one stops all after the same step (`Preemption`).
- Non-finite gradients skip the step (the LossScaleOptimizer's doing); after `limit` skips in a row the
  run is hopeless (diverged, or a weight went NaN), so it stops naming the step and the last checkpoint.
- Out of memory: TensorFlow's ResourceExhaustedError becomes one line naming the tower, the per-tower
  batch and the sequence length, with a batch to try.
"""

import logging
import re
import signal
import threading

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import RunError
from bert_mgpu.parallel import distribute

log = logging.getLogger("bert_mgpu")


class StopSignal:
    """Within `with StopSignal() as stop:`, SIGTERM and SIGINT set `stop.requested` (the signal's name)
    instead of killing the process. Handlers can only be installed from the main thread; elsewhere
    (a worker thread) signals keep their usual effect."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT), on_signal=None):
        self.signals, self.requested, self._old, self.on_signal = signals, None, {}, on_signal

    def _handle(self, signum, frame):
        if self.requested:  # asked twice: stop now
            self._restore()
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if self.on_signal is not None:
            self.on_signal(self.requested)

    def _restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in self.signals}
        return self

    def __exit__(self, *exc):
        self._restore()
        return False


class Preemption:
    """Where a signal stops the loop: after the step under way on one machine; with several workers,
    after the same step on every worker, each having saved through `save`, by TensorFlow's
    PreemptionCheckpointHandler (distribute.preemption_handler), so that none waits forever in a
    collective the others left. Feed it signals with `StopSignal(on_signal=preemption.signalled)`.

    Example:
        preemption = Preemption(strategy, save, workers=2)
        with StopSignal(on_signal=preemption.signalled), preemption:
            while training:
                step()
                if preemption.after_step():
                    break
    """

    def __init__(self, strategy, save, workers):
        self.strategy, self.save, self.workers = strategy, save, workers
        self.requested, self._handler, self._wake = None, None, threading.Event()

    def signalled(self, name):
        """This worker received signal `name`."""
        self.requested = name
        self._wake.set()

    def _watch(self):  # the handler's watcher thread: wakes at once on a signal, instead of polling each second
        self._wake.wait(60)
        return self.requested is not None

    def _save(self):  # the handler's save_fn, called on every worker after the agreed step
        # The handler joins its watcher thread next: wake it, or a worker that got no signal waits out
        # the watcher's 60 s before it stops.
        self._wake.set()
        log.info("%s: every worker saves after this step and stops (TensorFlow's PreemptionCheckpointHandler)",
                 self.requested or "a signal to another worker")
        self.save()

    def _stopped(self):  # the handler's exit_fn, called after every worker saved
        raise _Stopped

    def __enter__(self):
        if self.workers > 1:
            self._handler = distribute.preemption_handler(self.strategy, self._watch, self._save, self._stopped)
        return self

    def after_step(self):
        """Why the loop must stop now (the signal's name, or "a signal to another worker"), else None."""
        if self._handler is None:
            return self.requested
        import tensorflow as tf

        try:
            _compat.save_if_preempted(self._handler)
        except _Stopped:
            self._handler = None  # it stopped its watchers itself
            return self.requested or "a signal to another worker"
        except tf.errors.AlreadyExistsError:  # a signal in the last step, after another worker ended: no stop
            pass
        return None

    def __exit__(self, exc_type, *exc):
        # After a worker is lost its watcher may wait on the coordination service forever: left to
        # die with the process (a daemon thread).
        if self._handler is not None and exc_type is None:
            self._wake.set()
            _compat.stop_preemption_watchers(self._handler)
        self._handler = None
        return False


class _Stopped(Exception):
    """Raised by the handler's exit_fn: every worker saved, the loop stops."""


class SkipGuard:
    """`limit` steps skipped in a row (0: no limit) raise RunError. The training step counts the runs on
    the device; the loop hands the longest since its last look to `check`."""

    def __init__(self, limit):
        self.limit = int(limit or 0)

    def check(self, longest_run, step, last_checkpoint):
        if self.limit and longest_run >= self.limit:
            raise RunError(
                f"step {step}: {longest_run} steps in a row had non-finite gradients and were skipped; "
                f"stopped. Last good checkpoint: {last_checkpoint or 'none written yet'}. Lower the learning "
                "rate, check the input, or raise --max_consecutive_skips")


def tower_of(message):
    """The tower index an out-of-memory message names (`.../device:GPU:3`), or None.

    An XLA kernel's message names no device; then the op's replica prefix (`node replica_1/...`) does,
    for every tower but the first: tf.distribute gives the first replica's ops no prefix, so a model op
    (`node bert_classifier/...`) without one is the first tower's. Outside the towers the step only
    reduces scalars, which do not run out of memory."""
    message = message or ""
    found = re.findall(r"device:(?:GPU|CPU):(\d+)", message) or re.findall(r"node replica_(\d+)/", message)
    if found:
        return int(found[-1])
    return 0 if re.search(r"node (?!replica_)[\w.-]+/", message) else None


def out_of_memory(error, per_tower_batch, seq_length, accum_steps=1):
    """A RunError for a ResourceExhaustedError: where, at what size, and what to try."""
    tower = tower_of(getattr(error, "message", str(error)))
    where = f"tower {tower}" if tower is not None else "a tower"
    smaller = max(1, per_tower_batch // 2)
    advice = (f"try --train_batch_size={smaller} per tower (with {2 * accum_steps} accumulation steps to "
              "keep the global batch), a shorter --max_seq_length, or --auto_batch_size")
    if per_tower_batch <= 1:
        advice = "even one sequence does not fit: use a shorter --max_seq_length or a smaller model"
    return RunError(f"out of memory on {where} at per-tower batch {per_tower_batch} x sequence length "
                    f"{seq_length}; {advice}")


def worker_lost(error, last_checkpoint):
    """A RunError for a collective that failed because another worker stopped (killed, preempted, out of
    memory) or cannot be reached: TensorFlow cannot go on with fewer workers, so every worker reruns."""
    import re

    remote = re.search(r"(?:remote target |reported from |unhealthy[^/]*)/job:(\w+)(?:/replica:\d+)?/task:(\d+)",
                       str(error))
    who = f"{remote.group(1)} {remote.group(2)}" if remote else "another worker"
    return RunError(f"{who} stopped or cannot be reached ({type(error).__name__} in a collective); rerun the "
                    f"same command on every worker: the job resumes from {last_checkpoint or 'its start'}")


def worker_errors():
    """What TensorFlow raises in a collective whose peer is gone."""
    import tensorflow as tf

    return (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
            tf.errors.CancelledError)
