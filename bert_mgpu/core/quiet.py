"""TensorFlow's start-up lines and per-checkpoint INFO lines, held back in scripts and notebooks alike: what a
user sees is bert_mgpu's own output and TensorFlow's real warnings and errors."""

import contextlib
import logging
import os
import shutil
import sys
import tempfile

# What TensorFlow's C++ side prints while it loads on a machine without CUDA, before any log level applies.
START_NOISE = ("All log messages before absl::InitializeLog()", "cudart_stub.cc", "cpu_feature_guard.cc",
               "To enable the following instructions", "Unable to register cu", "computation_placer.cc",
               "oneDNN custom operations are on")


# Names the TF_CPP_MIN_LOG_LEVEL this module set, so that a child process (a sweep's runs, a supervised run)
# does not take the inherited value for the user's own and print TensorFlow's start-up lines.
SET_BY_US = "BERT_MGPU_TF_CPP_MIN_LOG_LEVEL"


def start_tensorflow_quietly(environ=None):
    """Load TensorFlow and list its devices with its start-up lines held back (START_NOISE; cuInit's error
    too where no NVIDIA GPU is visible); any other line it prints is passed on. TF_CPP_MIN_LOG_LEVEL
    becomes 2 (warnings off, errors shown). Left alone when the user set TF_CPP_MIN_LOG_LEVEL (not when a
    parent process of bert_mgpu's set it: SET_BY_US)."""
    hold_back_chatter()
    env = os.environ if environ is None else environ
    users = "TF_CPP_MIN_LOG_LEVEL" in env and env.get(SET_BY_US) != env["TF_CPP_MIN_LOG_LEVEL"]
    if users or "tensorflow" in sys.modules:
        return
    env["TF_CPP_MIN_LOG_LEVEL"] = env[SET_BY_US] = "2"  # a child (a sweep's run) inherits both: quiet too
    no_gpu = shutil.which("nvidia-smi") is None or env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1")
    with stderr_without(START_NOISE + (("failed call to cuInit",) if no_gpu else ())):
        import tensorflow as tf

        tf.config.list_physical_devices()


@contextlib.contextmanager
def stderr_without(noise):
    """Hold what is written to file descriptor 2 (C++ included) and pass on the lines holding none of `noise`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(n in line for n in noise):
                    sys.stderr.write(line)
            sys.stderr.flush()


class _Chatter(logging.Filter):
    """Drops absl INFO lines TensorFlow writes at every checkpoint save."""

    NOISE = ("Sharding callback duration",)

    def filter(self, record):
        return not (record.levelno <= logging.INFO and any(n in str(record.msg) for n in self.NOISE))


def hold_back_chatter():
    """Install the filter on absl's logger once (TensorFlow's checkpoint code logs through absl)."""
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _Chatter) for f in absl_logger.filters):
        absl_logger.addFilter(_Chatter())


def console_logging():
    """bert_mgpu's INFO lines (training records, what was loaded) on stderr where nothing configured logging:
    a notebook or a plain script, as the scripts show them. A program that set up logging keeps its own."""
    logger = logging.getLogger("bert_mgpu")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # a later logging.basicConfig does not print each line twice
