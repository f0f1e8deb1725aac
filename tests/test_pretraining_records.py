"""create_pretraining_data (google-bert's algorithm, streamed), dynamic masking, the vocabulary builder."""

import os
import re
import types

import numpy as np
import pytest
import tensorflow as tf
from conftest import WORDS, run_script, write_vocab

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import pretraining_input, pretraining_records
from bert_mgpu.data.tokenization import FullTokenizer
from bert_mgpu.parallel.cluster import Cluster

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

SUFFIXES = ["##s", "##ing", "##ly"]


def write_corpus(path, documents=20, sentences=24, seed=0):
    """Documents of several sentences; many words carry a `##` piece so whole-word masking has work."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(sentences):
                words = [w + rng.choice(["", "s", "ing", "ly"]) for w in rng.choice(WORDS, rng.integers(4, 12))]
                f.write(" ".join(words) + " .\n")
            f.write("\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_vocab(str(d / "vocab.txt"), list(WORDS) + SUFFIXES)
    return str(d), FullTokenizer(str(d / "vocab.txt")), write_corpus(str(d / "corpus.txt"))


def read_instances(paths):
    out = []
    for record in tf.data.TFRecordDataset(paths):
        f = tf.train.Example.FromString(record.numpy()).features.feature
        out.append({k: np.array(v.int64_list.value or v.float_list.value) for k, v in f.items()})
    return out


def make(corpus, name, seed=12345, **cfg):
    d, tok, text = corpus
    paths = [os.path.join(d, f"{name}-{i}.tfrecord") for i in range(2)]
    buf = cfg.pop("buf", 100)
    stats = pretraining_records.create_pretraining_data([text], paths, tok, pretraining_records.MaskingConfig(**cfg),
                                                     random_seed=seed, documents_per_buffer=buf)
    return paths, stats


def test_documents_too_short_for_next_sentence_prediction_are_said(corpus, tmp_path, caplog):
    """One-sentence documents: nearly every instance gets a random next segment, and a warning says so;
    the corpus of long documents gives about half and no warning."""
    import logging

    d, tok, _ = corpus
    short = tmp_path / "short.txt"
    short.write_text("".join(f"{' '.join(WORDS[i % 20:i % 20 + 6])} .\n\n" for i in range(60)), encoding="utf-8")
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        stats = pretraining_records.create_pretraining_data([str(short)], [str(tmp_path / "s.tfrecord")], tok,
                                                            pretraining_records.MaskingConfig(max_seq_length=64))
        share = stats["random_next"] / stats["instances"]
        assert share > 0.9 and f"{100 * share:.0f}% of the instances pair a random next segment" in caplog.text
        caplog.clear()
        _, stats = make(corpus, "nsp", max_seq_length=64, dupe_factor=2)
    assert 0.3 < stats["random_next"] / stats["instances"] < 0.6 and "random next segment" not in caplog.text


def test_same_seed_same_bytes_other_seed_other_bytes(corpus):
    a, _ = make(corpus, "a", max_seq_length=64, dupe_factor=2)
    b, _ = make(corpus, "b", max_seq_length=64, dupe_factor=2)
    c, _ = make(corpus, "c", seed=7, max_seq_length=64, dupe_factor=2)
    read = lambda ps: b"".join(open(p, "rb").read() for p in ps)  # noqa: E731
    assert read(a) == read(b)
    assert read(a) != read(c)


def test_masking_rate_replacements_and_nsp_share(corpus):
    paths, stats = make(corpus, "m", max_seq_length=64, max_predictions_per_seq=20, dupe_factor=5)
    inst = read_instances(paths)
    assert len(inst) == stats["instances"] > 300
    lengths = np.array([i["input_mask"].sum() for i in inst])
    masked = np.array([i["masked_lm_weights"].sum() for i in inst])
    assert abs(masked.sum() / lengths.sum() - 0.15) < 0.01  # round(len * 0.15) per sequence
    mask_id = corpus[1].mask_id
    replaced = np.concatenate([i["input_ids"][i["masked_lm_positions"][: int(w)]]
                               for i, w in zip(inst, masked)])
    originals = np.concatenate([i["masked_lm_ids"][: int(w)] for i, w in zip(inst, masked)])
    assert abs(np.mean(replaced == mask_id) - 0.8) < 0.03
    assert abs(np.mean(replaced == originals) - 0.1) < 0.03  # kept (plus the rare random hit)
    nsp = np.mean([i["next_sentence_labels"][0] for i in inst])
    assert 0.4 < nsp < 0.6, nsp
    # segments: [CLS] A [SEP] B [SEP] with B marked 1
    first = inst[0]
    n = int(first["input_mask"].sum())
    assert first["input_ids"][0] == corpus[1].cls_id and first["input_ids"][n - 1] == corpus[1].sep_id
    assert first["segment_ids"][n - 1] == 1 and first["segment_ids"][0] == 0


def test_whole_word_masking_masks_every_piece(corpus):
    paths, _ = make(corpus, "w", max_seq_length=64, dupe_factor=2, do_whole_word_mask=True)
    tok = corpus[1]
    cont = np.array([t.startswith("##") for t in tok.vocab])
    words_checked = 0
    for inst in read_instances(paths):
        k = int(inst["masked_lm_weights"].sum())
        ids = inst["input_ids"].copy()
        ids[inst["masked_lm_positions"][:k]] = inst["masked_lm_ids"][:k]  # the original tokens
        masked = set(inst["masked_lm_positions"][:k].tolist())
        n = int(inst["input_mask"].sum())
        words = []  # a word: a piece that is not `##...`, then its `##` pieces ([CLS]/[SEP] end words)
        for i in range(n):
            if ids[i] in (tok.cls_id, tok.sep_id):
                continue
            if cont[ids[i]] and words and i - 1 in words[-1]:
                words[-1].add(i)
            else:
                words.append({i})
        for word in words:
            if len(word) > 1:
                assert word <= masked or not (word & masked), (word, masked)
                words_checked += bool(word & masked)
    assert words_checked > 50


def test_corpus_larger_than_a_buffer_is_streamed(corpus):
    _, stats = make(corpus, "s", max_seq_length=64, dupe_factor=1, buf=6)
    assert stats["documents"] == 20 and stats["buffers"] == 4  # 6 + 6 + 6 + 2


def test_documents_come_from_a_generator(corpus):
    docs = pretraining_records.iter_documents([corpus[2]], corpus[1], lines_per_batch=4)
    first = next(docs)  # nothing past the first batches is read yet
    assert len(first) == 24 and all(first)
    assert 1 + sum(1 for _ in docs) == 20


def test_bad_text_is_named_with_its_line(tmp_path, corpus):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\n\xff\xfe broken\n")
    with pytest.raises(UserError, match=r"bad.txt:2: not UTF-8"):
        list(pretraining_records.iter_documents([str(bad)], corpus[1]))
    out = tmp_path / "out.tfrecord"
    with pytest.raises(UserError, match="no pretraining instances"):
        empty = tmp_path / "empty.txt"
        empty.write_text("\n\n")
        pretraining_records.create_pretraining_data([str(empty)], [str(out)], corpus[1])
    assert not os.listdir(tmp_path) == [] and not out.exists()


def test_records_read_back_as_model_inputs(corpus):
    paths, _ = make(corpus, "r", max_seq_length=64, dupe_factor=1)
    features, labels = next(iter(pretraining_input.record_dataset(paths, 8, 64, 20)))
    assert features["token_ids"].shape == (8, 64) and features["mask_positions"].shape == (8, 20)
    assert labels["next_sentence_labels"].shape == (8,)
    with pytest.raises(UserError, match="input_ids of length 64 but --max_seq_length=128"):
        pretraining_input.check_records(paths, 128, 20)


def test_resumed_stream_is_the_same_data(corpus):
    paths, _ = make(corpus, "q", max_seq_length=64, dupe_factor=1)
    full = list(pretraining_input.record_dataset(paths, 8, 64, 20, seed=3).take(5))
    resumed = list(pretraining_input.record_dataset(paths, 8, 64, 20, seed=3, start=3 * 8).take(2))
    for (fa, la), (fb, lb) in zip(full[3:], resumed):
        np.testing.assert_array_equal(fa["token_ids"], fb["token_ids"])
        np.testing.assert_array_equal(la["masked_lm_ids"], lb["masked_lm_ids"])


def test_dynamic_masking_new_masks_each_epoch_same_on_resume(corpus):
    _, tok, text = corpus
    data = pretraining_input.PretrainingData("text", [text], tok, max_seq_length=32, max_predictions_per_seq=8)
    n = data.count()
    assert n > 20
    ds = pretraining_input.text_dataset([text], tok, 1, 32, 8, training=True, seed=5, shuffle_buffer=1)
    stream = [(f["token_ids"][0].numpy(), f["mask_positions"][0].numpy(), lab["masked_lm_ids"][0].numpy())
              for f, lab in ds.take(n + 1)]
    # Without shuffling, element n is sequence 0 again: same original tokens, new mask.
    orig = lambda ids, pos, lab: np.put(ids, pos, lab) or ids  # noqa: E731
    np.testing.assert_array_equal(orig(*[x.copy() for x in stream[0]]), orig(*[x.copy() for x in stream[n]]))
    assert not np.array_equal(stream[0][1], stream[n][1])
    again = pretraining_input.text_dataset([text], tok, 1, 32, 8, training=True, seed=5, shuffle_buffer=1,
                                           start=n)
    f, _ = next(iter(again))
    np.testing.assert_array_equal(f["mask_positions"][0].numpy(), stream[n][1])
    # Rate: round(32 * 0.15) = 5 predictions, [CLS]/[SEP] never chosen.
    masks = np.array([s[1] for s in stream])
    assert (np.count_nonzero(masks, axis=1) == 5).all() and not np.isin(masks[:, :5], [0, 31]).any()


def test_vocabulary_builder_splits_cjk_and_keeps_specials_first(tmp_path):
    from bert_mgpu.data.vocab import build_vocab

    text = tmp_path / "mixed.txt"
    text.write_text("我爱北京天安门。\nRunning runners run, the RUNNER ran!\n\n天安门上太阳升\n" * 5, encoding="utf-8")
    vocab = build_vocab([str(text)], 80, str(tmp_path / "vocab.txt"), do_lower_case=True)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) <= 80
    tok = FullTokenizer(str(tmp_path / "vocab.txt"))
    assert tok.tokenize("天安门 北京") == ["天", "安", "门", "北", "京"]
    assert "[UNK]" not in tok.tokenize("running the runner")
    with pytest.raises(UserError, match="no such input file"):
        build_vocab([str(tmp_path / "missing.txt")], 80, str(tmp_path / "v2.txt"))



def chinese_text(path, n_chars=1500, lines=3000):
    """Lines of `n_chars` distinct ideographs drawn by a Zipf-like law (the commonest seen thousands of
    times, the rarest a few), each with a place name and English words -> the counts of its characters."""
    import collections
    import random

    rng = random.Random(0)
    chars = [chr(0x4E00 + 7 * i) for i in range(n_chars)]
    weights = [1 / (i + 1) ** 0.6 for i in range(n_chars)]
    text = "".join("".join(rng.choices(chars, weights, k=rng.randint(8, 30))) + "，江苏省 running runners ran。\n"
                   for _ in range(lines))
    path.write_text(text, encoding="utf-8")
    return collections.Counter(text)


def test_every_chinese_character_seen_min_count_times_is_a_token_of_its_own(tmp_path, caplog):
    """More than the learner's default alphabet of 1,000 characters: each seen twice (--min_count's default)
    tokenizes to itself, no `##汉` piece (a CJK character is always a word) takes room, and the vocabulary
    says truly why it is smaller than asked. keras-hub's learner with its defaults, on this text: 2,010
    tokens, 1,000 of them ## pieces, 506 characters seen 10+ times [UNK] (benchmarks/NOTES.md)."""
    import logging

    from bert_mgpu.data.tokenization import is_cjk
    from bert_mgpu.data.vocab import build_vocab

    seen = chinese_text(tmp_path / "zh.txt")
    ideographs = [c for c in seen if is_cjk(c)]
    assert len(ideographs) > 1500 and min(seen[c] for c in ideographs) >= 2  # 江苏省 besides
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        vocab = build_vocab([str(tmp_path / "zh.txt")], 4000, str(tmp_path / "vocab.txt"))
    tok = FullTokenizer(str(tmp_path / "vocab.txt"))
    assert [c for c in ideographs if tok.tokenize(c) != [c]] == []
    assert tok.tokenize("江苏省 running runners") == ["江", "苏", "省", "running", "runners"]
    assert not [t for t in vocab if t.startswith("##") and is_cjk(t[2:])]
    letters = {c for c in seen if c.isalpha() and not is_cjk(c)}
    assert {"##" + c for c in letters} <= set(vocab)  # outside CJK a character may end a word
    assert len(vocab) == len(set(vocab)) < 4000
    assert (f"the vocabulary has {len(vocab)} tokens, fewer than the 4000 asked: the text holds no more words and "
            "pieces seen at least 2 times (--min_count)") in caplog.text


