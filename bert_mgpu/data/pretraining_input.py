"""tf.data input for pretraining: google-bert TFRecords, or raw text with dynamic masking.

Both yield (features, labels) batches: features {token_ids, segment_ids, padding_mask, mask_positions},
labels {masked_lm_ids, masked_lm_weights, next_sentence_labels}.

Resume: the order is a pure function of the seed (seeded shuffle, then repeat), so a run that restarts
after `start` examples skips exactly those and sees the same data an uninterrupted run would.

Dynamic masking (RoBERTa / Cramming style): text is tokenized inside tf.data, packed into full
max_seq_length sequences (documents joined by [SEP], no NSP), and masked on the fly with stateless random
ops keyed by (seed, position in the stream): every epoch gets new masks, and a resumed run the same ones.
keras-hub's MaskedLMMaskGenerator is not used because its random draws cannot be keyed that way.
"""

import contextlib
import dataclasses
import re

import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data import masking, word_segments

_plain = tf.autograph.experimental.do_not_convert  # traced as written, as input_pipeline's


def _as_model_inputs(ex):
    features = {
        "token_ids": tf.cast(ex["input_ids"], tf.int32),
        "segment_ids": tf.cast(ex["segment_ids"], tf.int32),
        "padding_mask": tf.cast(ex["input_mask"], tf.bool),
        "mask_positions": tf.cast(ex["masked_lm_positions"], tf.int32),
    }
    labels = {
        "masked_lm_ids": tf.cast(ex["masked_lm_ids"], tf.int32),
        "masked_lm_weights": tf.cast(ex["masked_lm_weights"], tf.float32),
        "next_sentence_labels": tf.cast(tf.reshape(ex["next_sentence_labels"], [-1])[0], tf.int32),
    }
    return features, labels


def expand_files(pattern_list):
    """Comma-list globs -> sorted file names; UserError naming a pattern that matches nothing."""
    files = []
    for pattern in pattern_list:
        found = sorted(tf.io.gfile.glob(pattern))
        if not found:
            raise UserError(f"{pattern}: no such input file")
        files.extend(found)
    return files


def worker_files(files, part=None):
    """Worker `index`'s share of `files` for `part` = (index, workers): every workers-th, from its index;
    all of them without a part."""
    index, workers = part or (0, 1)
    return list(files)[index::workers]


