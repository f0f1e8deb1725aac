"""tf.data input: examples -> tokenized, truncated batches of similar lengths, padded to their longest member.

Batches are padded only to their own longest example rounded up to a multiple of 8, not to
max_seq_length: every distinct batch width costs a trace and an XLA compile of the fused kernels, and GPU
tensor cores want multiples of 8. Pairs are truncated as google-bert's `_truncate_seq_pair` (always
shorten the longer segment), which is what tf-text's RoundRobinTrimmer computes.

Training tokenizes inside tf.data in parallel (ragged tensors, no Python per example) and batches in
shuffled order (by length only with `buckets`: `length_batches`). Evaluation and prediction tokenize the
whole set first, with one traced function kept per tokenizer, then sort it by length and cut it into
batches: a tf.data iterator instantiates its functions anew, recompiling the tokenizer's regular
expressions, which costs more than tokenizing the set.
Every element carries its input position (`index`) so evaluation and prediction put outputs
back in input order whatever the sorting, batch and tower count.
"""

import weakref

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.windows import HEAD_SHARE
from bert_mgpu.model.objectives import Classification

# Up to 128 tokens, one bucket per padded width: lengths 8k-7 .. 8k share a bucket and a width of 8k, so no
# example is padded by 8 or more; above that, buckets 32 wide. Rotten Tomatoes' batches are then 88.5% real
# tokens, against 81% with the buckets 16, 24, 32, 48, 64, ...
# Functions traced as written (no AutoGraph rewrite, which cost ~2 s a process: benchmarks/NOTES.md item 43).
_plain = tf.autograph.experimental.do_not_convert
_BOUNDARIES = tuple(range(9, 130, 8)) + tuple(range(161, 514, 32))


def examples_to_arrays(examples, label_list, source="data", encode_labels=None):
    """Python examples -> dict of numpy arrays; UserError for an empty set or a label that does not fit.
    `encode_labels(examples, label_list, source)`: the head kind's label encoding (`Objective.encode`;
    default: class ids, -1 for an example without a label)."""
    if not examples:
        raise UserError(f"{source}: no examples")
    encode_labels = encode_labels or Classification().encode
    return {
        "text_a": np.array([e.text_a for e in examples], dtype=object),
        "text_b": np.array([e.text_b or "" for e in examples], dtype=object),
        "has_b": np.array([e.text_b is not None for e in examples], dtype=bool),
        "label": encode_labels(examples, label_list, source),
        "index": np.arange(len(examples), dtype=np.int32),
    }


def pair_kind(has_b):
    """How a set's rows are encoded (`encode`'s `pairs`): False (single texts), True (pairs) or "mixed"."""
    has_b = np.asarray(has_b, bool)
    return "mixed" if has_b.any() and not has_b.all() else bool(has_b.any())


TRUNCATIONS = ("head", "tail", "head+tail")


def check_truncation(truncation):
    if truncation not in TRUNCATIONS:
        raise UserError(f"--truncation={truncation}: one of {', '.join(TRUNCATIONS)}")
    return truncation


def encode(tokenizer, text_a, text_b, max_seq_length, pairs, has_b=None, truncation="head"):
    """String tensors [batch] -> (token_ids, segment_ids) ragged [batch, (len)]: [CLS] a [SEP] (b [SEP]).

    pairs="mixed": each row by its own kind (`has_b`, bool [batch]): a single text among pairs keeps its
    one [SEP], as it would alone. `truncation`: which pieces of a text too long stay (`trim`)."""
    if pairs == "mixed":
        single = encode(tokenizer, text_a, text_b, max_seq_length, False, truncation=truncation)
        both = encode(tokenizer, text_a, text_b, max_seq_length, True, truncation=truncation)
        n = tf.shape(text_a)[0]
        pick = tf.where(has_b, tf.range(n) + n, tf.range(n))
        return tuple(tf.gather(tf.concat([s, p], 0), pick) for s, p in zip(single, both))
    segments = [tokenizer(text_a)]
    if pairs:
        segments.append(tokenizer(text_b))
    segments = trim(segments, max_seq_length - 1 - len(segments), truncation)
    return combine(segments, tokenizer.cls_id, tokenizer.sep_id)


