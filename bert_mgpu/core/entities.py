"""Entity-level scores of tag sequences, counted as CoNLL's conlleval script counts them.

A predicted entity counts only when its type and both its boundaries equal a true entity's. Chunks follow
conlleval's rules for any of the usual schemes (BIO, IOB1, IO, BIOES, and BILOU with L = E and U = S): an
I- or E- tag after O, E- or S- starts a chunk, as does any change of type. The numbers equal `seqeval`'s
default mode (tests/test_entities.py); this module needs neither it nor scikit-learn.

Example:
    entities(["B-PER", "I-PER", "O", "I-LOC"])  # [("PER", 0, 2), ("LOC", 3, 4)]
    entity_scores([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]])["f1"]  # 0.0: the end differs
"""

from collections import Counter

_SAME = {"L": "E", "U": "S"}  # BILOU's last and unit tags are BIOES's end and single


def split_tag(tag):
    """"B-PER" -> ("B", "PER"); "O" -> ("O", ""); a tag without a prefix ("PER") is inside a chunk."""
    if tag == "O" or not tag:
        return "O", ""
    prefix, dash, kind = tag.partition("-")
    if not dash:
        return "I", tag
    return _SAME.get(prefix, prefix), kind


def entities(tags):
    """The chunks of one tag sequence -> [(type, start, end)], `end` exclusive, in order."""
    found, start, before, before_kind = [], None, "O", ""
    for i, tag in enumerate([*tags, "O"]):  # the "O" after the last tag closes what is open
        prefix, kind = split_tag(tag)
        changed = prefix != "O" and kind != before_kind
        ends = (before in ("E", "S") or (before in ("B", "I") and prefix in ("B", "S", "O"))
                or (before != "O" and kind != before_kind))
        if start is not None and ends:
            found.append((before_kind, start, i))
            start = None
        if prefix in ("B", "S") or (before in ("E", "S", "O") and prefix in ("I", "E")) or changed:
            start = i
        before, before_kind = prefix, kind
    return found


def _prf(right, predicted, true):
    precision = right / predicted if predicted else 0.0
    recall = right / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(true_sequences, predicted_sequences):
    """Micro precision, recall and F1 over the entities of every sequence, token accuracy, and per type
    {precision, recall, f1, support}. Sequences pair up one to one and have equal lengths."""
    true, predicted, right = Counter(), Counter(), Counter()
    tokens = correct = 0
    for n, (t, p) in enumerate(zip(true_sequences, predicted_sequences, strict=True)):
        if len(t) != len(p):
            raise ValueError(f"sequence {n}: {len(t)} true tags but {len(p)} predicted")
        tokens, correct = tokens + len(t), correct + sum(a == b for a, b in zip(t, p))
        want, got = set(entities(t)), set(entities(p))
        true.update(kind for kind, _, _ in want)
        predicted.update(kind for kind, _, _ in got)
        right.update(kind for kind, _, _ in want & got)
    precision, recall, f1 = _prf(sum(right.values()), sum(predicted.values()), sum(true.values()))
    per_type = {}
    for kind in sorted(set(true) | set(predicted)):
        p, r, f = _prf(right[kind], predicted[kind], true[kind])
        per_type[kind] = {"precision": p, "recall": r, "f1": f, "support": true[kind]}
    return {"precision": precision, "recall": recall, "f1": f1,
            "accuracy": correct / tokens if tokens else 0.0, "per_type": per_type}


def span_scores(true, predicted, types=()):
    """Micro precision, recall and F1 over sets of entities (type, start, end), a set a sentence, nested ones
    each on its own (GlobalPointer's), and each type's {precision, recall, f1, support}: on flat entities, the
    numbers `entity_scores` gives their tags."""
    counts = {t: Counter() for t in types}
    for t_set, p_set in zip(true, predicted, strict=True):
        t_set, p_set = set(t_set), set(p_set)
        for name, found in (("predicted", p_set), ("true", t_set), ("right", t_set & p_set)):
            for kind, *_ in found:
                counts.setdefault(kind, Counter())[name] += 1
    total = sum(counts.values(), Counter())
    precision, recall, f1 = _prf(total["right"], total["predicted"], total["true"])
    per_type = {kind: dict(zip(("precision", "recall", "f1"), _prf(c["right"], c["predicted"], c["true"])),
                           support=c["true"]) for kind, c in sorted(counts.items())}
    return {"precision": precision, "recall": recall, "f1": f1}, per_type