def test_characters_that_do_not_fit_are_one_line_naming_the_min_count_that_fits(tmp_path):
    from bert_mgpu.data.tokenization import is_cjk
    from bert_mgpu.data.vocab import build_vocab

    seen = chinese_text(tmp_path / "zh.txt")
    with pytest.raises(UserError) as e:
        build_vocab([str(tmp_path / "zh.txt")], 1000, str(tmp_path / "vocab.txt"))
    said = str(e.value)
    count, kept = (int(w) for w in re.fullmatch(r"--vocab_size=1000: the text has \d+ characters seen at least 2 times "
                   r"\(--min_count\), \d+ tokens with their ## forms and the specials; raise --vocab_size, or "
                   r"--min_count to (\d+), which keeps (\d+) characters", said).groups())
    assert kept == sum(n >= count for c, n in seen.items() if not c.isspace()) and not (tmp_path / "vocab.txt").exists()
    vocab = build_vocab([str(tmp_path / "zh.txt")], 1000, str(tmp_path / "vocab.txt"), min_count=count)
    tok = FullTokenizer(str(tmp_path / "vocab.txt"))
    assert len(vocab) <= 1000 and all(tok.tokenize(c) == [c] for c, n in seen.items() if n >= count and is_cjk(c))
    with pytest.raises(UserError, match=r"^the text has no character seen at least 100000 times \(--min_count\); "
                                        "lower it$"):
        build_vocab([str(tmp_path / "zh.txt")], 1000, str(tmp_path / "v2.txt"), min_count=100000)


