"""SQuAD's windows and answers: run_squad's doc spans and most-context rule, answer labels, the context's own
characters back, and the n-best answers equal to transformers 4.46's port of run_squad's write_predictions
on windows made to exercise max context, n-best across windows and null answers."""

import json
import types

import numpy as np
import pytest

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.squad import Question, metric_for, read_squad
from bert_mgpu.data.squad_input import best_answers, check_lengths, make_windows, span_dataset
from bert_mgpu.data.tokenization import FullTokenizer

WORDS = ("the a film good bad plot actor story is was of to who what where paris denver broncos cafe new york "
         "won game in 1998 s ##s ##ed 中 国 北 京 人 在").split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?", "(", ")", "'"]
                              + list(WORDS)) + "\n", encoding="utf-8")
    return FullTokenizer(str(path), True)


def _context(rng, n):
    pool = ["the", "film", "good", "plot", "Actors", "story,", "was", "(1998)", "Café", "New", "York", "中国人",
            "北京", "won!", "Ŋ", "game", "Denver's"]
    return " ".join(str(w) for w in rng.choice(pool, n))


def test_windows_cover_the_context_doc_stride_apart_each_piece_owned_where_it_has_most_context(tokenizer):
    rng = np.random.default_rng(1)
    context = _context(rng, 60)
    q = Question("q", "who won the game in denver ? who won the game", context, [])
    windows, cut = make_windows([q], tokenizer, max_seq_length=24, max_query_length=5, doc_stride=6)
    pieces = cut[context]
    room = 24 - 5 - 3
    assert [w.first for w in windows] == list(range(0, 6 * len(windows), 6))
    assert windows[-1].last == len(pieces.ids) and all(w.last - w.first <= room for w in windows)
    for w in windows:
        assert len(w.token_ids) <= 24 and w.token_ids[:7] == [tokenizer.cls_id] + tokenizer.convert_tokens_to_ids(
            ["who", "won", "the", "game", "in"]) + [tokenizer.sep_id]
        assert w.segment_ids == [0] * 7 + [1] * (len(w.token_ids) - 7) and w.offset == 7
    for g in range(len(pieces.ids)):  # google-bert's _check_is_max_context, written out
        holders = [(n, w) for n, w in enumerate(windows) if w.first <= g < w.last]
        scores = [min(g - w.first, w.last - 1 - g) + 0.01 * (w.last - w.first) for _, w in holders]
        best = holders[int(np.argmax(scores))][0]
        assert [n for n, w in holders if w.owned[g - w.first]] == [best]


def test_labels_point_at_the_answer_in_the_windows_that_hold_it_whole_and_else_at_cls(tokenizer):
    context = "the film was good . the plot was bad . " * 6 + "Denver Broncos won the game in 1998 ."
    start = context.index("Denver Broncos")
    q = Question("q", "who won", context, [("Denver Broncos", start)])
    windows, cut = make_windows([q], tokenizer, max_seq_length=20, max_query_length=8, doc_stride=5)
    holding = [w for w in windows if w.start]
    assert holding and all(w.start == w.end - 1 for w in holding)
    for w in holding:  # the labels give the answer's characters back
        g0, g1 = w.first + w.start - w.offset, w.first + w.end - w.offset
        assert context[cut[context].starts[g0]:cut[context].ends[g1]] == "Denver Broncos"
    assert all(w.start == w.end == 0 for w in windows if w not in holding)
    features, labels, index = next(iter(span_dataset(windows, tokenizer, 20, 64, training=False)))
    assert sorted(map(tuple, labels.numpy()[np.argsort(index.numpy())])) == sorted((w.start, w.end) for w in windows)


def test_each_piece_keeps_the_characters_it_came_from_whatever_the_tokenizer_changed(tokenizer):
    context = "Café (1998) won!  中国人 Ŋ Actors"
    _, cut = make_windows([Question("q", "who", context, [])], tokenizer, 40, 4, 8)
    pieces = cut[context]
    texts = [context[s:e] for s, e in zip(pieces.starts, pieces.ends)]
    # Lower-casing and accents undone; ## pieces their own characters; an [UNK] word (Ŋ) whole.
    assert texts == ["Café", "(", "1998", ")", "won", "!", "中", "国", "人", "Ŋ", "Actor", "s"]


def _reference_inputs(questions, windows, cut, logits, tokenizer):
    """transformers' write_predictions port takes google-bert's structures: whitespace doc tokens, each
    window's tokens, token_to_orig_map and token_is_max_context."""
    examples, features, results = [], [], []
    for n, q in enumerate(questions):
        words = q.context.split()
        ends = np.cumsum([len(w) for w in words]) + np.arange(len(words))  # a word's end, one space between
        examples.append(types.SimpleNamespace(qas_id=q.qid, doc_tokens=words))
        for k, w in enumerate(windows):
            if w.question != n:
                continue
            to_word, is_max = {}, {}
            for p in range(w.offset, w.offset + w.last - w.first):
                char = cut[q.context].starts[w.first + p - w.offset]
                to_word[p] = int(np.searchsorted(ends, char, side="right"))
                is_max[p] = bool(w.owned[p - w.offset])
            uid = len(features)
            features.append(types.SimpleNamespace(example_index=n, unique_id=uid, token_to_orig_map=to_word,
                                                  token_is_max_context=is_max,
                                                  tokens=[tokenizer.vocab[i] for i in w.token_ids]))
            size = len(w.token_ids)
            results.append(types.SimpleNamespace(unique_id=uid, start_logits=[float(x) for x in logits[k, :size, 0]],
                                                 end_logits=[float(x) for x in logits[k, :size, 1]]))
    return examples, features, results


