"""The best tag path under a CRF's transitions (Viterbi), in NumPy: `predict` decodes each window with it, and so
does a CRF tagger's ONNX or LiteRT export served without TensorFlow (io/exported.py).

Example:
    viterbi(emissions [words, tags], transitions [tags, tags]) -> tag ids [words]
"""

import numpy as np


def viterbi(emissions, transitions):
    """The best tag path (numpy [n]) of emissions [n, labels] under `transitions`."""
    emissions, transitions = np.asarray(emissions, np.float64), np.asarray(transitions, np.float64)
    if len(emissions) == 0:
        return np.zeros(0, np.int64)
    score, back = emissions[0], []
    for emission in emissions[1:]:
        total = score[:, None] + transitions
        back.append(total.argmax(0))
        score = total.max(0) + emission
    path = [int(score.argmax())]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return np.array(path[::-1], np.int64)
