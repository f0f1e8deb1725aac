"""Whole-word masking of Chinese (jieba, pre-segmented text, transformers' reference files), n-grams and spans,
in create_pretraining_data's records and in dynamic masking."""

import json
import logging
import os
import random
import sys

import jieba
import numpy as np
import pytest
import tensorflow as tf
from conftest import WORDS, run_script, write_vocab

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import masking, pretraining_input, pretraining_records, word_segments
from bert_mgpu.data.masking import MaskPlan
from bert_mgpu.data.tokenization import FullTokenizer

ISSUE = "使用语言模型来预测下一个词"
# Sentences of our own; every two characters that jieba puts in one word here are never split by it elsewhere.
SENTENCES = [ISSUE, "我们今天研究中文语言模型", "学生喜欢预测明天的天气", "数据科学需要很多数据", "北京的天气非常好",
             "我们使用模型来研究数据", "今天学生在大学学习科学"]
jieba.setLogLevel(logging.WARNING)
WORDS_OF = {s: [w for w, _, _ in jieba.Tokenizer().tokenize(s)] for s in SENTENCES}
INSIDE = {w[k:k + 2] for ws in WORDS_OF.values() for w in ws for k in range(len(w) - 1)}  # pairs within a word
ACROSS = {a[-1] + b[0] for ws in WORDS_OF.values() for a, b in zip(ws, ws[1:])}


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    d = tmp_path_factory.mktemp("zh")
    chars = sorted({c for s in SENTENCES for c in s})
    write_vocab(str(d / "vocab.txt"), chars + list(WORDS))
    rng = random.Random(0)
    documents = [[rng.choice(SENTENCES) for _ in range(rng.randint(2, 6))] for _ in range(60)]
    (d / "corpus.txt").write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    (d / "segmented.txt").write_text("\n\n".join("\n".join(" ".join(WORDS_OF[s]) for s in doc) for doc in documents)
                                     + "\n", encoding="utf-8")
    # transformers' run_chinese_ref.py: per non-blank line, the positions ([CLS] = 0) of characters that
    # continue a word.
    refs = [[1 + k for k in range(len(s)) if k not in _word_firsts(s)] for doc in documents for s in doc]
    (d / "ref.txt").write_text("\n".join(json.dumps(r) for r in refs) + "\n", encoding="utf-8")
    return d, FullTokenizer(str(d / "vocab.txt"))


def _word_firsts(sentence):
    firsts, at = set(), 0
    for w in WORDS_OF[sentence]:
        firsts.add(at)
        at += len(w)
    return firsts


def test_the_words_jieba_finds_start_where_it_says_and_the_ids_do_not_change(zh):
    assert INSIDE.isdisjoint(ACROSS)  # the corpus lets a test tell a split word from two words
    _, tok = zh
    assert {"语言", "模型", "预测"} <= set(WORDS_OF[ISSUE])
    lines = tf.constant([ISSUE, "", "BERT模型 un.known 数据\x00科学", "使用 语言 模型"])
    for name in ("jieba", "pretokenized"):
        ids, starts = word_segments.tokenize_with_word_starts(tok, lines, word_segments.segmenter(name))
        assert ids.to_list() == tok(lines).to_list()  # the same tokens as without a segmenter
        starts = starts.to_list()
        assert starts[1] == [] and starts[3] == [True, False, True, False, True, False]
        if name == "jieba":
            assert [i for i, s in enumerate(starts[0]) if s] == sorted(_word_firsts(ISSUE))
    # A line with a NUL gets jieba's words as it would with a space there (tf-text's splitter used to stop at
    # the NUL, and the line fell back to google-bert's words, every token a start): 数据 and 科学 are whole.
    _, starts = word_segments.tokenize_with_word_starts(tok, lines[2:3], word_segments.segmenter("jieba"))
    _, spaced = word_segments.tokenize_with_word_starts(tok, tf.constant(["BERT模型 un.known 数据 科学"]),
                                                        word_segments.segmenter("jieba"))
    assert starts.to_list() == spaced.to_list() and starts.to_list()[0][-4:] == [True, False, True, False]


def _check_words(tok, ids, masked):
    """Every pair of neighbouring characters inside one jieba word is masked together; -> words masked."""
    chars = [tok.vocab[i] for i in ids]
    whole = 0
    for i in range(len(chars) - 1):
        pair = chars[i] + chars[i + 1]
        if pair in INSIDE:
            assert (i in masked) == (i + 1 in masked), (pair, "".join(chars), sorted(masked))
            whole += i in masked
    return whole


