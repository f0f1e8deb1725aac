"""Tagged sentences to windows: a label on each word's first WordPiece, long sentences in strided windows
where each word is predicted once, from the window where it has the most context."""

import numpy as np
import pytest
from conftest import write_vocab

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.tagged import Sentence
from bert_mgpu.data.tagging_input import IGNORED, make_windows, window_arrays, word_predictions
from bert_mgpu.data.tokenization import FullTokenizer

LABELS = ["O", "B-PER", "I-PER", "B-LOC"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    write_vocab(str(path), ["the", "movie", "good", "##s", "film", "love"])
    return FullTokenizer(str(path))


def test_labels_sit_on_first_pieces_and_a_word_without_pieces_stands_as_unk(tokenizer):
    sentence = Sentence("t-0", ["The", "goods", "\x07", "film"], ["B-PER", "I-PER", "O", "B-LOC"], 1)
    (window,) = make_windows([sentence], tokenizer, LABELS, max_seq_length=16)
    pieces = [tokenizer.vocab[i] for i in window.token_ids]
    assert pieces == ["[CLS]", "the", "good", "##s", "[UNK]", "film", "[SEP]"]
    assert window.labels == [IGNORED, 1, 2, IGNORED, 0, 3, IGNORED]  # "##s" carries no label
    assert window.words == [-1, 0, 1, -1, 2, 3, -1] and window.owned == {0, 1, 2, 3}
    features, labels = window_arrays([window], 9)
    assert features["token_ids"][0].tolist() == window.token_ids + [0, 0]
    assert features["padding_mask"][0].tolist() == [True] * 7 + [False] * 2
    assert labels[0].tolist() == window.labels + [IGNORED, IGNORED]


def test_a_long_sentence_becomes_overlapping_windows_and_each_word_is_predicted_once(tokenizer):
    rng = np.random.default_rng(0)
    words = [str(rng.choice(["the", "movie", "goods", "film", "love"])) for _ in range(40)]
    tags = [str(rng.choice(LABELS)) for _ in words]
    sentences = [Sentence("t-0", ["love"], ["O"], 1), Sentence("t-1", words, tags, 2)]
    wins = make_windows(sentences, tokenizer, LABELS, max_seq_length=12, doc_stride=4)
    long = [w for w in wins if w.sentence == 1]
    pieces = sum(2 if w == "goods" else 1 for w in words)
    assert len(long) == 1 + -(-(pieces - 10) // 4) and all(len(w.token_ids) <= 12 for w in long)
    owned = [k for w in long for k in w.owned]
    assert sorted(owned) == list(range(40))  # every word, once
    def score(window, k):  # run_squad's: the context on the shorter side, then the longer window
        p = window.words.index(k)
        return min(p - 1, len(window.words) - 2 - p) + 0.01 * (len(window.words) - 2)

    for w_index, w in enumerate(long):  # the owner has the best score of every window holding the word, checked
        for k in w.owned:  # by brute force; a tie goes to the first
            for other_index, other in enumerate(long):
                if other_index != w_index and k in other.words:
                    assert score(other, k) < score(w, k) or (score(other, k) == score(w, k) and
                                                             other_index > w_index), (k, w_index, other_index)
    # Logits that are right only where a window owns the word, and wrong elsewhere, give every tag right.
    logits = np.zeros((len(wins), 12, len(LABELS)), np.float32)
    for i, w in enumerate(wins):
        truth = [t for s in sentences if s is sentences[w.sentence] for t in s.tags]
        for position, k in enumerate(w.words):
            if k >= 0:
                right = LABELS.index(truth[k])
                logits[i, position, right if k in w.owned else (right + 1) % len(LABELS)] = 1.0
    got = word_predictions(wins, logits, [len(s.tokens) for s in sentences])
    assert [LABELS[i] for i in got[1]] == tags and got[0].tolist() == [0]


def test_bad_strides_and_tags_unseen_in_training(tokenizer):
    s = [Sentence("dev-3", ["the", "film"], ["O", "B-ORG"], 5)]
    with pytest.raises(UserError, match=r"--doc_stride=10: must be above 0 and below the 10 pieces a window holds"):
        make_windows(s, tokenizer, LABELS, max_seq_length=12, doc_stride=10)
    with pytest.raises(UserError, match=r"dev-3: tag 'B-ORG' is not one of the training tags \(O, B-PER"):
        make_windows(s, tokenizer, LABELS, max_seq_length=12)
    untagged = make_windows([Sentence("test-0", ["the"], None, 1)], tokenizer, LABELS, max_seq_length=12)
    assert untagged[0].labels == [IGNORED] * 3


EDGE_TEXTS = ["John lives in New-York, (really)!", "张三在北京工作。", "  tabs\tand\u3000ideographic\xa0nbsp ",
              "Ünïcödé ÀÇÇÉNTS … “quotes” — dashes", "x", "", "1984: 12.5% of $3,000",
              "e\u0301t\u00e9 \x1fctrl\x85 end", "a—b…c", "日本語とＡＢＣ１２３"]


def test_raw_text_is_cut_into_words_as_google_berts_basic_tokenizer_cuts_it_in_python_and_in_the_graph():
    """split_words (Python, for predict) and split_words_tf (the SavedModel's ops) give the same words and
    offsets: white space apart, punctuation and each CJK character alone."""
    import tensorflow as tf

    from bert_mgpu.data.tagging_input import split_words, split_words_tf

    assert [w for w, _, _ in split_words("张三在北京工作。New-York, ok")] == [
        "张", "三", "在", "北", "京", "工", "作", "。", "New", "-", "York", ",", "ok"]
    assert split_words(" a  bc ") == [("a", 1, 2), ("bc", 4, 6)]
    words, starts, ends = split_words_tf(tf.constant(EDGE_TEXTS))
    for i, text in enumerate(EDGE_TEXTS):
        data = text.encode("utf-8")
        graph = [(w.decode(), len(data[:a].decode()), len(data[:b].decode()))
                 for w, a, b in zip(words[i].numpy(), starts[i].numpy(), ends[i].numpy())]
        assert graph == split_words(text), text
