"""The CRF against brute force: every tag path of short rows enumerated, its log-partition and best path."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from bert_mgpu.model import crf
from bert_mgpu.model.crf import log_likelihood, viterbi


def brute(emissions, transitions):
    """(log-partition, best path, {path: score}) by enumerating every path."""
    n, c = emissions.shape
    scores = {}
    for path in itertools.product(range(c), repeat=n):
        scores[path] = sum(emissions[t, y] for t, y in enumerate(path)) + sum(
            transitions[a, b] for a, b in zip(path, path[1:]))
    values = np.array(list(scores.values()))
    top = values.max()
    return top + np.log(np.exp(values - top).sum()), max(scores, key=scores.get), scores


def test_log_likelihood_and_viterbi_equal_enumerating_every_path():
    rng = np.random.default_rng(0)
    c, width = 3, 7
    transitions = rng.normal(size=(c, c))
    emissions = rng.normal(size=(4, width, c)).astype(np.float32)
    # Labelled positions scattered among unlabelled ones (-1: later WordPieces, [CLS], padding); one row none.
    labels = np.full((4, width), -1, np.int64)
    chosen = {0: [1, 2, 4, 5], 1: [3], 2: [1, 3, 4, 6], 3: []}
    for row, positions in chosen.items():
        labels[row, positions] = rng.integers(0, c, len(positions))
    got = log_likelihood(tf.constant(emissions), tf.constant(labels), tf.constant(transitions, tf.float32)).numpy()
    for row, positions in chosen.items():
        if not positions:
            assert got[row] == 0.0
            continue
        log_z, best, scores = brute(emissions[row, positions].astype(np.float64), transitions)
        path = tuple(int(labels[row, p]) for p in positions)
        assert got[row] == pytest.approx(scores[path] - log_z, abs=1e-5)
        assert tuple(viterbi(emissions[row, positions], transitions)) == best


def test_the_likelihood_compiles_with_xla_and_gives_transitions_a_gradient():
    rng = np.random.default_rng(1)
    emissions = tf.constant(rng.normal(size=(2, 5, 4)), tf.float32)
    labels = tf.constant([[-1, 0, 2, -1, 1], [-1, 3, -1, -1, -1]])
    transitions = tf.Variable(tf.zeros((4, 4)))

    @tf.function(jit_compile=True, autograph=False)
    def loss():
        with tf.GradientTape() as tape:
            value = -tf.reduce_sum(log_likelihood(emissions, labels, transitions))
        return value, tape.gradient(value, transitions)

    value, gradient = loss()
    eager = -tf.reduce_sum(log_likelihood(emissions, labels, transitions))
    assert float(value) == pytest.approx(float(eager), abs=1e-5)
    # Zero transitions: the gradient of a pair is (expected count - 1 if taken); the two taken pairs are
    # (0 -> 2) and (2 -> 1), so those entries are negative and the others positive.
    g = gradient.numpy()
    assert g[0, 2] < 0 and g[2, 1] < 0 and (np.delete(g.ravel(), [2, 9]) > 0).all()


def test_the_graphs_viterbi_equals_the_hosts_on_rows_of_every_length():
    """viterbi_tf (the SavedModel's decoder) against viterbi, rows of 0 to 7 positions padded to 7."""
    from bert_mgpu.model.crf import viterbi_tf

    rng = np.random.default_rng(2)
    c, width = 4, 7
    transitions = rng.normal(size=(c, c)).astype(np.float32)
    emissions = rng.normal(size=(8, width, c)).astype(np.float32)
    lengths = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int32)
    got = viterbi_tf(tf.constant(emissions), tf.constant(lengths), tf.constant(transitions)).numpy()
    assert got.shape == (8, width)
    for row, n in enumerate(lengths):
        assert tuple(got[row, :n]) == tuple(viterbi(emissions[row, :n], transitions)), row
    one = viterbi_tf(tf.constant(emissions[:, :1]), tf.constant(np.minimum(lengths, 1)), tf.constant(transitions))
    assert one.numpy()[1:, 0].tolist() == emissions[1:, 0].argmax(-1).tolist()
    # Traced as the SavedModel traces it, on batches whose longest row has 0, 1 or 2 words, or no rows at all:
    # a scan over no step used to fail there ("Tried to stack elements of an empty list").
    graph = tf.function(viterbi_tf, input_signature=[tf.TensorSpec([None, None, c]), tf.TensorSpec([None], tf.int32),
                                                     tf.TensorSpec([c, c])])
    for width in (0, 1, 2):
        for rows in (0, 1, 3):
            part, n = emissions[:rows, :width], np.minimum(lengths[1:rows + 1], width)
            got = graph(part, n, transitions).numpy()
            assert got.shape == (rows, width)
            for row in range(rows):
                assert tuple(got[row, :n[row]]) == tuple(viterbi(part[row, :n[row]], transitions)), (width, row)


def test_the_crfs_graphs_transpose_no_integers_or_booleans():
    """oneDNN's graph pass logs an error line for an integer or boolean Transpose, AVX-512 or not."""
    emissions = tf.TensorSpec([None, None, 5], tf.float32)
    graphs = [tf.function(crf.log_likelihood).get_concrete_function(
                  emissions, tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([5, 5], tf.float32)).graph,
              tf.function(crf.viterbi_tf).get_concrete_function(
                  emissions, tf.TensorSpec([None], tf.int32), tf.TensorSpec([5, 5], tf.float32)).graph]
    transposed = [op.get_attr("T") for g in graphs for op in g.get_operations() if op.type == "Transpose"]
    assert transposed and set(transposed) == {tf.float32}