def _records(zh, name, text="corpus.txt", **cfg):
    d, tok = zh
    path = str(d / f"{name}.tfrecord")
    pretraining_records.create_pretraining_data(
        [str(d / text)], [path], tok, pretraining_records.MaskingConfig(max_seq_length=48, dupe_factor=3, **cfg), 7)
    out = []
    for record in tf.data.TFRecordDataset(path):
        f = tf.train.Example.FromString(record.numpy()).features.feature
        ids = np.array(f["input_ids"].int64_list.value)
        k = int(sum(f["masked_lm_weights"].float_list.value))
        positions = np.array(f["masked_lm_positions"].int64_list.value[:k])
        ids[positions] = f["masked_lm_ids"].int64_list.value[:k]
        out.append((ids[:int(sum(f["input_mask"].int64_list.value))].tolist(), set(positions.tolist())))
    return path, out


def test_records_mask_jieba_words_whole_and_pretokenized_and_ref_files_give_the_same_bytes(zh, caplog):
    d, tok = zh
    path, instances = _records(zh, "jieba", do_whole_word_mask=True, word_segmenter="jieba")
    assert sum(_check_words(tok, ids, masked) for ids, masked in instances) > 100
    # The same words from the text segmented beforehand, or from a reference file: the same records, byte
    # for byte (same ids, same words, same seed).
    same = [_records(zh, "pre", "segmented.txt", do_whole_word_mask=True, word_segmenter="pretokenized")[0],
            _records(zh, "ref", do_whole_word_mask=True, ref_files=(str(d / "ref.txt"),))[0]]
    for other in same:
        assert open(other, "rb").read() == open(path, "rb").read()
    # google-bert's whole-word masking alone splits Chinese words (no ##), and says so once.
    word_segments._warned = False
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        _, plain = _records(zh, "plain", do_whole_word_mask=True)
    assert [r.getMessage().count("--word_segmenter=jieba") for r in caplog.records] == [1]
    with pytest.raises(AssertionError):
        for ids, masked in plain:
            _check_words(tok, ids, masked)


