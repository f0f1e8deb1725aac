"""Question answering's scores, as the official scripts count them: SQuAD v1.1 and v2.0 (exact match and
token F1 after normalising: lower case, no punctuation, no articles, single spaces; v2's no-answer
questions, HasAns_/NoAns_ splits and the best threshold over `null_odds.json`) and CMRC 2018 (exact match
without punctuation, F1 of the longest common run of segments: each Chinese character and punctuation mark
a segment). tests/test_qa_metrics.py checks each rule on hand-made cases.

Example:
    squad_scores({"q1": ["Denver Broncos"]}, {"q1": "the Denver Broncos"})   # {"exact_match": 100.0, "f1": 100.0}
"""

import collections
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
# CMRC 2018's punctuation: removed before scoring, and a segment of its own. "……" is two characters there,
# so a lone "…" is neither (as in its script).
_CMRC_PUNCTUATION = {"-", ":", "_", "*", "^", "/", "\\", "~", "`", "+", "=", "，", "。", "：", "？", "！", "“", "”",
                     "；", "’", "《", "》", "……", "·", "、", "「", "」", "（", "）", "－", "～", "『", "』"}
_CJK = re.compile("[\u4e00-\u9fa5]")
_ENGLISH = re.compile(r"\w+|[^\w\s]")  # nltk's word_tokenize, which needs data no package ships, approximated


def normalize_answer(text):
    """SQuAD's normalisation: lower case, punctuation and articles (a, an, the) removed, white space single."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _squad_f1(gold, predicted, v2=True):
    gold, predicted = normalize_answer(gold).split(), normalize_answer(predicted).split()
    if v2 and (not gold or not predicted):  # v2: a no-answer scores 1 only against a no-answer
        return float(gold == predicted)
    same = sum((collections.Counter(gold) & collections.Counter(predicted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _squad_exact(gold, predicted):
    return float(normalize_answer(gold) == normalize_answer(predicted))


def cmrc_segments(text, drop_punctuation=True):
    """CMRC 2018's mixed segmentation: lower-cased; each Chinese character and punctuation mark a segment,
    runs of other characters split into words."""
    out, run = [], ""
    for char in text.lower().strip():
        if drop_punctuation and char in _CMRC_PUNCTUATION:
            continue
        if _CJK.match(char) or char in _CMRC_PUNCTUATION:
            out.extend(_ENGLISH.findall(run))
            run = ""
            out.append(char)
        else:
            run += char
    return out + _ENGLISH.findall(run)


def _longest_common_run(a, b):
    """Length of the longest run of segments a and b share (a substring, not a subsequence)."""
    best, previous = 0, [0] * (len(b) + 1)
    for x in a:
        row = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                row[j + 1] = previous[j] + 1
                best = max(best, row[j + 1])
        previous = row
    return best


def _cmrc_f1(gold, predicted):
    gold, predicted = cmrc_segments(gold), cmrc_segments(predicted)
    same = _longest_common_run(gold, predicted)
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _cmrc_exact(gold, predicted):
    def bare(text):
        return "".join(c for c in text.lower().strip() if c not in _CMRC_PUNCTUATION)
    return float(bare(gold) == bare(predicted))


def _best_of(answers, predicted, score):
    return max(score(a, predicted) for a in answers)


def cmrc_scores(answers, predictions):
    """CMRC 2018: {id: [gold texts]}, {id: predicted text} -> {"exact_match", "f1", "average", "total",
    "skipped"}, percentages over every question (one without a prediction counts 0, as its script)."""
    exact = f1 = skipped = 0.0
    for qid, gold in answers.items():
        if qid not in predictions:
            skipped += 1
            continue
        exact += _best_of(gold, predictions[qid], _cmrc_exact)
        f1 += _best_of(gold, predictions[qid], _cmrc_f1)
    total = len(answers)
    em, f = 100.0 * exact / max(total, 1), 100.0 * f1 / max(total, 1)
    return {"exact_match": em, "f1": f, "average": (em + f) / 2, "total": total, "skipped": int(skipped)}


def squad_scores(answers, predictions, null_odds=None, threshold=1.0):
    """SQuAD: {id: [gold texts]} ([] for a no-answer question), {id: predicted text} ("" for none) ->
    {"exact_match", "f1", "total"} as evaluate-v1.1 gives them, and, when any question has no answer or
    `null_odds` ({id: score}) is given, evaluate-v2.0's: HasAns_/NoAns_ splits and, with null_odds, the
    best exact match and F1 over thresholds (`best_f1_thresh`). A question without a prediction counts 0.
    `threshold`: evaluate-v2.0's --na-prob-thresh (a question whose null odds exceed it is taken as
    unanswered)."""
    v2 = null_odds is not None or any(not gold for gold in answers.values())
    raw = {"exact": {}, "f1": {}}  # before the threshold: what the best threshold is searched over
    exact, f1 = {}, {}
    for qid, gold in answers.items():
        if qid not in predictions:
            exact[qid] = f1[qid] = 0.0
            continue
        if v2:  # evaluate-v2.0 drops gold answers that normalise to nothing
            gold = [g for g in gold if normalize_answer(g)] or [""]
        predicted = predictions[qid]
        raw["exact"][qid] = _best_of(gold, predicted, _squad_exact)
        raw["f1"][qid] = _best_of(gold, predicted, lambda g, p: _squad_f1(g, p, v2))
        if null_odds is not None and null_odds.get(qid, 0.0) > threshold:
            exact[qid] = f1[qid] = float(not answers[qid])
        else:
            exact[qid], f1[qid] = raw["exact"][qid], raw["f1"][qid]
    total = len(answers)
    out = {"exact_match": _percent(exact.values(), total), "f1": _percent(f1.values(), total), "total": total}
    if not v2:
        return out
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [q for q, gold in answers.items() if bool(gold) == wanted]
        if ids:
            out.update({f"{name}_exact": _percent([exact[q] for q in ids], len(ids)),
                        f"{name}_f1": _percent([f1[q] for q in ids], len(ids)), f"{name}_total": len(ids)})
    if null_odds is not None:
        for name in ("exact", "f1"):
            best, at = best_threshold(answers, predictions, raw[name], null_odds)
            out[f"best_{name}"], out[f"best_{name}_thresh"] = best, at
    return out


def _percent(values, total):
    return 100.0 * sum(values) / max(total, 1)


def best_threshold(answers, predictions, raw, null_odds):
    """evaluate-v2.0's best threshold: questions taken in order of their null odds; below the threshold
    each is answered with its prediction (scoring `raw`), above it none is given (1 for a no-answer
    question). -> (best score in percent, the null odds it is reached at; 0.0 when answering none is best)."""
    score = best = sum(1 for gold in answers.values() if not gold)  # every question left unanswered
    at = 0.0
    for qid in sorted(null_odds, key=null_odds.get):
        if qid not in raw:
            continue
        if answers[qid]:
            score += raw[qid]
        elif predictions.get(qid):
            score -= 1  # a no-answer question answered
        if score > best:
            best, at = score, null_odds[qid]
    return 100.0 * best / max(len(raw), 1), at