def test_a_vocabulary_smaller_than_asked_says_so(tmp_path, caplog):
    import logging

    from bert_mgpu.data.vocab import build_vocab

    text = tmp_path / "small.txt"
    text.write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    with caplog.at_level(logging.WARNING, "bert_mgpu"):
        vocab = build_vocab([str(text)], 2000, str(tmp_path / "vocab.txt"))
    assert len(vocab) < 2000
    assert f"the vocabulary has {len(vocab)} tokens, fewer than the 2000 asked" in caplog.text


def test_utf8_check_names_the_line_across_blocks_and_counts_with_replace(tmp_path, caplog):
    from bert_mgpu.data.vocab import check_utf8

    path = tmp_path / "corpus.txt"
    path.write_bytes("ünïcödé line\n".encode() * 7 + b"caf\xe9 latin-1\n" + b"fine\n" + b"\xff\n")
    for block in (5, 16, 1 << 20):  # cuts inside characters and lines, and none
        with pytest.raises(UserError, match=r"corpus.txt:8: invalid UTF-8 at byte 4 of the line"):
            check_utf8(str(path), block=block)
        with caplog.at_level("WARNING", "bert_mgpu"):
            caplog.clear()
            assert check_utf8(str(path), "replace", block=block)
        assert "replaced by U+FFFD on 2 line(s), the first at line 8" in caplog.text
    path.write_text(" \n\n\t\n")
    assert not check_utf8(str(path))


