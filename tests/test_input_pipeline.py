import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_vocab

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.examples import Example
from bert_mgpu.data.input_pipeline import combine, make_dataset
from bert_mgpu.data.tokenization import FullTokenizer


def truncate_seq_pair(tokens_a, tokens_b, max_length):
    """google-research/bert's `_truncate_seq_pair`, the reference."""
    tokens_a, tokens_b = list(tokens_a), list(tokens_b)
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
    return tokens_a, tokens_b


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = os.path.join(str(tmp_path_factory.mktemp("v")), "vocab.txt")
    write_vocab(path, ["w%d" % i for i in range(60)])
    return FullTokenizer(path)


def words(n, start=0):
    return " ".join("w%d" % ((start + i) % 60) for i in range(n))


def test_pair_truncation_equals_google(tok):
    rng = np.random.default_rng(0)
    examples = [Example(str(i), words(int(a), 0), words(int(b), 30), "x")
                for i, (a, b) in enumerate(rng.integers(0, 40, size=(60, 2)))]
    ds = make_dataset(examples, tok, ["x"], 24, 7, training=False)
    rows = {}
    for features, _, index in ds:
        for ids, segs, i in zip(features["token_ids"].numpy(), features["segment_ids"].numpy(), index.numpy()):
            rows[int(i)] = (ids, segs)
    assert sorted(rows) == list(range(60))
    for i, e in enumerate(examples):
        a, b = truncate_seq_pair(tok.tokenize(e.text_a), tok.tokenize(e.text_b), 21)
        want = tok.convert_tokens_to_ids(["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"])
        ids, segs = rows[i]
        n = len(want)
        assert ids[:n].tolist() == want and not ids[n:].any()
        assert segs[:n].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)


def test_batches_padded_to_their_longest_rounded_to_8_not_max_seq_length(tok):
    examples = [Example(str(i), words(3 + (i % 20)), None, "x") for i in range(80)]
    batches = list(make_dataset(examples, tok, ["x"], 128, 8, training=False))
    widths = sorted({f["token_ids"].shape[1] for f, _, _ in batches})
    assert set(widths) <= {8, 16, 24} and 24 in widths  # lengths 5..24, each batch rounded up to 8s
    for features, _, _ in batches:
        mask = features["padding_mask"].numpy()
        longest = mask.sum(1).max()
        assert features["token_ids"].shape[1] == -(-longest // 8) * 8  # its longest example, rounded up
        assert mask.sum(1).min() > features["token_ids"].shape[1] - 8  # a bucket per width: none padded by 8+
        assert (mask == (features["token_ids"].numpy() != 0)).all()
        assert (features["segment_ids"].numpy()[~mask] == 0).all()
    (short, _, _), = make_dataset([Example("0", words(50))], tok, None, 30, 4, training=False)
    assert short["token_ids"].shape == (1, 30)  # never past max_seq_length


def test_single_sentence_truncated_to_max_seq_length(tok):
    (features, _, _), = make_dataset([Example("0", words(50))], tok, None, 16, 4, training=False)
    ids = features["token_ids"].numpy()[0]
    assert len(ids) == 16 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    assert ids[1:-1].tolist() == tok.convert_tokens_to_ids(tok.tokenize(words(14)))


def test_training_batches_are_full_and_labels_mapped(tok):
    examples = [Example(str(i), words(1 + i % 9), None, "ab"[i % 2]) for i in range(30)]
    ds = make_dataset(examples, tok, ["a", "b"], 32, 8, training=True, seed=1)
    seen = [(f["token_ids"].shape[0], label.numpy()) for f, label, _ in ds.take(12)]
    assert all(n == 8 for n, _ in seen)
    assert set(np.concatenate([lab for _, lab in seen]).tolist()) == {0, 1}


def test_unknown_label_and_empty_set(tok):
    with pytest.raises(UserError, match="example train-3 has label 'c', not one of a, b"):
        make_dataset([Example("train-3", "w1", None, "c")], tok, ["a", "b"], 8, 2, True, source="train")
    with pytest.raises(UserError, match="dev: no examples"):
        make_dataset([], tok, ["a"], 8, 2, False, source="dev")


def test_evaluation_and_training_inputs_agree_and_evaluation_is_sorted(tok, monkeypatch):
    """Evaluation tokenizes the set up front (a traced function, kept per tokenizer) and sorts it; training
    tokenizes inside tf.data. Both must give each example the same ids, segments, label and mask."""
    import bert_mgpu.data.input_pipeline as ip

    monkeypatch.setattr(ip, "CHUNK", 7)  # several tokenizer calls
    rng = np.random.default_rng(1)
    examples = [Example(str(i), words(int(a), i), words(int(b), 2 * i) if i % 3 else "", "ab"[i % 2])
                for i, (a, b) in enumerate(rng.integers(0, 30, size=(45, 2)))]

    def rows(ds, batches=None):
        out, widths = {}, []
        for features, label, index in (ds if batches is None else ds.take(batches)):
            mask = features["padding_mask"].numpy()
            widths.append((mask.sum(1).min(), mask.sum(1).max()))
            for ids, segs, m, y, i in zip(features["token_ids"].numpy(), features["segment_ids"].numpy(), mask,
                                          label.numpy(), index.numpy()):
                out[int(i)] = (ids[m].tolist(), segs[m].tolist(), int(y), int(m.sum()))
        return out, widths

    evaluation, widths = rows(make_dataset(examples, tok, ["a", "b"], 40, 6, training=False))
    assert sorted(evaluation) == list(range(45))
    assert widths == sorted(widths)  # shortest first, and no two batches' lengths overlap
    assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(widths, widths[1:]))
    training, _ = rows(make_dataset(examples, tok, ["a", "b"], 40, 6, training=True, seed=0), batches=30)
    assert len(training) > 30 and all(training[i] == evaluation[i] for i in training)
    assert evaluation[3][2] == 1 and evaluation[4][2] == 0


