"""`compiled`: bert_mgpu's XLA kernels and optimizer programs, with one switch to run them unfused.

Every hand-written kernel is `tf.function(jit_compile=True)`. BERT_MGPU_XLA=0 runs the same ops as a plain
tf.function instead, read when a kernel is called (or traced into a step): for TensorFlow builds without
XLA, for stepping through a kernel's ops, and for the test suite's end-to-end runs of many short
processes, where compiling the kernels for each process and shape costs more than the slower unfused
steps (benchmarks/NOTES.md item 107). The numbers agree to rounding, not to the bit.

Example:
    @compiled
    def norm(x, gamma, beta, eps): ...
"""

import os

import tensorflow as tf

SWITCH = "BERT_MGPU_XLA"


def enabled():
    """Whether kernels compile with XLA now (everything but BERT_MGPU_XLA=0)."""
    return os.environ.get(SWITCH, "1") != "0"


def compiled(fn):
    """`fn` as tf.function(jit_compile=True, autograph=False), or without XLA while BERT_MGPU_XLA=0."""
    return _by_setting(fn, tf.function(fn, jit_compile=True, autograph=False), tf.function(fn, autograph=False))


def calling_kernels(fn):
    """`fn` as tf.function(autograph=False) with a trace of its own for each setting of the switch: a function
    that calls `compiled` kernels keeps the kernels its trace chose, so one traced with the switch off
    must never serve a call with it on (a test worker runs files of both kinds)."""
    return _by_setting(fn, tf.function(fn, autograph=False), tf.function(fn, autograph=False))


def _by_setting(fn, on, off):
    """A function calling `on` or `off` as the switch says; `.traces` = {True: on, False: off}."""

    def call(*args, **kwargs):
        return (on if enabled() else off)(*args, **kwargs)

    # Its name and docstring, not functools.wraps: with a `__wrapped__`, a tf.function given this as an argument
    # took gradients of zero through it (test_fused_encoder's hand-written backward test).
    call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    call.traces = {True: on, False: off}
    return call
