"""Which checkpoints a directory holds: a run directory's, newest first (each its `checkpoint` file names
checked to lie inside it), and which of them this process found damaged, for the run's summary to say so."""

import os
import re

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError


def _inside(prefix, directory):
    """A checkpoint a directory's `checkpoint` file names must lie in that directory: the file is text anyone
    may have edited, and TensorFlow follows `../` in it."""
    if not storage.inside(prefix, directory):
        raise UserError(f"{os.path.join(directory, 'checkpoint')}: names {prefix}, outside {directory}; "
                        "refusing to read it")
    return prefix


def run_checkpoints(directory):
    """([prefix], [missing]) of a directory's checkpoints, newest first: those its `checkpoint` file names
    (each checked to lie inside it) and any `ckpt-N` whose index is there, by step. `missing`: names the
    file gives with no file of theirs left (a copy that left them out, a hand edit); a checkpoint with some
    of its files is kept, for restoring to find it damaged and say so."""
    import tensorflow as tf  # its checkpoint-state reader: storage's file systems, gs:// too

    state = tf.train.get_checkpoint_state(directory)
    named = []
    if state and state.model_checkpoint_path:
        named = [_inside(p, directory) for p in [*state.all_model_checkpoint_paths, state.model_checkpoint_path]]
    on_disk = [p[: -len(".index")] for p in storage.glob(os.path.join(directory, "ckpt-*.index"))]
    present = {p for p in named if storage.glob(p + ".*")} | set(on_disk)  # files left: damaged at worst
    missing = sorted({p for p in named if p not in present})

    def step(prefix):
        found = re.search(r"-(\d+)$", prefix)
        return (int(found.group(1)) if found else -1, prefix)

    return sorted(present, key=step, reverse=True), missing


_DAMAGED = {}  # a checkpoint's real path -> its index file's (size, mtime) when this process found it unreadable


def note_damaged(prefix):
    """Remember that this process found the checkpoint `prefix` unreadable: the run's summary says so."""
    try:
        found = os.stat(prefix + ".index")
    except OSError:  # not a local file (gs://), or gone: nothing to label
        return
    _DAMAGED[os.path.realpath(prefix)] = (found.st_size, found.st_mtime_ns)


def found_damaged(prefix):
    """Whether this process found `prefix` unreadable, and it has not been written again since."""
    try:
        found = os.stat(prefix + ".index")
    except OSError:
        return False
    return _DAMAGED.get(os.path.realpath(prefix)) == (found.st_size, found.st_mtime_ns)