def test_padded_rows_keep_the_shapes_of_a_pass_to_short_lists_and_every_example_once(tok):
    """200 examples of 1-60 words, 2 towers x 16 rows, rows padded to multiples of 2 x 8: each batch is
    (rows in {16, 32}) x (width in multiples of 8), and the filler rows (index -1) are [CLS] alone."""
    rng = np.random.default_rng(4)
    examples = [Example(str(i), words(int(n), i), None, "ab"[i % 2]) for i, n in enumerate(rng.integers(1, 61, 200))]
    plain = list(make_dataset(examples, tok, ["a", "b"], 64, 32, training=False))
    padded = list(make_dataset(examples, tok, ["a", "b"], 64, 32, training=False, rows_multiple=16))
    shapes = {tuple(f["token_ids"].shape) for f, _, _ in padded}
    assert {r for r, _ in shapes} <= {16, 32} and {w % 8 for _, w in shapes} == {0}, shapes
    assert any(f["token_ids"].shape[0] % 16 for f, _, _ in plain)  # without: rows of any count
    index = np.concatenate([i.numpy() for _, _, i in padded])
    assert sorted(index[index >= 0].tolist()) == list(range(200))
    for features, label, i in padded:
        filler = i.numpy() < 0
        assert (label.numpy()[filler] == -1).all()
        assert (features["padding_mask"].numpy()[filler].sum(1) == 1).all()
        assert (features["token_ids"].numpy()[filler, 0] == tok.cls_id).all()


@pytest.mark.parametrize("training", [False, True])
def test_single_texts_among_pairs_are_encoded_as_they_are_alone(tok, training):
    """One pair in a set made every single text a pair with an empty second text (an extra [SEP]):
    each row is now encoded by its own kind, in evaluation and prediction as in training."""
    mixed = [Example("s0", words(3), label="a"), Example("p1", words(4, 5), words(2, 9), label="b"),
             Example("s2", words(5, 3), label="a"), Example("p3", words(2), "", label="b")]

    def rows(examples, batches):
        """{example index: its token ids} over the first `batches` batches (of one example each)."""
        ds = make_dataset(examples, tok, ["a", "b"], 32, 1, training=training, seed=0)
        return {int(i[0]): [int(t) for t in f["token_ids"].numpy()[0] if t != tok.pad_id]
                for f, _, i in ds.take(batches)}

    together = rows(mixed, 20)
    alone = {i: rows([e], 1)[0] for i, e in enumerate(mixed)}
    assert together == alone
    sep = tok.sep_id
    assert [row.count(sep) for _, row in sorted(together.items())] == [1, 2, 1, 2]


def kept(tokens, room, truncation):
    """The reference for `--truncation`: which of a segment's pieces stay when `room` of them may."""
    if truncation == "head":
        return tokens[:room]
    head = room * 128 // 510 if truncation == "head+tail" else 0  # Sun et al.'s 128 of 510
    return tokens[:head] + tokens[len(tokens) - (room - head):]


