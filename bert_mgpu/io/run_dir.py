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
user says `overwrite=True`, which removes the old checkpoints but no other file. A directory another
run is writing is refused (`lock_output_dir`, output_dir.py).
"""

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.core.errors import RunError, UserError
from bert_mgpu.io import names
from bert_mgpu.io.checkpoint_files import note_damaged, run_checkpoints
from bert_mgpu.io.checkpoints import RUN_FILE
from bert_mgpu.io.output_dir import check_output_dir, lock_output_dir, unlock_output_dir

log = logging.getLogger("bert_mgpu")


def read_run(directory):
    """The run metadata (bert_mgpu.json) of a directory, or None."""
    path = os.path.join(directory, RUN_FILE)
    if not storage.exists(path):
        return None
    run = storage.read_json(path)
    if not isinstance(run, dict):
        raise UserError(f"{path}: not a JSON object")
    return names.current(run)


def _checkpoint_files(directory):
    return storage.glob(os.path.join(directory, "ckpt-*")) + storage.glob(os.path.join(directory, "checkpoint"))


def check_same_run(directory, settings, overwrite=False, remove=True):
    """Refuse to continue, in `directory`, a run trained with other `settings` (a dict of flags).

    With `overwrite`, the old checkpoints go (other files stay; remove=False leaves them to the chief)
    and training starts over. Returns whether it starts over.
    """
    if not _checkpoint_files(directory):
        return False
    before = (read_run(directory) or {}).get("settings")
    if before is not None:  # settings recorded since: a run written before them resumes
        settings = {k: v for k, v in settings.items() if k in before or k not in LATER_SETTINGS}
    if before is None or before == settings:
        return False
    changed = [f"--{k}={before.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(before) | set(settings))
               if before.get(k) != settings.get(k)]
    if not overwrite:
        raise UserError(f"{directory} holds a run with other settings ({'; '.join(changed)}); use another "
                        "--output_dir, rerun with the same flags to resume, or pass --overwrite_output_dir")
    if not remove:
        return True
    for path in _checkpoint_files(directory):  # ckpt-N_temp/ too: the directory a killed save leaves
        storage.remove(path)
    log.warning("--overwrite_output_dir: removed the checkpoints of the earlier run (%s)", "; ".join(changed))
    return True


# Settings runs record since a version: a run written before resumes (length_buckets, adam_eps, lr_schedule and
# step_count with what it was trained with: TrainConfig.resuming).
LATER_SETTINGS = {"vocab_sha256", "num_warmup_steps", "length_buckets", "adam_eps", "lr_schedule", "step_count",
                  "student_init"}


def vocab_setting(vocab_file):
    """The run setting for the vocabulary: its sha256, so a rerun with another vocab.txt is another run
    (the run directory's own vocab.txt must stay the one its checkpoints were trained with)."""
    return {"vocab_sha256": hashlib.sha256(storage.read_bytes(vocab_file)).hexdigest()}


def check_event_dir(path):
    """A TensorBoard directory of the run (train/, eval/) must be a real directory: TensorFlow would write
    through a symbolic link, and fails with a bare FailedPreconditionError on a file."""
    if storage.is_remote(path):
        return path
    if os.path.islink(path):
        raise UserError(f"{path} is a symbolic link; bert_mgpu writes its TensorBoard events only into a real "
                        "directory of the run: remove the link")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{path} is a file; bert_mgpu writes its TensorBoard events into a directory of that "
                        "name: move the file away")
    return path


def remove_partial_saves(directory):
    """The `ckpt-N_temp/` directories a save killed half-way leaves (TensorFlow never removes them)."""
    for path in storage.glob(os.path.join(directory, "ckpt-*_temp")):
        storage.remove(path)
        log.info("removed %s, left by a save that was interrupted", path)


def repair_checkpoint_state(directory):
    """A `checkpoint` file naming checkpoints whose files are not there is written again naming those that
    are (by step), with a warning; TensorFlow would otherwise keep reporting the missing one as newest."""
    if not storage.isdir(directory):
        return
    present, missing = run_checkpoints(directory)
    if not missing:
        return
    names = [os.path.basename(p) for p in reversed(present)]
    text = "".join([f'model_checkpoint_path: "{names[-1]}"\n'] if names else []) + \
        "".join(f'all_model_checkpoint_paths: "{n}"\n' for n in names)
    path = os.path.join(directory, "checkpoint")
    if names:
        storage.write_atomic(path, text)
    else:
        storage.remove(path)
    log.warning("%s named %s, whose files are not there; it now names %s", path,
                ", ".join(os.path.basename(p) for p in missing), ", ".join(names) or "nothing (a new run)")


def encoder_setting(fused_encoder):
    """The run setting for --fused_encoder: recorded only when false, so run directories written before
    the flag existed (all fused) still resume, and a fused run is never resumed unfused or back."""
    return {} if fused_encoder else {"fused_encoder": False}


def rng_states(model):
    """The model's random-generator state variables (dropout seeds), in a stable order."""
    return {f"s{i}": v for i, v in enumerate(
        v for v in model.variables if v.path.endswith("seed_generator_state"))}


def save_model_dir(directory, ckpt, step, write_files, chief=True):
    """A loadable model directory (an --init_checkpoint): `ckpt` saved as of `step`, then
    `write_files(directory, step)`. Locally it is built aside and renamed into place, so it appears whole
    or not at all; other file systems (gs://) rename no directory, so it is written in place, its
    bert_mgpu.json last, which says it is whole. Every worker of several must call it (TensorFlow saves
    on all); only the chief's copy is kept."""
    if chief:
        tmp = directory if storage.is_remote(directory) else storage.temporary_dir_for(directory)
    else:
        tmp = tempfile.mkdtemp(prefix="bert_mgpu_worker_")
    storage.remove(tmp)
    storage.makedirs(tmp)
    tf.train.CheckpointManager(ckpt, tmp, max_to_keep=1).save(checkpoint_number=step)
    if not chief:
        storage.remove(tmp)
        return directory
    write_files(tmp, step)
    if tmp != directory:
        storage.replace_dir(tmp, directory)
    return directory