def combine(segments, cls_id, sep_id):
    """Ragged segments [batch, (pieces)] -> ([CLS] a [SEP] (b [SEP]), segment ids 0 then 1): tf-text's
    `combine_segments`, built without its Transpose of int64 row splits. For an integer Transpose, oneDNN's graph
    pass logs "E0000 ... oneDNN supports DT_INT64 only on platforms with AVX-512" on every run, AVX-512 or not.
    The pieces a row is made of are stacked row-major (segment-major rows, reordered by an index), then merged."""
    n = segments[0].nrows(out_type=tf.int32)
    ids, kinds = [], []
    for kind, segment in enumerate(segments):
        ids += [segment, tf.fill([n, 1], tf.cast(sep_id, segment.dtype))]
        kinds += [tf.zeros_like(segment) + kind, tf.fill([n, 1], tf.cast(kind, segment.dtype))]
    ids.insert(0, tf.fill([n, 1], tf.cast(cls_id, segments[0].dtype)))
    kinds.insert(0, tf.zeros([n, 1], segments[0].dtype))
    k = len(ids)
    order = tf.range(k * n)
    order = (order % k) * n + order // k  # piece i of row j is row i * n + j of the stack

    def merged(pieces):
        stacked = tf.concat([tf.RaggedTensor.from_tensor(p) if isinstance(p, tf.Tensor) else p for p in pieces], 0)
        return tf.RaggedTensor.from_uniform_row_length(tf.gather(stacked, order), k).merge_dims(1, 2)

    return merged(ids), merged(kinds)


def trim(segments, budget, truncation="head"):
    """Ragged [batch, (pieces)] segments cut to `budget` pieces a row in all: how many each keeps is
    google-bert's `_truncate_seq_pair` (tf-text's RoundRobinTrimmer: the longer one shortened first); which
    ones is `truncation`: its first (head), its last (tail), or its first HEAD_SHARE and the rest from
    its end (head+tail)."""
    trimmer = tf_text.RoundRobinTrimmer(max_seq_length=budget)
    if truncation == "head":
        return trimmer.trim(segments)
    kept = [tf.reduce_sum(tf.cast(m, tf.int64), axis=1) for m in trimmer.generate_mask(segments)]
    out = []
    for segment, keep in zip(segments, kept):
        length = segment.row_lengths()
        head = keep * HEAD_SHARE[0] // HEAD_SHARE[1] if truncation == "head+tail" else tf.zeros_like(keep)
        position = tf.ragged.range(length)
        rows = segment.value_rowids()
        tail_from = length - (keep - head)  # a row's positions from here on are kept (its tail)
        mask = (position.flat_values < tf.gather(head, rows)) | (position.flat_values >= tf.gather(tail_from, rows))
        out.append(tf.ragged.boolean_mask(segment, segment.with_flat_values(mask)))
    return out