def test_training_batches_follow_the_shuffled_order_unless_length_buckets_are_asked(tok):
    """Where length goes with the label (long texts "a", short ones "b"), buckets give single-label batches;
    the default takes each epoch's shuffled order as it comes: every example once an epoch, mixed batches,
    each padded to its own longest row rounded up to 8, and the same batches again from the same seed."""
    examples = [Example(str(i), words(3 if i % 2 else 20, i), None, "ab"[i % 2]) for i in range(64)]

    def epoch(buckets, seed=5):
        ds = make_dataset(examples, tok, ["a", "b"], 32, 8, training=True, seed=seed, buckets=buckets)
        return [(f["token_ids"].numpy(), f["padding_mask"].numpy(), label.numpy(), index.numpy())
                for f, label, index in ds.take(8)]

    batches = epoch(buckets=False)
    assert sorted(np.concatenate([index for *_, index in batches]).tolist()) == list(range(64))
    assert sum(len(set(label.tolist())) == 2 for _, _, label, _ in batches) >= 6  # P(one label) = 2 x 0.5^8
    for ids, mask, label, index in batches:
        assert ids.shape == (8, -(-mask.sum(1).max() // 8) * 8)
        np.testing.assert_array_equal(label, index % 2)  # "b" (1) for the odd, short ones
        np.testing.assert_array_equal(mask.sum(1), np.where(index % 2, 5, 22))  # [CLS] + words + [SEP]
    again = epoch(buckets=False)
    assert all((a[0] == b[0]).all() and (a[3] == b[3]).all() for a, b in zip(batches, again))
    assert [b[3].tolist() for b in epoch(buckets=False, seed=6)] != [b[3].tolist() for b in batches]
    bucketed = epoch(buckets=True)
    assert all(len(set(label.tolist())) == 1 for _, _, label, _ in bucketed)
    assert {ids.shape[1] for ids, *_ in bucketed} == {8, 24}


@pytest.mark.parametrize("truncation", ["tail", "head+tail"])
@pytest.mark.parametrize("training", [False, True])
def test_truncation_keeps_the_pieces_it_names_with_google_bert_counts(tok, truncation, training):
    rng = np.random.default_rng(1)
    sizes = rng.integers(0, 90, size=(48, 2))
    examples = [Example(str(i), words(int(a), i), words(int(b), 30 + i) if i % 3 else None, "x")
                for i, (a, b) in enumerate(sizes)]  # singles among pairs, short ones and ones far too long
    ds = make_dataset(examples, tok, ["x"], 64, 8, training=training, seed=0, truncation=truncation)
    rows = {}
    for features, _, index in (ds.take(40) if training else ds):
        for ids, i in zip(features["token_ids"].numpy(), index.numpy()):
            rows[int(i)] = ids[ids != 0].tolist()
    # 40 training batches of 8 from 48 examples: nearly every one seen.
    assert len(rows) >= 44 if training else sorted(rows) == list(range(48))
    for i, ids in rows.items():
        e = examples[i]
        a, b = tok.tokenize(e.text_a), tok.tokenize(e.text_b) if e.text_b is not None else None
        if b is None:
            want = ["[CLS]"] + kept(a, min(len(a), 62), truncation) + ["[SEP]"]
        else:
            room_a, room_b = map(len, truncate_seq_pair(a, b, 61))  # how many: google-bert's rule
            want = ["[CLS]"] + kept(a, room_a, truncation) + ["[SEP]"] + kept(b, room_b, truncation) + ["[SEP]"]
        assert ids == tok.convert_tokens_to_ids(want), (i, truncation)
    long_single = next(i for i in rows if examples[i].text_b is None and sizes[i][0] > 62)
    assert rows[long_single][-2] == tok.convert_tokens_to_ids(tok.tokenize(examples[long_single].text_a))[-1]


def test_truncation_must_be_one_it_knows():
    from bert_mgpu.data.input_pipeline import check_truncation

    with pytest.raises(UserError, match=r"--truncation=middle: one of head, tail, head\+tail"):
        check_truncation("middle")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_combine_gives_tf_texts_combined_segments_without_a_transpose(dtype):
    import tensorflow_text as tf_text

    rng = np.random.default_rng(3)
    for k in (1, 2, 3):
        for n in (0, 1, 5):
            segments = [tf.ragged.constant([list(rng.integers(5, 99, rng.integers(0, 4))) for _ in range(n)],
                                           dtype=dtype, ragged_rank=1) for _ in range(k)]
            ours, theirs = combine(segments, 101, 102), tf_text.combine_segments(segments, 101, 102)
            for a, b in zip(ours, theirs):
                assert (a.dtype, a.row_splits.dtype, a.to_list()) == (b.dtype, b.row_splits.dtype, b.to_list())
    graph = tf.function(lambda a, b: combine([a, b], 101, 102)).get_concrete_function(
        tf.RaggedTensorSpec([None, None], tf.int64), tf.RaggedTensorSpec([None, None], tf.int64)).graph
    assert not [op for op in graph.get_operations() if op.type == "Transpose"]
