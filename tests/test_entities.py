"""Entity scores equal seqeval's default mode (conlleval's rules) on random tag sequences of every scheme."""

import random

import pytest

from bert_mgpu.core.entities import entities, entity_scores, split_tag

TYPES = ("PER", "LOC", "ORG")


def random_sequences(seed, prefixes, n=300):
    """n random true sequences (0 to 12 tags) and predictions that keep each tag with probability 0.7."""
    rng = random.Random(seed)
    tags = ["O"] + [f"{p}-{t}" for p in prefixes for t in TYPES]
    true = [[rng.choice(tags) for _ in range(rng.randint(0, 12))] for _ in range(n)]
    return true, [[t if rng.random() < 0.7 else rng.choice(tags) for t in seq] for seq in true]


def test_chunks_follow_conllevals_rules():
    assert entities(["B-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]  # I- after O starts one
    assert entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 3)]  # a change of type too
    assert entities(["B-PER", "B-PER", "E-PER", "I-PER"]) == [("PER", 0, 1), ("PER", 1, 3), ("PER", 3, 4)]
    assert entities(["U-ORG", "B-LOC", "L-LOC"]) == entities(["S-ORG", "B-LOC", "E-LOC"]) == [
        ("ORG", 0, 1), ("LOC", 1, 3)]  # BILOU is BIOES
    assert split_tag("O") == ("O", "") and split_tag("PER") == ("I", "PER") and split_tag("B-I-X") == ("B", "I-X")
    assert entities([]) == [] and entity_scores([[]], [[]])["f1"] == 0.0
    with pytest.raises(ValueError, match="sequence 0: 2 true tags but 1 predicted"):
        entity_scores([["O", "O"]], [["O"]])


@pytest.mark.parametrize("prefixes", ["BI", "I", "BIES"], ids=["bio", "io", "bioes"])
def test_scores_equal_seqevals_default_mode(prefixes):
    seqeval = pytest.importorskip("seqeval.metrics", reason="the test extra's reference, seqeval, is not installed")
    from seqeval.metrics.sequence_labeling import get_entities

    true, predicted = random_sequences(1, prefixes)
    for t in true[:50]:
        assert entities(t) == [(k, s, e + 1) for k, s, e in sorted(get_entities(t), key=lambda c: c[1])], t
    got = entity_scores(true, predicted)
    assert 0.1 < got["f1"] < 0.9  # neither all wrong nor all right: the comparison is not of zeros or ones
    assert got["precision"] == pytest.approx(seqeval.precision_score(true, predicted), abs=1e-12)
    assert got["recall"] == pytest.approx(seqeval.recall_score(true, predicted), abs=1e-12)
    assert got["f1"] == pytest.approx(seqeval.f1_score(true, predicted), abs=1e-12)
    assert got["accuracy"] == pytest.approx(seqeval.accuracy_score(true, predicted), abs=1e-12)
    report = seqeval.classification_report(true, predicted, output_dict=True)
    for kind in TYPES:
        for key in ("precision", "recall", "f1"):
            assert got["per_type"][kind][key] == pytest.approx(report[kind][key + ("-score" if key == "f1" else "")],
                                                               abs=1e-12), (kind, key)
        assert got["per_type"][kind]["support"] == report[kind]["support"]