def make_dataset(examples, tokenizer, label_list, max_seq_length, batch_size, training, seed=None,
                 source="data", pad_to_multiple=8, rows_multiple=None, encode_labels=None, truncation="head",
                 buckets=False):
    """A dataset of ({token_ids, segment_ids, padding_mask}, label, index), batch_size examples a batch.

    training=True shuffles, repeats forever and yields only full batches (every step has the full global
    batch; `buckets`: of similar lengths, `length_batches`); the same seed gives the same stream of
    batches, so a resumed run skips what it has seen.
    training=False keeps every example once, sorted by length, with `index` to restore input order;
    `rows_multiple` then pads each batch's rows to a multiple of it with rows of index -1 (a [CLS] alone),
    which prediction drops: the batch shapes a pass can meet are then (width, rows) from short lists, so
    XLA-compiled kernels compile for few shapes. `truncation`: which pieces of a long text stay (`trim`).
    """
    arrays = examples_to_arrays(examples, label_list, source, encode_labels)
    pairs = pair_kind(arrays["has_b"])
    if not training:
        return _sorted_dataset(arrays, tokenizer, max_seq_length, batch_size, pairs, pad_to_multiple, rows_multiple,
                               truncation)
    ds = tf.data.Dataset.from_tensor_slices(arrays)
    ds = ds.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True).repeat()

    encode_fn = traced_encode(tokenizer, max_seq_length, pairs, truncation)

    def tokenize(batch):
        ids, segs = encode_fn(batch["text_a"], batch["text_b"], batch["has_b"])
        return {"token_ids": ids.to_tensor(), "segment_ids": segs.to_tensor(), "length": ids.row_lengths(),
                "label": batch["label"], "index": batch["index"]}

    def unpad(x):  # one example, back to its own length
        n = x.pop("length")
        return dict(x, token_ids=x["token_ids"][:n], segment_ids=x["segment_ids"][:n])

    ds = ds.batch(256).map(_plain(tokenize), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.unbatch().map(_plain(unpad), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return length_batches(ds, tokenizer.pad_id, max_seq_length, batch_size, arrays["label"], pad_to_multiple,
                          buckets=buckets)


def shuffled_rows(per_token, lengths, per_row, seed):
    """Training rows from rows stored end to end (windows, sentences): each of `per_token` ({name: flat
    values}) cut into rows of `lengths`, beside `per_row` ({name: one value a row}); shuffled with `seed`,
    repeated, each row back to its own length -> a dataset for `length_batches`."""
    rows, width = len(lengths), int(lengths.max())
    real = np.arange(width)[None, :] < lengths[:, None]
    padded = {}
    for name, values in per_token.items():
        padded[name] = np.zeros((rows, width), values.dtype)
        padded[name][real] = values  # row-major: each row's values in order
    ds = tf.data.Dataset.from_tensor_slices({**padded, **per_row, "length": lengths.astype(np.int32)})

    def unpad(x):
        n = x.pop("length")
        return dict(x, **{name: x[name][:n] for name in per_token})

    ds = ds.shuffle(rows, seed=seed, reshuffle_each_iteration=True).repeat()
    return ds.map(_plain(unpad), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def length_batches(ds, pad_id, max_seq_length, batch_size, labels, pad_to_multiple=8, per_token=False,
                   buckets=False):
    """Training batches from a dataset of shuffled unpadded rows {token_ids, segment_ids, label, index} ->
    (features, label, index), full batches only, each padded to its longest row rounded up to
    `pad_to_multiple` (so at most max_seq_length / 8 widths: as many XLA compiles as buckets cost).
    `labels`: an array of the labels (their dtype and shape); `per_token`: a label a token ([length],
    padded with -1, the tagger's), else one a row (padded with 0, never read). Rows with a
    `window_weight` (a long document's windows) pass it on in the features.

    buckets=False: batches in the shuffled order, as Hugging Face's Trainer makes them. buckets=True
    (--length_buckets): rows of similar lengths batched together, less padding and faster steps, but where
    length goes with the label each step's batch leans to some labels: 3.7 points of accuracy lost on
    news titles (benchmarks/NOTES.md item 83)."""
    label_shape = [None] if per_token else [int(d) for d in labels.shape[1:]]
    label_pad = labels.dtype.type(-1 if per_token else 0)
    weighted = "window_weight" in ds.element_spec
    padded_shapes = {"token_ids": [None], "segment_ids": [None], "label": label_shape, "index": [],
                     **({"window_weight": []} if weighted else {})}
    padding_values = {"token_ids": pad_id, "segment_ids": 0, "label": label_pad, "index": 0,
                      **({"window_weight": 0.0} if weighted else {})}
    if buckets:
        boundaries = [b for b in _BOUNDARIES if b < max_seq_length]
        ds = ds.bucket_by_sequence_length(
            element_length_func=lambda x: tf.shape(x["token_ids"])[0], bucket_boundaries=boundaries,
            bucket_batch_sizes=[batch_size] * (len(boundaries) + 1), padded_shapes=padded_shapes,
            padding_values=padding_values, drop_remainder=True)
    else:
        ds = ds.padded_batch(batch_size, padded_shapes=padded_shapes, padding_values=padding_values,
                             drop_remainder=True)

    def to_model_inputs(batch):
        length = tf.shape(batch["token_ids"])[1]
        rounded = tf.minimum((length + pad_to_multiple - 1) // pad_to_multiple * pad_to_multiple, max_seq_length)
        extra = [[0, 0], [0, tf.maximum(rounded, length) - length]]
        ids = tf.pad(batch["token_ids"], extra, constant_values=pad_id)
        features = {"token_ids": ids, "segment_ids": tf.pad(batch["segment_ids"], extra),
                    "padding_mask": tf.not_equal(ids, pad_id)}
        if weighted:
            features["window_weight"] = batch["window_weight"]
        label = tf.pad(batch["label"], extra, constant_values=label_pad) if per_token else batch["label"]
        return features, label, batch["index"]

    return ds.map(_plain(to_model_inputs), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


CHUNK = 8192  # examples tokenized per call: bounds the ragged intermediates of a large set


def traced_encode(tokenizer, max_seq_length, pairs, truncation="head"):
    """`encode` traced once per vocabulary and settings, kept with the tokenizer's shared WordPieces: every
    dataset and eager call of a process then runs one trace (benchmarks/NOTES.md item 57).

    The function reaches the WordPieces through a weak reference (it is traced once, at its first call), so
    it goes when they do (tests/test_soak.py).
    """
    fns, key = tokenizer.pieces.traced, (max_seq_length, pairs, truncation)
    if key not in fns:
        ref = weakref.ref(tokenizer.pieces)
        strings, flags = tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.bool)
        fns[key] = tf.function(lambda a, b, has_b: encode(ref(), a, b, max_seq_length, pairs, has_b, truncation),
                               input_signature=[strings, strings, flags], autograph=False)
    return fns[key]


def traced_pieces(tokenizer):
    """The tokenizer traced (string tensor [n] -> ragged WordPiece ids), kept as `traced_encode`'s functions
    are: a text's pieces, none cut (data/doc_windows.py cuts them into windows)."""
    fns = tokenizer.pieces.traced
    if "pieces" not in fns:
        ref = weakref.ref(tokenizer.pieces)
        fns["pieces"] = tf.function(lambda t: ref()(t), input_signature=[tf.TensorSpec([None], tf.string)],
                                    autograph=False)
    return fns["pieces"]


def _sorted_dataset(arrays, tokenizer, max_seq_length, batch_size, pairs, pad_to_multiple, rows_multiple=None,
                    truncation="head"):
    """Every example once: the set tokenized in chunks, then `sorted_batches`."""
    encode_fn = traced_encode(tokenizer, max_seq_length, pairs, truncation)
    ids, segs, lengths = [], [], []
    for i in range(0, len(arrays["index"]), CHUNK):
        rows = slice(i, i + CHUNK)
        a, b = encode_fn(arrays["text_a"][rows], arrays["text_b"][rows], arrays["has_b"][rows])
        ids.append(a.flat_values.numpy())
        segs.append(b.flat_values.numpy())
        lengths.append(a.row_lengths().numpy())
    return sorted_batches(np.concatenate(ids), np.concatenate(segs), np.concatenate(lengths), arrays["label"],
                          tokenizer, max_seq_length, batch_size, pad_to_multiple, rows_multiple)


def sorted_batches(ids, segments, lengths, labels, tokenizer, max_seq_length, batch_size, pad_to_multiple=8,
                   rows_multiple=None, per_token=False):
    """Every row once, sorted by length and cut into batches of one padded width -> (features, label,
    index), `index` its input position. `ids` and `segments` are the rows' tokens end to end (`lengths`
    each); `labels` one a row, or with `per_token` a token's each end to end like `ids` (padded with -1).

    Widths are lengths rounded up to pad_to_multiple; a batch never mixes widths, so no row is padded by
    pad_to_multiple or more. A width's last batch may be partial; `rows_multiple` pads its rows as
    `make_dataset` says.
    """
    order = np.argsort(lengths, kind="stable")
    widths = np.minimum(-(-lengths[order] // pad_to_multiple) * pad_to_multiple, max_seq_length)
    ends = np.r_[np.flatnonzero(np.diff(widths)) + 1, len(order)]
    starts = np.concatenate([np.arange(s, e, batch_size) for s, e in zip(np.r_[0, ends[:-1]], ends)])
    batch_splits = np.r_[starts, len(order)]
    row_splits = np.r_[0, np.cumsum(widths)]
    # Token t of sorted row j moves from its place in the input to row_splits[j] + t.
    n = lengths[order]
    within = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    source = np.repeat((np.cumsum(lengths) - lengths)[order], n) + within
    target = np.repeat(row_splits[:-1], n) + within

    def nested(values, pad):
        out = np.full(row_splits[-1], pad, values.dtype)
        out[target] = values[source]
        return tf.RaggedTensor.from_nested_row_splits(out, [batch_splits, row_splits])

    index = np.arange(len(lengths), dtype=np.int32)
    batches = {"token_ids": nested(ids, tokenizer.pad_id), "segment_ids": nested(segments, 0),
               "label": (nested(labels, labels.dtype.type(-1)) if per_token else
                         tf.RaggedTensor.from_row_splits(labels[order], batch_splits)),
               "index": tf.RaggedTensor.from_row_splits(index[order], batch_splits)}

    def to_model_inputs(batch):
        ids = batch["token_ids"].to_tensor()  # every row of a batch has its width: no padding added
        segments, label, index = batch["segment_ids"].to_tensor(), batch["label"], batch["index"]
        if per_token:
            label = label.to_tensor()
        if rows_multiple:
            extra = -tf.shape(index)[0] % rows_multiple
            width = tf.shape(ids)[1]
            filler = tf.concat([tf.fill([extra, 1], tf.cast(tokenizer.cls_id, ids.dtype)),
                                tf.fill([extra, width - 1], tf.cast(tokenizer.pad_id, ids.dtype))], axis=1)
            ids, segments = tf.concat([ids, filler], 0), tf.concat([segments, tf.zeros_like(filler)], 0)
            rows = tf.concat([[extra], tf.shape(label)[1:]], 0)  # a multi-label row is a vector
            label = tf.concat([label, tf.fill(rows, tf.constant(-1, label.dtype))], 0)
            index = tf.concat([index, tf.fill([extra], tf.constant(-1, index.dtype))], 0)
        features = {"token_ids": ids, "segment_ids": segments, "padding_mask": tf.not_equal(ids, tokenizer.pad_id)}
        return features, label, index

    return tf.data.Dataset.from_tensor_slices(batches).map(_plain(to_model_inputs)).prefetch(tf.data.AUTOTUNE)