def record_dataset(input_files, batch_size, max_seq_length, max_predictions_per_seq, training=True,
                   seed=12345, start=0, shuffle_buffer=10_000, rows=None, part=None):
    """google-bert pretraining TFRecords -> batches; training repeats forever, from example `start`.
    `rows`: a function of the unparsed records that keeps some (one worker's: distribute.worker_rows);
    `part`: (index, workers), read only this worker's files (worker_files)."""
    files = worker_files(expand_files(input_files), part)
    spec = {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    ds = tf.data.TFRecordDataset(files)
    if training:
        # Shuffle raw records before parsing, so skipping on resume costs no parsing.
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat().skip(start)
    ds = rows(ds) if rows else ds
    ds = ds.map(lambda r: _as_model_inputs(tf.io.parse_single_example(r, spec)),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


def check_records(input_files, max_seq_length, max_predictions_per_seq):
    """Parse the first record; a UserError naming the file when its shapes do not match the flags."""
    files = expand_files(input_files)
    try:
        first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
    except tf.errors.OpError as e:
        raise UserError(f"{files[0]}: not a TFRecord file ({e.message.splitlines()[0]})") from None
    if first is None:
        raise UserError(f"{files[0]}: no records")
    for path in files:
        check_framing(path)
    ex = tf.train.Example.FromString(first.numpy()).features.feature
    for name, want in (("input_ids", max_seq_length), ("masked_lm_positions", max_predictions_per_seq)):
        if name not in ex:
            raise UserError(f"{files[0]}: no {name} feature; not made by create_pretraining_data")
        have = len(ex[name].int64_list.value)
        if have != want:
            flag = "max_seq_length" if name == "input_ids" else "max_predictions_per_seq"
            raise UserError(f"{files[0]}: records have {name} of length {have} but --{flag}={want}")
    return files


def check_framing(path):
    """Walk a local TFRecord file's record lengths to its end: TensorFlow reads a file cut inside its last
    record's 12-byte header as a clean end, dropping that record without a word. UserError naming the
    record and byte where the file ends early. (CRCs are left to TensorFlow, which checks them as it reads.)"""
    import os
    import struct

    if storage.is_remote(path):
        return
    size, offset, n = os.path.getsize(path), 0, 0
    with open(path, "rb") as f:
        while offset < size:
            n += 1
            if size - offset < 12:
                raise UserError(f"{path}: record {n} is truncated at byte {size} (inside its header, which starts "
                                f"at byte {offset}); a file cut short while it was copied? Write or copy it again, "
                                "or leave it out of --input_file")
            f.seek(offset)
            length, = struct.unpack("<Q", f.read(8))
            offset += 12 + length + 4
            if offset > size:
                raise UserError(f"{path}: record {n} is truncated at byte {size}; a file cut short while it was "
                                "copied? Write or copy it again, or leave it out of --input_file")


def damaged_records(input_files, error):
    """A UserError for TensorFlow's DataLossError while reading `input_files`: which file and record are
    damaged. tf.data does not say which file it was reading, so each is read again, records only (no
    parsing), up to the first it cannot read."""
    for path in input_files:
        n = 0
        try:
            for _ in tf.data.TFRecordDataset(path):
                n += 1
        except tf.errors.DataLossError as e:
            return UserError(f"{path}: record {n + 1} is {_data_loss(e)}; a file cut short while it was copied? "
                             "Write or copy it again, or leave it out of --input_file")
    return UserError(f"damaged input data ({_data_loss(error)})")


def _data_loss(error):
    found = re.search(r"(truncated|corrupted) record at (\d+)", error.message)
    return f"{found[1]} at byte {found[2]}" if found else error.message.split(" [Op:")[0][-200:]


def packed_sequences(input_files, tokenizer, max_seq_length, part=None, segment=None, ref_files=()):
    """Raw text -> [CLS] + (max_seq_length - 2 tokens of the running text) + [SEP], documents split by [SEP].
    `part`: (index, workers), only this worker's files. With `segment` (word_segments.segmenter) or
    `ref_files` (one an input file, word_segments.RefFile's), each element is (ids, starts): whether each
    token starts a word."""
    files = expand_files(input_files)
    pairs = worker_files(list(zip(files, ref_files or [None] * len(files))), part)
    files = [path for path, _ in pairs]
    sep = tokenizer.sep_id

    def tokenize(lines, positions=None):
        if positions is not None:
            ids = tokenizer(lines)
            starts = word_segments.starts_from_refs(ids, positions)
        elif segment is None:
            ids, starts = tokenizer(lines), None
        else:
            ids, starts = word_segments.tokenize_with_word_starts(tokenizer, lines, segment)
        blank = tf.equal(tf.strings.strip(lines), "")  # a blank line ends a document: mark it with [SEP]
        lengths = tf.cast(blank, tf.int64)
        seps = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(tf.cast(blank, tf.int32))], sep), lengths)
        ids = tf.concat([tf.cast(ids, tf.int32), seps], axis=1).flat_values
        if starts is None:
            return ids
        ones = tf.RaggedTensor.from_row_lengths(tf.ones([tf.reduce_sum(lengths)], tf.bool), lengths)
        return ids, tf.concat([starts, ones], axis=1).flat_values

    body = max_seq_length - 2
    if ref_files:
        ds = tf.data.Dataset.from_generator(
            lambda: word_segments.lines_with_refs(files, [ref for _, ref in pairs]),
            output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([None], tf.int32))).ragged_batch(1024)
    else:
        ds = tf.data.TextLineDataset(files).batch(1024)
    ds = ds.map(_plain(tokenize), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.unbatch().batch(body, drop_remainder=True)
    if segment is None and not ref_files:
        return ds.map(lambda t: tf.concat([[tokenizer.cls_id], t, [sep]], 0))
    return ds.map(lambda t, s: (tf.concat([[tokenizer.cls_id], t, [sep]], 0), tf.concat([[True], s, [True]], 0)))


def dynamic_mask(ids, index, seed, max_predictions_per_seq, masked_lm_prob, vocab_size, mask_id, special_ids,
                 plan=None, starts=None):
    """Mask one packed sequence as google-bert would (80% [MASK], 10% random, 10% kept), statelessly.
    `plan` (masking.MaskPlan): whole words, n-grams or a span, with `starts` ([n] bool) where words begin."""
    n = tf.shape(ids)[0]
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)])
    candidate = tf.reduce_all(tf.not_equal(ids[:, None], tf.constant(special_ids, tf.int32)[None, :]), axis=1)
    num = tf.minimum(max_predictions_per_seq, tf.maximum(
        1, tf.cast(tf.round(tf.cast(n, tf.float32) * masked_lm_prob), tf.int32)))
    num = tf.minimum(num, tf.reduce_sum(tf.cast(candidate, tf.int32)))
    if plan is not None and (plan.whole_word or plan.grouped):
        positions = masking.select(candidate, starts, plan, key, num)
        num = tf.size(positions)
    else:
        scores = tf.where(candidate, tf.random.stateless_uniform([n], key), -1.0)
        positions = tf.sort(tf.math.top_k(scores, num).indices)
    original = tf.gather(ids, positions)
    draw = tf.random.stateless_uniform([num], key + [0, 1 << 40])
    random_ids = tf.random.stateless_uniform([num], key + [0, 2 << 40], maxval=vocab_size, dtype=tf.int32)
    replacement = tf.where(draw < 0.8, mask_id, tf.where(draw < 0.9, random_ids, original))
    masked = tf.tensor_scatter_nd_update(ids, positions[:, None], replacement)
    pad = max_predictions_per_seq - num
    return {
        "input_ids": masked,
        "input_mask": tf.ones_like(ids),
        "segment_ids": tf.zeros_like(ids),
        "masked_lm_positions": tf.pad(positions, [[0, pad]]),
        "masked_lm_ids": tf.pad(original, [[0, pad]]),
        "masked_lm_weights": tf.pad(tf.ones([num], tf.float32), [[0, pad]]),
        "next_sentence_labels": tf.zeros([1], tf.int32),
    }


