"""The TensorFlow internals bert_mgpu/_compat.py reads are still where it reads them."""

import subprocess
import sys


def test_onednn_decision_is_readable_and_follows_the_environment():
    code = "from bert_mgpu import _compat; print(_compat.onednn_enabled())"
    seen = {}
    for value in ("0", "1"):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**__import__("os").environ, "TF_ENABLE_ONEDNN_OPTS": value})
        assert proc.returncode == 0, ("tensorflow.python.util._pywrap_util_port.IsMklEnabled moved in this "
                                      "TensorFlow; update bert_mgpu/_compat.py.onednn_enabled\n" + proc.stderr[-800:])
        seen[value] = proc.stdout.strip().splitlines()[-1]
    assert seen == {"0": "False", "1": "True"}