@pytest.mark.parametrize("case, expected", [
    ("empty", r"empty.txt: no text to learn a vocabulary from \(empty or blank\)"),
    ("output_is_a_directory", r"--output_file=.*/vocab_dir is a directory; give the vocab.txt file to write"),
    ("invalid_utf8", r"bad.txt:2: invalid UTF-8 at byte 5 of the line \(invalid start byte\); fix the file or "
                     r"pass --invalid_utf8=replace"),
])
def test_build_vocab_script_bad_input_is_one_line(tmp_path, case, expected):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.txt").write_bytes(b"hello world\nbad \xff byte\n")
    (tmp_path / "vocab_dir").mkdir()
    source = {"empty": "empty.txt", "invalid_utf8": "bad.txt"}.get(case, "bad.txt")
    target = tmp_path / ("vocab_dir" if case == "output_is_a_directory" else "vocab.txt")
    # The first case starts as a user does (a new interpreter, no TF_CPP_MIN_LOG_LEVEL): TensorFlow's start-up
    # lines stay hidden. The others fork from one that has TensorFlow loaded (tests/script_runner.py).
    as_a_user = case == "empty"
    proc = run_script("build_vocab.py", f"--input_file={tmp_path / source}", f"--output_file={target}",
                      "--vocab_size=50", check=False, env={"TF_CPP_MIN_LOG_LEVEL": None} if as_a_user else None,
                      fresh=as_a_user)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert re.fullmatch(f"build_vocab.py: error: ({re.escape(str(tmp_path))}/)?" + expected,
                        proc.stderr.strip().splitlines()[-1]), proc.stderr
    if as_a_user:
        assert "cuInit" not in proc.stderr and "absl::InitializeLog" not in proc.stderr
    assert not (tmp_path / "vocab.txt").exists() and os.listdir(tmp_path / "vocab_dir") == []
    if case == "invalid_utf8":
        proc = run_script("build_vocab.py", f"--input_file={tmp_path / source}", f"--output_file={target}",
                          "--vocab_size=50", "--invalid_utf8=replace", "--min_count=1")
        assert "replaced by U+FFFD on 1 line(s), the first at line 2" in proc.stderr
        assert "\ufffd" in target.read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["records", "text"])