def test_dynamic_masking_masks_jieba_words_whole_and_the_same_on_resume(zh, caplog):
    d, tok = zh
    plan = MaskPlan(whole_word=True)
    word_segments._warned = False
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        pretraining_input.PretrainingData("text", [str(d / "corpus.txt")], tok, plan=plan)  # no segmenter: said
        pretraining_input.PretrainingData("text", [str(d / "corpus.txt")], tok, plan=plan, word_segmenter="jieba")
    assert [r.getMessage().count("masks single characters") for r in caplog.records] == [1]

    def stream(start=0, segmenter="jieba", n=40, refs=()):
        ds = pretraining_input.text_dataset([str(d / "corpus.txt")], tok, 1, 48, 12, training=True, seed=3,
                                            shuffle_buffer=1, start=start, plan=plan, word_segmenter=segmenter,
                                            ref_files=refs)
        return [(f["token_ids"][0].numpy(), f["mask_positions"][0].numpy(), lab["masked_lm_ids"][0].numpy(),
                 lab["masked_lm_weights"][0].numpy()) for f, lab in ds.take(n)]

    first = stream()
    whole = 0
    for ids, pos, labels, weights in first:
        k = int(weights.sum())
        assert 0 < k <= 12 and (pos[:k] > 0).all() and (pos[:k] < 47).all()  # never [CLS] or the last [SEP]
        original = ids.copy()
        original[pos[:k]] = labels[:k]
        whole += _check_words(tok, original.tolist(), set(pos[:k].tolist()))
    assert whole > 40
    again = stream(start=17, n=5)
    for a, b in zip(first[17:22], again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    # The same words from a reference file: the same masks, example for example.
    for a, b in zip(first, stream(segmenter="none", refs=(str(d / "ref.txt"),))):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_ngrams_are_runs_of_words_drawn_as_one_over_n_and_never_cross_sep():
    rng = random.Random(0)
    tokens = [2] + list(range(10, 70)) + [3] + list(range(10, 50)) + [3]
    starts = [True] * len(tokens)
    for i in range(2, len(tokens), 3):  # words of two or three tokens
        starts[i] = tokens[i] in (2, 3)
    plan = MaskPlan(whole_word=True, max_ngram_size=3)
    sizes = []
    words = masking.candidates(tokens, starts, {2, 3}, MaskPlan(whole_word=True), rng, 20)
    first_of = {w[0]: k for k, w in enumerate(words)}
    for _ in range(300):
        for gram in masking.candidates(tokens, starts, {2, 3}, plan, rng, 20):
            assert gram == list(range(gram[0], gram[-1] + 1))  # contiguous
            assert 61 not in gram  # never the [SEP]
            n = sum(p in first_of for p in gram)
            assert gram[0] in first_of and (gram[-1] + 1 in first_of or gram[-1] + 1 in (61, len(tokens) - 1))
            sizes.append(n)
    share = np.bincount(sizes, minlength=4)[1:] / len(sizes)
    # Cut where a [SEP] ends a run, a few grams come out shorter than drawn: 1/n shares, within 0.03.
    np.testing.assert_allclose(share, np.array([1, 1 / 2, 1 / 3]) / (11 / 6), atol=0.03)
    # With n = 1 and no span, google-bert's candidates: one a word.
    assert masking.candidates(tokens, starts, {2, 3}, MaskPlan(whole_word=True), rng, 20) == words


@pytest.mark.parametrize("plan", [MaskPlan(whole_word=True, span=True), MaskPlan(whole_word=True, max_ngram_size=3),
                                  MaskPlan(span=True)])
def test_in_graph_spans_and_ngrams_take_whole_words_within_the_budget(plan):
    n = 64
    ids = np.arange(100, 100 + n)
    ids[0], ids[30], ids[-1] = 2, 3, 3  # [CLS] A [SEP] B [SEP]
    starts = np.array([(i % 3 == 1) for i in range(n)])
    candidate = tf.constant(~np.isin(ids, [2, 3]))
    runs = 0
    for seed in range(40):
        pos = masking.select(candidate, tf.constant(starts), plan, tf.constant([seed, 5], tf.int64),
                             tf.constant(9)).numpy()
        assert 0 < len(pos) <= 9 and not np.isin(pos, [0, 30, n - 1]).any()
        chosen = set(pos.tolist())
        if plan.whole_word:
            for i in range(1, n - 1):  # a word's tokens together
                if not starts[i] and ids[i] not in (2, 3) and ids[i - 1] not in (2, 3):
                    assert (i in chosen) == (i - 1 in chosen)
        if plan.span:  # one stretch, within one segment
            assert pos.tolist() == list(range(pos[0], pos[-1] + 1)) and not (pos[0] < 30 < pos[-1])
        runs += len(pos)
    assert runs > 40 * 4


def test_reference_files_that_do_not_match_the_corpus_are_named_with_their_line(zh, tmp_path):
    d, tok = zh
    ref = (d / "ref.txt").read_text(encoding="utf-8").splitlines()
    cases = {
        "short": ("\n".join(ref[:5]) + "\n", f"{tmp_path}/short.txt:6: the reference file ends before"),
        "long": ("\n".join(ref + ["[2]"]) + "\n", f"{tmp_path}/long.txt:{len(ref) + 1}: the reference file has more"),
        "out": ("\n".join(ref[:3] + ["[1, 99]"] + ref[4:]) + "\n", f"{tmp_path}/out.txt:4: position 99 is outside"),
        "bad": ("\n".join(ref[:1] + ["{\"a\": 1}"] + ref[2:]) + "\n", f"{tmp_path}/bad.txt:2: expected a JSON list"),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / f"{name}.txt").write_text(text, encoding="utf-8")
        with pytest.raises(UserError) as e:
            _records(zh, name, do_whole_word_mask=True, ref_files=(str(tmp_path / f"{name}.txt"),))
        assert str(e.value).startswith(expected), str(e.value)
        with pytest.raises(UserError) as e:  # dynamic masking reads it through before any step
            pretraining_input.PretrainingData("text", [str(d / "corpus.txt")], tok,
                                              ref_files=(str(tmp_path / f"{name}.txt"),))
        assert str(e.value).startswith(expected), str(e.value)
    with pytest.raises(UserError, match=r"^--ref_file: 2 reference file\(s\) for 1 input file\(s\)"):
        pretraining_input.PretrainingData("text", [str(d / "corpus.txt")], tok, ref_files=(str(d / "ref.txt"),) * 2)
    assert not list(d.glob("short.tfrecord*"))  # nothing half-written is left


def test_a_missing_segmenter_and_contradictory_flags_say_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "jieba", None)
    with pytest.raises(UserError, match=r"^--word_segmenter=jieba: the jieba package is not installed "):
        word_segments.segmenter("jieba")
    with pytest.raises(UserError, match="pick one"):
        MaskPlan(span=True, max_ngram_size=2)