@pytest.mark.parametrize("version_2", [False, True], ids=["v1", "v2"])
def test_answers_equal_run_squads_write_predictions_on_random_scores(tokenizer, squad_reference, version_2, tmp_path):
    rng = np.random.default_rng(7 + version_2)
    pool = ["the", "film", "good", "plot", "Actors", "story,", "was", "(1998)", "Café", "New", "York", "中国人",
            "北京", "won!", "game", "Denver's"]  # no [UNK] word: there run_squad gives back whole words
    questions = [Question(f"q{i}", "who won the game", " ".join(rng.choice(pool, int(rng.integers(3, 40)))), [])
                 for i in range(40)]
    windows, cut = make_windows(questions, tokenizer, max_seq_length=24, max_query_length=6, doc_stride=5)
    logits = rng.normal(0, 2, (len(windows), 24, 2))
    logits[rng.random(len(windows)) < 0.2, 0, :] += 6  # strong null scores in some windows
    found = best_answers(questions, windows, logits, cut, n_best_size=6, max_answer_length=5,
                         version_2_with_negative=version_2, null_score_diff_threshold=0.5)
    shim = types.SimpleNamespace(convert_tokens_to_string=lambda t: " ".join(t).replace(" ##", "").replace("##", ""))
    paths = [str(tmp_path / n) for n in ("p.json", "n.json", "o.json")]
    predictions = squad_reference.compute_predictions_logits(
        *_reference_inputs(questions, windows, cut, logits, tokenizer), 6, 5, True, *paths, False, version_2, 0.5,
        shim)
    assert found.predictions == dict(predictions)
    theirs = json.load(open(paths[1]))
    for q in questions:
        ours = found.nbest[q.qid]
        if version_2 and [k["text"] for k in ours] == [""]:  # their port adds a nonce "empty" before a lone null
            continue
        assert [k["text"] for k in ours] == [k["text"] for k in theirs[q.qid]]
        assert [k["probability"] for k in ours] == pytest.approx([k["probability"] for k in theirs[q.qid]], abs=1e-9)
    if version_2:
        assert found.null_odds == pytest.approx(json.load(open(paths[2])), abs=1e-9)
        assert "" in found.predictions.values() and any(found.predictions.values())


def test_lengths_that_leave_no_room_or_windows_that_do_not_overlap_are_one_line():
    with pytest.raises(UserError, match="--max_query_length=64: must be at least 1 and leave room"):
        check_lengths(64, 64, 10)
    with pytest.raises(UserError, match="--doc_stride=128: must be above 0 and below the 53 pieces"):
        check_lengths(120, 64, 128)


def test_read_squad_places_answers_warns_of_lost_ones_and_names_file_and_line(tmp_path, caplog):
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Denver Broncos won in 1998.", "qas": [
        {"id": "a", "question": "who won?", "answers": [{"text": "Denver Broncos", "answer_start": 0}]},
        {"id": "b", "question": "when?", "answers": [{"text": "1998", "answer_start": 21}]},  # one off
        {"id": "c", "question": "what?", "answers": [{"text": "Paris", "answer_start": 3}]}]}]}]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data, indent=1))
    questions, v2 = read_squad(str(path), training=True)
    assert not v2 and [q.qid for q in questions] == ["a", "b"] and questions[1].answer == (22, 26)
    assert "1 answers are not at their answer_start" in caplog.text and ": c" in caplog.text
    assert metric_for(questions) == "squad"
    with pytest.raises(UserError, match="is SQuAD v1 data"):
        read_squad(str(path), version_2_with_negative=True)
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [\n{"paragraphs": [\n}]}')
    with pytest.raises(UserError, match=r"bad.json:3: not JSON"):
        read_squad(str(bad))
    data["data"][0]["paragraphs"][0]["qas"][2]["answers"][0]["answer_start"] = 25
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(UserError, match=r"train.json:\d+: question c's answer ends at character 30, past the end"):
        read_squad(str(path))


def test_chinese_contexts_are_read_a_character_a_piece_and_scored_by_cmrc_rules(tokenizer, tmp_path):
    """CMRC 2018 and DRCD: no spaces in the context; each character its own piece and offset; the metric is
    told from the text."""
    context = "北京人在中国。"
    data = {"version": "v1.0", "data": [{"paragraphs": [{"id": "p", "context": context, "qas": [
        {"id": "c1", "question": "谁在中国？", "answers": [{"text": "北京人", "answer_start": 0}]}]}]}]}
    path = tmp_path / "cmrc2018_dev.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    questions, _ = read_squad(str(path))
    assert metric_for(questions) == "cmrc"
    windows, cut = make_windows(questions, tokenizer, 32, 8, 8)
    pieces = cut[context]
    assert [context[s:e] for s, e in zip(pieces.starts, pieces.ends)] == list(context)
    assert (windows[0].start, windows[0].end) == (windows[0].offset, windows[0].offset + 2)  # 北京人