def test_workers_rows_put_together_are_the_global_batch(corpus, kind):
    """With distribute.worker_rows each of 2 workers parses and masks only its half of every global
    batch; the halves side by side are the batch one process makes, from a resumed position too."""
    from bert_mgpu.data.pretraining_input import PretrainingData
    from bert_mgpu.parallel import distribute

    inputs = make(corpus, "rows")[0] if kind == "records" else [corpus[2]]
    data = PretrainingData(kind, inputs, corpus[1], max_seq_length=32 if kind == "text" else 128,
                           max_predictions_per_seq=20)
    whole = list(data.dataset(8, True, start=16).take(3).as_numpy_iterator())
    halves = []
    for index in range(2):
        # worker `index` of 2, as a multi-worker strategy's public cluster_resolver says
        worker = types.SimpleNamespace(cluster_resolver=Cluster({"worker": ["h1:1", "h2:2"]}, "worker", index,
                                                                "test").resolver())
        halves.append(list(data.dataset(4, True, start=16, rows=lambda ds, w=worker: distribute.worker_rows(
            ds, 8, w)).take(3).as_numpy_iterator()))
    for step in range(3):
        parts = [tf.nest.flatten(h[step]) for h in halves]
        for i, value in enumerate(tf.nest.flatten(whole[step])):
            assert len(value) == 8
            np.testing.assert_array_equal(np.concatenate([parts[0][i], parts[1][i]]), value,
                                          err_msg=f"{kind} step {step} tensor {i}")


