"""Question answering's scores: each rule of SQuAD's official evaluate-v1.1/v2.0 and CMRC 2018's script on
hand-made cases, and SQuAD's equal to transformers 4.46's port of evaluate-v2.0 on random ones."""

import types

import numpy as np
import pytest

from bert_mgpu.core.qa_metrics import cmrc_scores, cmrc_segments, normalize_answer, squad_scores


def test_squad_normalises_case_punctuation_articles_and_spaces_and_takes_the_best_gold_answer():
    assert normalize_answer("  The  Denver, Broncos!  ") == "denver broncos"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theater") == "theater"  # an article only as a whole word
    answers = {"a": ["The Denver Broncos!"], "b": ["Denver Broncos"], "c": ["Paris", "the city of Paris"],
               "d": ["Lyon"]}
    predictions = {"a": "denver  broncos", "b": "Broncos of Denver", "c": "city of Paris"}  # d: none given
    scores = squad_scores(answers, predictions)
    # b: 2 shared tokens, precision 2/3, recall 1 -> F1 0.8; d counts 0.
    assert scores == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(100 * 2.8 / 4), "total": 4}


def test_squad_v2_counts_no_answer_questions_the_threshold_and_the_best_threshold():
    answers = {"q1": ["Denver"], "q2": [], "q3": ["Paris"], "q4": []}
    predictions = {"q1": "Denver", "q2": "x", "q3": "Lyon", "q4": ""}
    plain = squad_scores(answers, predictions)
    assert plain["exact_match"] == pytest.approx(50.0)
    assert (plain["HasAns_exact"], plain["HasAns_total"], plain["NoAns_exact"], plain["NoAns_total"]) == (
        pytest.approx(50.0), 2, pytest.approx(50.0), 2)
    assert "best_f1" not in plain
    odds = {"q1": -2.0, "q2": 0.5, "q3": 3.0, "q4": 1.5}
    scored = squad_scores(answers, predictions, odds)
    # Null odds above 1.0 (evaluate-v2.0's default threshold) mean no answer: q3 (wrong anyway) and q4 (none).
    assert scored["exact_match"] == pytest.approx(50.0)
    # The best threshold: answer q1 only (-2.0): q1 right, q2 q3 q4 left unanswered -> q2 and q4 right.
    assert scored["best_exact"] == pytest.approx(75.0) and scored["best_exact_thresh"] == -2.0
    assert scored["best_f1"] == pytest.approx(75.0)
    # A right answer the threshold takes away.
    assert squad_scores({"q": ["Denver"]}, {"q": "Denver"}, {"q": 1.01})["exact_match"] == 0.0


def test_cmrc_segments_chinese_by_character_drops_its_punctuation_and_scores_the_longest_common_run():
    assert cmrc_segments("iPhone 手机，很好!") == ["iphone", "手", "机", "很", "好", "!"]  # ASCII ! is not its mark
    assert cmrc_scores({"a": ["北京。"]}, {"a": "北京"})["exact_match"] == 100.0
    # 天安门 is the longest common run: precision 3/5, recall 3/5.
    assert cmrc_scores({"a": ["北京天安门"]}, {"a": "天安门广场"})["f1"] == pytest.approx(60.0)
    # A common subsequence (甲乙丁) is not a run: one character in common -> F1 1/4.
    assert cmrc_scores({"a": ["甲乙丙丁"]}, {"a": "甲丙乙丁"})["f1"] == pytest.approx(25.0)
    # Exact match keeps spaces; F1 splits English words out of a run.
    mixed = cmrc_scores({"a": ["iPhone 手机"]}, {"a": "iphone手机"})
    assert (mixed["exact_match"], mixed["f1"]) == (0.0, pytest.approx(100.0))
    # "……" is one of its marks as two characters, so a lone "…" stays.
    assert cmrc_scores({"a": ["好…"]}, {"a": "好"})["exact_match"] == 0.0
    both = cmrc_scores({"a": ["北京", "首都北京"], "b": ["上海"]}, {"a": "首都北京", "c": "x"})
    assert both == {"exact_match": 50.0, "f1": 50.0, "average": 50.0, "total": 2, "skipped": 1}


def test_squad_scores_equal_the_reference_port_of_evaluate_v2_on_random_cases(squad_reference):
    rng = np.random.default_rng(0)
    pool = ["The", "the", "a", "Denver", "denver,", "Broncos", "Paris!", "city", "of", "an", "New", "York", ".", "",
            "Ünï", "1,000"]

    def text(low=0, words=False):
        """Random words; `words`: some that normalise to a word (evaluate-v1.1 and the v2 port differ only
        on answers that normalise to nothing, which v1 data does not have)."""
        while True:
            found = " ".join(rng.choice(pool, int(rng.integers(low, 5))))
            if not words or normalize_answer(found):
                return found

    for version_2 in (False, True):
        answers, predictions, odds = {}, {}, {}
        for i in range(300):
            qid = f"q{i}"
            none = version_2 and rng.random() < 0.3
            answers[qid] = [] if none else [text(1, not version_2) for _ in range(int(rng.integers(1, 4)))]
            predictions[qid] = "" if version_2 and rng.random() < 0.3 else text(0, not version_2)
            odds[qid] = float(rng.normal(0, 2))
        examples = [types.SimpleNamespace(qas_id=q, answers=[{"text": t} for t in a]) for q, a in answers.items()]
        ours = squad_scores(answers, predictions, odds if version_2 else None)
        theirs = squad_reference.squad_evaluate(examples, predictions, odds if version_2 else None)
        assert ours["exact_match"] == pytest.approx(theirs["exact"], abs=1e-9)
        assert ours["f1"] == pytest.approx(theirs["f1"], abs=1e-9)
        if version_2:
            for key in ("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_exact_thresh",
                        "best_f1", "best_f1_thresh"):
                assert ours[key] == pytest.approx(theirs[key], abs=1e-9), key
