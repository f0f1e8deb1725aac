"""A place a run may write: the output directory checked (a writable directory, no symbolic link a run would
write through) and locked, so that two runs never interleave their checkpoints in one directory.
"""

import os

import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError


def check_output_dir(path, flag="--output_dir"):
    """Create `path` if needed; UserError if it is a file, cannot be written, or holds a symbolic link
    (`check_no_links`). `flag` names it in the message (--output_dir, --export_dir)."""
    if not path:
        raise UserError(f"{flag} is required")
    if storage.exists(path) and not storage.isdir(path):
        raise UserError(f"{flag}={path} is a file, not a directory")
    try:
        storage.makedirs(path)
        storage.probe_writable(path)
    except OSError as e:
        raise UserError(f"{flag}={path} is not writable ({e.strerror})") from None
    except tf.errors.OpError as e:
        raise UserError(f"{flag}={path} is not writable ({e.message})") from None
    check_no_links(path)
    storage.finish_pending(path)
    return path


def check_no_links(directory):
    """UserError for a symbolic link that a run would write through: TensorFlow writes checkpoints, events and
    SavedModels through links, so a linked `ckpt-N.index`, `checkpoint`, `train/` or `export/` (or anything
    inside a subdirectory) would be overwritten outside the run. A link to a file bert_mgpu writes itself
    (vocab.txt, results) is replaced whole, never written through, and the directory itself may be a link."""
    if storage.is_remote(directory):
        return
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                continue
            if root == directory and not os.path.isdir(path) and not name.startswith("ckpt-") and name != "checkpoint":
                continue
            raise UserError(f"{path} is a symbolic link; bert_mgpu writes only real files inside its output directory "
                            f"and would write through it (to {os.readlink(path)}): remove the link")


_HELD = {}  # realpath of a directory -> the open descriptor through which this process locks it


def lock_output_dir(directory):
    """Hold an advisory lock on `directory` itself until `unlock_output_dir` (a run's `close`) or the end of
    this process, or UserError naming the process that holds it: two training runs on one directory would
    interleave their checkpoints and results. Nothing is written for it.

    The kernel drops the lock when its process ends, however it ends (kill -9 too), so it is never stale.
    A process that holds it may lock it again. Storage other than local paths (gs://) cannot be locked
    so; there the user keeps runs apart. Returns whether this call took the lock (not already held)."""
    import fcntl

    if storage.is_remote(directory):
        return False
    key = os.path.realpath(directory)
    if key in _HELD:
        return False
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _lock_holder(directory)
        raise UserError(f"--output_dir={directory} is in use by another run ({holder}); wait for it to end or "
                        "choose another directory") from None
    _HELD[key] = fd
    return True


def _lock_holder(directory):
    """The process holding a flock on `directory`, from /proc/locks (MAJOR:MINOR:INODE, hexadecimal devices)."""
    st = os.stat(directory)
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK":
                    major, minor, inode = fields[5].split(":")
                    if (int(major, 16), int(minor, 16), int(inode)) == (os.major(st.st_dev), os.minor(st.st_dev),
                                                                         st.st_ino):
                        return f"pid {fields[4]}"
    except (OSError, ValueError):
        pass
    return "another process"


def unlock_output_dir(directory):
    fd = _HELD.pop(os.path.realpath(directory), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the lock
