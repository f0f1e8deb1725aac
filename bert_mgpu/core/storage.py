"""Files of a run on any file system TensorFlow knows: local paths through the OS (its error messages,
fsync, symlinks replaced rather than written through), `scheme://` paths (gs://, s3://, hdfs://, and
ram:// in the tests) through tf.io.gfile. Checkpoints and TensorBoard events already go through
TensorFlow's own file systems; this is for everything else a run writes and reads back.

Example:
    write_atomic("gs://bucket/run/eval_results.txt", "eval_accuracy = 0.9\\n")
    read_text("gs://bucket/run/bert_mgpu.json")
"""

import glob as _glob
import os
import shutil
import tempfile

from bert_mgpu.core.errors import UserError


def is_remote(path):
    return "://" in str(path)


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def exists(path):
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path):
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def makedirs(path):
    if is_remote(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def glob(pattern):
    return sorted(_gfile().glob(pattern) if is_remote(pattern) else _glob.glob(pattern))


def read_bytes(path):
    """The file's bytes. Raises OSError (with strerror) wherever it lives."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    import tensorflow as tf

    try:
        with _gfile().GFile(path, "rb") as f:
            return f.read()
    except tf.errors.OpError as e:
        raise OSError(2, e.message.split(";")[-1].strip() or "cannot read", path) from None


def read_text(path):
    """The file's text (UTF-8; a local file's line ends as Python's text mode reads them). Raises
    OSError (with strerror) or UnicodeDecodeError."""
    if not is_remote(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return read_bytes(path).decode("utf-8")


def read_json(path, what="JSON"):
    """A JSON file's value; a UserError naming the file and the line for one that cannot be read or parsed
    (a file cut short by a crash or an editor)."""
    import json

    try:
        return json.loads(read_text(path))
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not valid {what} ({e.msg}, column {e.colno})") from None


def write_atomic(path, data):
    """Write `data` (str as UTF-8, or bytes) as a temporary file beside `path`, then rename it over
    `path`: a crash leaves the old file or the new one, never half of one, and a symlink at `path` is
    replaced, not followed."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    if is_remote(path):
        gfile = _gfile()
        tmp = _beside(path, f".tmp-{os.getpid()}-")
        with gfile.GFile(tmp, "wb") as f:
            f.write(data)
        gfile.rename(tmp, path, overwrite=True)
        return path
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a file written by open() follows the umask
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


PENDING = ".bert_mgpu_pending.json"  # a set of files written but not all moved into place yet


def write_set(directory, files):
    """Write {name: data} in `directory` as one set: every file is written aside first, then a note listing
    them, then each is renamed into place and the note removed. A kill during the renames leaves the note,
    and `finish_pending` (every script start) completes them: old and new files are never left mixed.
    Returns the paths. Other file systems (gs://) write the files one by one."""
    import json

    if is_remote(directory):
        return [write_atomic(os.path.join(directory, name), data) for name, data in files.items()]
    moves = []
    try:
        for name, data in files.items():
            final = os.path.join(directory, name)
            moves.append((write_atomic(_beside(final, f".set-{os.getpid()}-"), data), final))
    except BaseException:
        for tmp, _ in moves:
            remove(tmp)
        raise
    write_atomic(os.path.join(directory, PENDING), json.dumps([[os.path.basename(t), os.path.basename(f)]
                                                                for t, f in moves]))
    finish_pending(directory)
    return [final for _, final in moves]


def finish_pending(directory):
    """Complete the renames of a `write_set` a kill interrupted (nothing when there is no note)."""
    import json

    note = os.path.join(directory, PENDING)
    if is_remote(directory) or not os.path.exists(note):
        return
    with open(note, encoding="utf-8") as f:
        moves = json.load(f)
    for tmp, final in moves:
        if os.path.exists(os.path.join(directory, tmp)):
            os.replace(os.path.join(directory, tmp), os.path.join(directory, final))
    os.remove(note)


def probe_writable(directory):
    """Write and remove a small file in `directory`: OSError (or TensorFlow's error elsewhere) if it cannot
    be written, found before a run's work rather than after it."""
    remove(write_atomic(os.path.join(directory, f".write-test-{os.getpid()}"), "ok"))


def follow_umask(path):
    """Give a local file the mode a file written by open() gets (0666 less the umask)."""
    if not is_remote(path):
        os.chmod(path, 0o666 & ~_umask())


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove(path):
    """A file, or a directory with all in it (TensorFlow's `ckpt-N_temp/` left by a kill), or a link."""
    if is_remote(path):
        import tensorflow as tf

        gfile = _gfile()
        try:
            (gfile.rmtree if gfile.isdir(path) else gfile.remove)(path)
        except tf.errors.NotFoundError:
            pass
    elif os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _beside(path, prefix):
    """A name in `path`'s directory that no file system takes for `path` itself (ram:// counts every
    name that starts with `path` as `path`)."""
    head, tail = os.path.split(str(path).rstrip("/"))
    return os.path.join(head, prefix + tail)


def temporary_dir_for(path):
    """Where to build a directory that `replace_dir` then puts at `path`."""
    return _beside(path, ".tmp-")


def replace_dir(tmp, path):
    """Put the finished directory `tmp` at `path`, removing what was there."""
    if exists(path):
        remove(path)
    if is_remote(path):
        _gfile().rename(tmp, path, overwrite=True)
    else:
        os.replace(tmp, path)


def inside(path, root):
    """Whether `path` lies inside the directory `root` (symlinks resolved on a local file system)."""
    if is_remote(path) or is_remote(root):
        import posixpath

        scheme, rest = str(root).split("://", 1)
        norm = lambda p: posixpath.normpath(p.split("://", 1)[1]) if "://" in p else None  # noqa: E731
        inner = norm(str(path))
        return str(path).startswith(scheme + "://") and inner is not None and \
            (inner + "/").startswith(posixpath.normpath(rest) + "/") and inner != posixpath.normpath(rest)
    real = os.path.realpath(root)
    return os.path.realpath(path).startswith(real + os.sep)