@pytest.mark.process
def test_the_scripts_take_the_flags_and_write_the_same_bytes_in_every_process(zh, tmp_path):
    d, _ = zh
    args = [f"--input_file={d / 'corpus.txt'}", f"--vocab_file={d / 'vocab.txt'}", "--max_seq_length=48",
            "--dupe_factor=2", "--word_segmenter=jieba", "--max_ngram_size=2"]
    # Two fresh interpreters: protobuf orders a map's entries by its own hash unless told to be deterministic.
    for name in ("a", "b"):
        run_script("create_pretraining_data.py", *args, f"--output_file={tmp_path / name}.tfrecord", fresh=True)
    assert (tmp_path / "a.tfrecord").read_bytes() == (tmp_path / "b.tfrecord").read_bytes()
    out = run_script("run_pretraining_mgpu.py", f"--input_file={tmp_path / 'a.tfrecord'}", "--do_train",
                     f"--output_dir={tmp_path / 'run'}", f"--vocab_file={d / 'vocab.txt'}", "--span_masking",
                     check=False)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        "run_pretraining_mgpu.py: error: --do_whole_word_mask, --word_segmenter, --ref_file, --max_ngram_size and "
        "--span_masking mask raw text (--input_format=text); records were masked when create_pretraining_data.py "
        "wrote them")
    assert os.path.exists(tmp_path / "a.tfrecord")


def test_run_pretraining_takes_reference_files_with_text_input_the_last_shards_held_out(zh, tmp_path):
    """Dynamic masking from reference files end to end: two corpus shards with a reference file each, the second
    held out for evaluation with its own; a reference file of another corpus is one line naming it."""
    from conftest import tiny_config

    d, _ = zh
    lines = (d / "corpus.txt").read_text(encoding="utf-8").split("\n\n")
    refs = (d / "ref.txt").read_text(encoding="utf-8").splitlines()
    half = len(lines) // 2
    first, second = "\n\n".join(lines[:half]) + "\n", "\n\n".join(lines[half:])
    (tmp_path / "a.txt").write_text(first, encoding="utf-8")
    (tmp_path / "b.txt").write_text(second, encoding="utf-8")
    cut = sum(1 for line in first.splitlines() if line.strip())
    (tmp_path / "a.ref").write_text("\n".join(refs[:cut]) + "\n", encoding="utf-8")
    (tmp_path / "b.ref").write_text("\n".join(refs[cut:]) + "\n", encoding="utf-8")
    config = tiny_config(len(open(d / "vocab.txt", encoding="utf-8").read().split()))
    config.to_json_file(str(tmp_path / "bert_config.json"))
    args = [f"--input_file={tmp_path}/a.txt,{tmp_path}/b.txt", "--input_format=text", "--nsp=false",
            f"--vocab_file={d / 'vocab.txt'}", f"--bert_config_file={tmp_path / 'bert_config.json'}",
            "--max_seq_length=32", "--max_predictions_per_seq=5", "--train_batch_size=8", "--num_train_steps=4",
            "--do_train", "--do_eval", "--towers_per_gpu=2", "--precision=float32"]
    out = run_script("run_pretraining_mgpu.py", *args, f"--ref_file={tmp_path}/a.ref,{tmp_path}/b.ref",
                     f"--output_dir={tmp_path / 'run'}")
    assert "pretraining stopped at step 4" in out.stdout
    results = dict(line.split(" = ") for line in (tmp_path / "run" / "eval_results.txt").read_text().splitlines())
    assert float(results["masked_lm_loss"]) > 0
    settings = json.load(open(tmp_path / "run" / "bert_mgpu.json"))["settings"]
    assert settings["masking"] == (f"whole_word=True ref_file={tmp_path}/a.ref,{tmp_path}/b.ref max_ngram_size=1 "
                                   "span=False")
    bad = run_script("run_pretraining_mgpu.py", *args, f"--ref_file={tmp_path}/b.ref,{tmp_path}/a.ref",
                     f"--output_dir={tmp_path / 'other'}", check=False)
    assert bad.returncode == 1 and "b.ref:" in bad.stderr.strip().splitlines()[-1], bad.stderr[-1500:]
