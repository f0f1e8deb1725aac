"""The output directory of a run: a place we may write, the settings that made it, its checkpoints.

A training checkpoint is published atomically by TensorFlow itself: the tensors are written under a
temporary name, renamed into `ckpt-N.{index,data}`, and only then does the `checkpoint` file (replaced
atomically) name it. A kill at any moment therefore leaves the previous checkpoint as the latest one.
On top of that, `Checkpoints` adds what a long run on a shared machine needs:
- restore falls back past a damaged checkpoint (truncated, missing shard), saying so;
- save refuses weights that are not finite, so a diverged run never overwrites good checkpoints;
- the `checkpoint` file cannot point outside the directory (it is a text file anyone may have edited);
- the random-generator states (dropout) are saved too, so a resumed run draws what it would have drawn.

Rerunning a command resumes; rerunning with other settings is refused (`check_same_run`) unless the
user says `overwrite=True`, which removes the old checkpoints but no other file.
"""

import glob
import json
import logging
import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from bert_mgpu.checkpoints import RUN_FILE
from bert_mgpu.errors import RunError, UserError

log = logging.getLogger("bert_mgpu")


def check_output_dir(path):
    """Create `path` if needed; UserError if it is a file or cannot be written."""
    if not path:
        raise UserError("--output_dir is required")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--output_dir={path} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"--output_dir={path} is not writable ({e.strerror})") from None
    return path


def read_run(directory):
    """The run metadata (bert_mgpu.json) of a directory, or None."""
    path = os.path.join(directory, RUN_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: unreadable run file ({e})") from None
    if not isinstance(run, dict):
        raise UserError(f"{path}: not a JSON object")
    return run


def _checkpoint_files(directory):
    return glob.glob(os.path.join(directory, "ckpt-*")) + glob.glob(os.path.join(directory, "checkpoint"))


def check_same_run(directory, settings, overwrite=False):
    """Refuse to continue, in `directory`, a run trained with other `settings` (a dict of flags).

    With `overwrite`, the old checkpoints go (other files stay) and training starts over.
    """
    if not _checkpoint_files(directory):
        return
    before = (read_run(directory) or {}).get("settings")
    if before is None or before == settings:
        return
    changed = [f"--{k}={before.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(before) | set(settings))
               if before.get(k) != settings.get(k)]
    if not overwrite:
        raise UserError(f"{directory} holds a run with other settings ({'; '.join(changed)}); use another "
                        "--output_dir, rerun with the same flags to resume, or pass --overwrite_output_dir")
    for path in _checkpoint_files(directory):
        os.remove(path)
    log.warning("--overwrite_output_dir: removed the checkpoints of the earlier run (%s)", "; ".join(changed))


def encoder_setting(fused_encoder):
    """The run setting for --fused_encoder: recorded only when false, so run directories written before
    the flag existed (all fused) still resume, and a fused run is never resumed unfused or back."""
    return {} if fused_encoder else {"fused_encoder": False}


def rng_states(model):
    """The model's random-generator state variables (dropout seeds), in a stable order."""
    return {f"s{i}": v for i, v in enumerate(
        v for v in model.variables if v.path.endswith("seed_generator_state"))}


class Checkpoints:
    """tf.train.CheckpointManager for a run directory, with fallback, a finite check and path checks."""

    def __init__(self, ckpt, directory, weights, max_to_keep=3):
        self.directory, self.weights = directory, list(weights)
        self.ckpt = ckpt
        self.manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=max_to_keep)
        for path in [*self.manager.checkpoints, self.manager.latest_checkpoint]:
            if path:
                self._inside(path)

    def _inside(self, path):
        root = os.path.realpath(self.directory)
        if not os.path.realpath(path).startswith(root + os.sep):
            raise UserError(f"{os.path.join(self.directory, 'checkpoint')}: names {path}, outside the run "
                            "directory; refusing to read it")
        return path

    @property
    def latest(self):
        return self.manager.latest_checkpoint

    def restore(self):
        """Restore the newest readable checkpoint; returns its path, or None when there is none."""
        candidates = list(reversed(self.manager.checkpoints)) or [p for p in [self.latest] if p]
        for path in candidates:
            try:
                self.ckpt.restore(path).assert_existing_objects_matched()
            except Exception as e:  # a damaged file raises OpError, IndexError, ValueError, ... by where it is cut
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                log.warning("checkpoint %s is damaged (%s); trying the one before it", path, first[:200])
                continue
            bad = self.non_finite()
            if bad:
                log.warning("checkpoint %s holds non-finite weights (%s); trying the one before it", path, bad)
                continue
            if path != candidates[0]:
                log.warning("resumed from %s, not the damaged %s", path, candidates[0])
            return path
        if candidates:
            raise RunError(f"{self.directory}: no readable checkpoint ({', '.join(candidates)} damaged); "
                           "move them away to start over")
        return None

    def non_finite(self):
        """Names of weights holding NaN or Inf (empty when all are finite)."""
        return [getattr(v, "path", v.name) for v in self.weights
                if not np.all(np.isfinite(np.asarray(v.numpy(), np.float32)))]

    def save(self, step):
        bad = self.non_finite()
        if bad:
            raise RunError(f"step {step}: weights are not finite ({', '.join(bad[:3])}); not saved. Last good "
                           f"checkpoint: {self.latest or 'none written yet'}. Lower the learning rate")
        return self.manager.save(checkpoint_number=step)


class Run:
    """One training run's output directory: its settings, checkpoints, TensorBoard writer and run files.

    Creating it checks the directory (writable; no other run's checkpoints unless `overwrite`);
    `restore` resumes the newest readable checkpoint; `save` writes a checkpoint and then the run files
    (`write_files(directory, step)`: bert_mgpu.json, bert_config.json, vocab.txt) that make the directory
    loadable. This is the one place that decides what a run writes where.

    Args:
        directory: the output directory (created).
        settings: a dict of what the run is trained with; a rerun with other settings is refused.
        write_files: `write_files(directory, step)`, called after each checkpoint.
        overwrite: start over in a directory holding a run with other settings (its checkpoints go).

    Example:
        run = Run("out", {"learning_rate": 5e-5}, write_files=lambda d, step: None)
        restored = run.restore(tf.train.Checkpoint(model=model, step=step), model.weights)
        run.save(int(step.numpy()))
        run.close()
    """

    def __init__(self, directory: str, settings: dict,
                 write_files: Callable[[str, int], object] = lambda directory, step: None, overwrite: bool = False):
        self.directory, self.settings, self.write_files = check_output_dir(directory), settings, write_files
        check_same_run(directory, settings, overwrite)
        self.checkpoints, self._writer = None, None

    def restore(self, ckpt: tf.train.Checkpoint, weights) -> str | None:
        """Track `ckpt` (weights: the ones checked for NaN before saving); restore the newest readable
        checkpoint. Returns its path, or None for a new run."""
        self.checkpoints = Checkpoints(ckpt, self.directory, weights)
        return self.checkpoints.restore()

    @property
    def latest(self):
        return self.checkpoints.latest if self.checkpoints else None

    @property
    def writer(self):
        """The TensorBoard writer of `directory/train`, created on first use."""
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.directory, "train"))
        return self._writer

    def save(self, step):
        """A checkpoint of step `step`, then the run files."""
        path = self.checkpoints.save(step)
        self.write_files(self.directory, step)
        return path

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