def is_whole_model_dir(directory):
    return storage.exists(os.path.join(directory, RUN_FILE))


class Checkpoints:
    """tf.train.CheckpointManager for a run directory, with fallback, a finite check and path checks."""

    def __init__(self, ckpt, directory, weights, max_to_keep=2):
        self.directory, self.weights = directory, list(weights)
        self.ckpt = ckpt
        self.manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=max_to_keep)
        for path in [*self.manager.checkpoints, self.manager.latest_checkpoint]:
            if path:
                self._inside(path)

    def _inside(self, path):
        if not storage.inside(path, self.directory):
            raise UserError(f"{os.path.join(self.directory, 'checkpoint')}: names {path}, outside the run "
                            "directory; refusing to read it")
        return path

    @property
    def latest(self):
        return self.manager.latest_checkpoint

    def restore(self):
        """Restore the newest readable checkpoint; returns its path, or None when there is none."""
        candidates, _ = run_checkpoints(self.directory) if storage.isdir(self.directory) else ([], [])
        for path in candidates:
            try:
                self.ckpt.restore(path).assert_existing_objects_matched()
            except Exception as e:  # a damaged file raises OpError, IndexError, ValueError, ... by where it is cut
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                log.warning("checkpoint %s is damaged (%s); trying the one before it", path, first[:200])
                note_damaged(path)
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
                           "move them away, or pass --overwrite_output_dir, to start over")
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

    With several workers, only the chief (`chief=True`) writes into `directory`. The others read the
    chief's checkpoints from it (it must be shared storage), and save theirs, as TensorFlow wants every
    worker to, into a temporary directory of their own, removed after each save; they write no run
    file and no TensorBoard event.

    Args:
        directory: the output directory (created).
        settings: a dict of what the run is trained with; a rerun with other settings is refused.
        write_files: `write_files(directory, step)`, called after each checkpoint.
        overwrite: start over in a directory holding a run with other settings (its checkpoints go).
        chief: whether this process writes the run's files (always, on one machine).
        keep: checkpoints kept (--save_total_limit): the newest and those to fall back to if it is damaged.

    Example:
        run = Run("out", {"learning_rate": 5e-5}, write_files=lambda d, step: None)
        restored = run.restore(tf.train.Checkpoint(model=model, step=step), model.weights)
        run.save(int(step.numpy()))
        run.close()
    """

    def __init__(self, directory: str, settings: dict,
                 write_files: Callable[[str, int], object] = lambda directory, step: None, overwrite: bool = False,
                 chief: bool = True, keep: int = 2):
        self.directory, self.settings, self.write_files, self.chief = directory, settings, write_files, chief
        self._locked, self.overwrite, self.keep = False, overwrite, max(1, int(keep))
        if chief:
            check_output_dir(directory)
            self._locked = lock_output_dir(directory)  # a script may hold it already, for all it writes
            check_event_dir(os.path.join(directory, "train"))
        self.fresh = storage.isdir(directory) and check_same_run(directory, settings, overwrite, remove=chief)
        self.checkpoints, self._writer, self._scratch = None, None, None

    def restore(self, ckpt: tf.train.Checkpoint, weights) -> str | None:
        """Track `ckpt` (weights: the ones checked for NaN before saving); restore the newest readable
        checkpoint. Returns its path, or None for a new run."""
        if self.chief:
            remove_partial_saves(self.directory)
            repair_checkpoint_state(self.directory)
        self.checkpoints = Checkpoints(ckpt, self.directory, weights, max_to_keep=self.keep)
        if self.fresh and not self.chief:  # the chief is removing the earlier run's checkpoints
            return None
        try:
            path = self.checkpoints.restore()
        except RunError:
            if not (self.overwrite and self.chief):
                raise
            for old in _checkpoint_files(self.directory):
                storage.remove(old)
            log.warning("--overwrite_output_dir: no checkpoint in %s was readable; removed them, starting over",
                        self.directory)
            self.checkpoints = Checkpoints(ckpt, self.directory, weights, max_to_keep=self.keep)
            path = None
        if not self.chief:
            self._scratch = tempfile.mkdtemp(prefix="bert_mgpu_worker_")
            self.checkpoints = Checkpoints(ckpt, self._scratch, weights, max_to_keep=1)
        return path

    def _read_latest(self):
        return tf.train.latest_checkpoint(self.directory) if storage.isdir(self.directory) else None

    @property
    def latest(self):
        """The run's newest checkpoint (the chief's, on every worker)."""
        if not self.chief:
            return self._read_latest()
        return self.checkpoints.latest if self.checkpoints else None

    @property
    def writer(self):
        """The TensorBoard writer of `directory/train`, created on first use (a no-op one but on the chief)."""
        if self._writer is None:
            self._writer = (tf.summary.create_file_writer(os.path.join(self.directory, "train")) if self.chief
                            else tf.summary.create_noop_writer())
        return self._writer

    def save(self, step):
        """A checkpoint of step `step`, then the run files; on a worker, a throwaway checkpoint."""
        path = self.checkpoints.save(step)
        if not self.chief:
            for name in os.listdir(self._scratch):
                storage.remove(os.path.join(self._scratch, name))
            return self.latest
        self.write_files(self.directory, step)
        return path

    def close(self):
        if self._locked:
            unlock_output_dir(self.directory)
            self._locked = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