def unmasked_sequences(dataset):
    """The sequences of a model-input dataset, their masked tokens put back: what was read, whatever the masks."""
    out = []
    for features, labels in dataset.unbatch().as_numpy_iterator():
        ids = features["token_ids"].copy()
        real = labels["masked_lm_weights"] > 0
        ids[features["mask_positions"][real]] = labels["masked_lm_ids"][real]
        out.append(tuple(ids[features["padding_mask"]]))
    return out


@pytest.mark.parametrize("kind", ["records", "text"])
def test_by_files_each_worker_reads_its_own_files_every_sequence_once_a_pass(corpus, tmp_path, kind):
    """Sharding by file: 2 workers of 5 files read 3 and 2 of them. Each worker's first pass of its
    training stream holds each of its files' sequences once; between them, every sequence of the data,
    none twice; resumed, a worker's stream goes on where it was."""
    from bert_mgpu.data.pretraining_input import PretrainingData, worker_files

    d, tok, _ = corpus
    if kind == "records":
        files = [str(tmp_path / f"shard-{i}.tfrecord") for i in range(5)]
        pretraining_records.create_pretraining_data([corpus[2]], files, tok, pretraining_records.MaskingConfig(
            max_seq_length=32, max_predictions_per_seq=5), random_seed=1, documents_per_buffer=100)
    else:
        files = [write_corpus(str(tmp_path / f"part-{i}.txt"), documents=3, sentences=6, seed=i) for i in range(5)]
    settings = dict(max_seq_length=32, max_predictions_per_seq=5)
    data = PretrainingData(kind, files, tok, **settings)
    assert [data.by_files(n) for n in (1, 2, 5, 6)] == [False, True, True, False]
    assert not PretrainingData(kind, files, tok, sharding="examples", **settings).by_files(2)
    with pytest.raises(UserError, match=r"--input_sharding=files: 5 input file\(s\) for 6 workers"):
        PretrainingData(kind, files, tok, sharding="files", **settings).by_files(6)

    everything = unmasked_sequences(data.dataset(4, training=False))
    passes = []
    for index in range(2):
        mine = worker_files(files, (index, 2))
        assert mine == files[index::2]
        own = unmasked_sequences(PretrainingData(kind, mine, tok, **settings).dataset(4, training=False))
        first_pass = unmasked_sequences(data.dataset(1, True, part=(index, 2)).take(len(own)))
        assert sorted(first_pass) == sorted(own) and len(own) > 10
        passes.extend(first_pass)
        resumed = unmasked_sequences(data.dataset(1, True, start=7, part=(index, 2)).take(len(own) - 7))
        assert resumed == first_pass[7:]
    if kind == "records":
        assert sorted(passes) == sorted(everything)
    else:  # packing runs across files: only the tokens each worker's last part-sequence holds are not read
        from collections import Counter

        body = lambda seqs: Counter(t for s in seqs for t in s[1:-1])  # noqa: E731  without [CLS] ... [SEP]
        read, whole = body(passes), body(everything)
        assert sum((whole - read).values()) < 2 * 30 and sum((read - whole).values()) < 2 * 30
        assert sum(read.values()) > 0.9 * sum(whole.values())
