"""The one place bert_mgpu reads TensorFlow internals that have no public name.

Each function says what it needs and why; tests/test_compat.py fails with a clear message when an
upgrade moves one of them.
"""


def onednn_enabled():
    """Whether TensorFlow runs oneDNN on this CPU (on by default only with AVX512-VNNI/BF16 or AMX, or when
    TF_ENABLE_ONEDNN_OPTS=1), answered without starting any device: its CPU allocator, and whether that
    keeps memory statistics, follows from it."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def sublayers(model):
    """Every layer inside a Keras model, outer layers first (Keras 3 names no public walk of nested layers)."""
    return list(model._flatten_layers(include_self=True, recursive=True))