def text_dataset(input_files, tokenizer, batch_size, max_seq_length, max_predictions_per_seq,
                 masked_lm_prob=0.15, training=True, seed=12345, start=0, shuffle_buffer=10_000, rows=None,
                 part=None, plan=None, word_segmenter="none", ref_files=()):
    """Raw text, packed and dynamically masked -> batches; training repeats forever, from example `start`.
    `rows`: a function of the packed, unmasked sequences that keeps some (distribute.worker_rows);
    `part`: (index, workers), only this worker's files, masked unlike any other worker's;
    `plan` (masking.MaskPlan) and `word_segmenter` or `ref_files` (word_segments.py): what is masked together."""
    if tokenizer.mask_id is None:
        raise UserError(f"{tokenizer.vocab_file}: vocabulary has no [MASK] token")
    segment = word_segments.segmenter(word_segmenter) if plan is not None and plan.whole_word else None
    ds = packed_sequences(input_files, tokenizer, max_seq_length, part, segment, ref_files)
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.enumerate().skip(start)
    if part:  # a mask's randomness follows the sequence's number: no two workers' numbers meet
        index, workers = part
        ds = ds.map(lambda i, ids: (i * workers + index, ids))
    ds = rows(ds) if rows else ds
    special = sorted({tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id})
    continues = word_segments.continues(tokenizer)

    def mask(i, element):
        ids, starts = element if segment is not None or ref_files else (element, None)
        if starts is None and plan is not None and (plan.whole_word or plan.grouped):
            starts = tf.logical_not(tf.gather(continues, ids))  # google-bert's words: no `##`
        return _as_model_inputs(dynamic_mask(ids, i, seed, max_predictions_per_seq, masked_lm_prob,
                                             tokenizer.vocab_size, tokenizer.mask_id, special, plan, starts))

    ds = ds.map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


class PretrainingData:
    """Where pretraining examples come from: TFRecords (`kind="records"`) or raw text (`kind="text"`).

    `seed` is the run's: it orders the examples and picks the masked positions, and `BertPretrainer.fit`
    starts the dropout masks from it.

    Example:
        data = PretrainingData("text", ["corpus/*.txt"], tokenizer, max_seq_length=128)
        ds = data.dataset(batch_size=64, start=0)
    """

    def __init__(self, kind, input_files, tokenizer=None, max_seq_length=128, max_predictions_per_seq=20,
                 masked_lm_prob=0.15, seed=12345, sharding="auto", plan=None, word_segmenter="none", ref_files=()):
        if kind not in ("records", "text"):
            raise UserError(f"input kind {kind!r}: expected records or text")
        if sharding not in ("auto", "files", "examples"):
            raise UserError(f"--input_sharding={sharding}: expected auto, files or examples")
        self.sharding = sharding
        self.records, self.tokenizer, self.seed = kind == "records", tokenizer, seed
        self.max_seq_length, self.max_predictions_per_seq = max_seq_length, max_predictions_per_seq
        self.masked_lm_prob = masked_lm_prob
        if ref_files and word_segmenter not in (None, "none"):
            raise UserError("--ref_file and --word_segmenter both say where words begin; pick one")
        words = word_segmenter not in (None, "none") or bool(ref_files)
        if words and not (plan and plan.whole_word):  # words imply whole words
            plan = dataclasses.replace(plan or masking.MaskPlan(), whole_word=True)
        self.plan, self.word_segmenter = plan, word_segmenter  # text: what is masked together (masking.py)
        self.input_files = (check_records(input_files, max_seq_length, max_predictions_per_seq)
                            if kind == "records" else expand_files(input_files))
        self.ref_files = tuple(ref_files or ())
        if self.ref_files:
            if kind != "text":
                raise UserError("--ref_file: reference files go with raw text (--input_format=text)")
            word_segments.check_ref_files(self.input_files, self.ref_files, tokenizer)
        self._count = None
        if kind == "text" and plan is not None and plan.whole_word and not words:
            with tf.io.gfile.GFile(self.input_files[0], "rb") as f:
                head = [line.decode("utf-8", "replace") for line, _ in zip(f, range(1000))]
            word_segments.warn_if_cjk_unsegmented(head, True, word_segmenter, self.input_files[0])

    @property
    def has_nsp(self):
        return self.records

    def by_files(self, workers):
        """Whether each of `workers` reads files of its own (`dataset(part=...)`) rather than its rows of
        one stream every worker reads: sharding "files", or "auto" with at least a file per worker.
        By files, no worker reads, tokenizes or masks what another does."""
        if workers == 1:
            return False
        if self.sharding == "files" and len(self.input_files) < workers:
            raise UserError(f"--input_sharding=files: {len(self.input_files)} input file(s) for {workers} "
                            "workers; each needs one at least (or --input_sharding=examples)")
        return self.sharding == "files" or (self.sharding == "auto" and len(self.input_files) >= workers)

    def dataset(self, batch_size, training=True, start=0, rows=None, part=None):
        """Batches of `batch_size` from example `start`; `rows` keeps some examples before they are
        parsed or masked (one worker's rows: distribute.worker_rows); `part` = (index, workers) reads
        only this worker's files."""
        if self.records:
            return record_dataset(self.input_files, batch_size, self.max_seq_length, self.max_predictions_per_seq,
                                  training, self.seed, start, rows=rows, part=part)
        return text_dataset(self.input_files, self.tokenizer, batch_size, self.max_seq_length,
                            self.max_predictions_per_seq, self.masked_lm_prob, training, self.seed, start, rows=rows,
                            part=part, plan=self.plan, word_segmenter=self.word_segmenter, ref_files=self.ref_files)

    @contextlib.contextmanager
    def reading(self):
        """Within it, a damaged record ends the run in one line naming its file and place."""
        try:
            yield self
        except tf.errors.DataLossError as e:
            raise damaged_records(self.input_files, e) from None

    def count(self):
        """Sequences in one pass over the data (one read; needed only for epoch-based validation)."""
        if self._count is None:
            if self.records:
                ds = tf.data.TFRecordDataset(self.input_files)
            else:
                ds = packed_sequences(self.input_files, self.tokenizer, self.max_seq_length)
            self._count = int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())
            if not self._count:
                raise UserError(f"{', '.join(self.input_files)}: no pretraining sequences")
        return self._count
