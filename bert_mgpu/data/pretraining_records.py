"""create_pretraining_data: raw text -> TFRecords with google-research/bert's pretraining features.

Input is google-bert's: UTF-8 text, one sentence per line, a blank line between documents. The instance
algorithm is google-bert's (`create_instances_from_document`, `create_masked_lm_predictions`, random
truncation of the longer segment), re-implemented on token ids, with one change so any corpus fits in
memory: documents are read as a stream and processed `documents_per_buffer` at a time (google-bert holds
the whole corpus; the random "next sentence" is drawn from the same buffer here). One `random.Random`
seeded with `random_seed` drives every choice, so the same input and flags give the same bytes.

Features per instance (all padded to max_seq_length / max_predictions_per_seq, as google-bert writes):
input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights,
next_sentence_labels (1 = B is a random sentence).

Example:
    tok = FullTokenizer("vocab.txt", do_lower_case=True)
    stats = create_pretraining_data(["corpus.txt"], ["out-0.tfrecord", "out-1.tfrecord"], tok)
"""

import dataclasses
import functools
import logging
import os
import random

import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import tokenization, word_segments
from bert_mgpu.data.masking import MaskPlan, candidates

log = logging.getLogger("bert_mgpu")


@dataclasses.dataclass
class MaskingConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False
    word_segmenter: str = "none"  # where Chinese words begin (word_segments.py): none, jieba, pretokenized
    max_ngram_size: int = 1  # masking.MaskPlan
    span_masking: bool = False
    ref_files: tuple = ()  # one reference file an input file (word_segments.RefFile), instead of a segmenter

    @functools.cached_property
    def plan(self):
        """What is masked together; words from a segmenter or reference file imply whole-word masking."""
        return MaskPlan(self.do_whole_word_mask or self.words_given, self.max_ngram_size, self.span_masking)

    @property
    def words_given(self):
        return self.word_segmenter not in (None, "none") or bool(self.ref_files)


# A token code: the id, with this bit set where the token continues a word that a segmenter or reference
# file found (a `##` piece continues one by its vocabulary entry alone).
CONTINUES = 1 << 30


def iter_documents(input_files, tokenizer, lines_per_batch=1024, cfg=None):
    """Yield documents (lists of token-code lists), reading and tokenizing `lines_per_batch` lines at a time.
    With `cfg` naming a segmenter or reference files, codes mark the tokens that continue a word."""
    cfg = cfg or MaskingConfig()
    if cfg.ref_files and len(cfg.ref_files) != len(input_files):
        raise UserError(f"--ref_file: {len(cfg.ref_files)} reference file(s) for {len(input_files)} input file(s); "
                        "give one an input file, in the order of the input files")
    segment = word_segments.segmenter(cfg.word_segmenter)
    document = []
    for n_file, path in enumerate(input_files):
        try:
            f = open(path, "rb")  # decoded line by line, so a bad byte is reported with its line
        except OSError as e:
            raise UserError(f"{path}: cannot read ({e.strerror})") from None
        ref = word_segments.RefFile(cfg.ref_files[n_file], path) if cfg.ref_files else None
        with f:
            batch, line_no = [], 0
            while True:
                raw = f.readline()
                line_no += 1
                if raw:
                    try:
                        batch.append(raw.decode("utf-8").strip())
                    except UnicodeDecodeError as e:
                        raise UserError(f"{path}:{line_no}: not UTF-8 ({e.reason} at byte {e.start})") from None
                if batch and (len(batch) >= lines_per_batch or not raw):
                    word_segments.warn_if_cjk_unsegmented(batch, cfg.do_whole_word_mask and not cfg.words_given,
                                                          "none", path)
                    for ids in _codes(tokenizer, batch, segment, ref):
                        if ids:
                            document.append(ids)
                        elif document:  # a blank line ends a document
                            yield document
                            document = []
                    batch = []
                if not raw:
                    break
        if ref is not None:
            ref.close()
        if document:  # a file ends its last document
            yield document
            document = []


def _codes(tokenizer, lines, segment, ref):
    """Token codes of each line (lists): ids, and CONTINUES where the segmenter or reference file says."""
    if segment is not None:
        ids, starts = word_segments.tokenize_with_word_starts(tokenizer, tf.constant(lines), segment)
        return [[t if s else t | CONTINUES for t, s in zip(row, flags)]
                for row, flags in zip(tokenization.rows(ids), tokenization.rows(starts))]
    rows = tokenizer.id_lists(lines)
    if ref is None:
        return rows
    return [[t if s else t | CONTINUES for t, s in zip(row, ref.starts(len(row)))] if line else row
            for line, row in zip(lines, rows)]


def _truncate_seq_pair(a, b, max_num_tokens, rng):
    """google-bert: drop from the longer segment, from its front or back at random."""
    while len(a) + len(b) > max_num_tokens:
        trunc = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def masked_lm_predictions(codes, cfg, rng, vocab_size, mask_id, special_ids, is_continuation):
    """google-bert's `create_masked_lm_predictions` on token codes -> (tokens, positions, original ids).

    Whole-word masking masks a word's tokens together: its `##` pieces, and the later tokens of a word a
    segmenter or reference file found (CONTINUES); n-grams and spans as masking.py says.
    """
    tokens = [c & (CONTINUES - 1) for c in codes]
    starts = [not (c & CONTINUES or is_continuation[t]) for c, t in zip(codes, tokens)]
    num_to_predict = min(cfg.max_predictions_per_seq, max(1, int(round(len(tokens) * cfg.masked_lm_prob))))
    units = candidates(tokens, starts, special_ids, cfg.plan, rng, num_to_predict)
    rng.shuffle(units)
    output = list(tokens)
    masked, covered = [], set()
    for index_set in units:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict or any(i in covered for i in index_set):
            continue
        for i in index_set:
            covered.add(i)
            if rng.random() < 0.8:
                replacement = mask_id
            elif rng.random() < 0.5:
                replacement = tokens[i]
            else:
                replacement = rng.randint(0, vocab_size - 1)
            output[i] = replacement
            masked.append((i, tokens[i]))
    masked.sort()
    return output, [p for p, _ in masked], [t for _, t in masked]


def instances_from_document(documents, index, cfg, rng, tok_ids):
    """google-bert's `create_instances_from_document` for documents[index] -> list of instance dicts."""
    document = documents[index]
    cls_id, sep_id = tok_ids["cls"], tok_ids["sep"]
    max_num_tokens = cfg.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    instances, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for seg in chunk[:a_end] for t in seg]
                b = []
                random_next = len(chunk) == 1 or rng.random() < 0.5
                if random_next:
                    for _ in range(10):
                        other = rng.randint(0, len(documents) - 1)
                        if other != index:
                            break
                    other_doc = documents[other]
                    for j in range(rng.randint(0, len(other_doc) - 1), len(other_doc)):
                        b.extend(other_doc[j])
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end  # put the unused segments back
                else:
                    b = [t for seg in chunk[a_end:] for t in seg]
                _truncate_seq_pair(a, b, max_num_tokens, rng)
                if a and b:
                    tokens = [cls_id] + a + [sep_id] + b + [sep_id]
                    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                    tokens, positions, labels = masked_lm_predictions(
                        tokens, cfg, rng, tok_ids["vocab_size"], tok_ids["mask"], {cls_id, sep_id},
                        tok_ids["is_continuation"])
                    instances.append({"tokens": tokens, "segment_ids": segments, "positions": positions,
                                      "labels": labels, "random_next": random_next})
            chunk, length = [], 0
        i += 1
    return instances


def to_example(instance, cfg):
    """An instance -> tf.train.Example with google-bert's padded features."""
    n, p = cfg.max_seq_length, cfg.max_predictions_per_seq
    pad = lambda xs, size: list(xs) + [0] * (size - len(xs))  # noqa: E731
    ints = lambda xs: tf.train.Feature(int64_list=tf.train.Int64List(value=xs))  # noqa: E731
    k = len(instance["positions"])
    feature = {
        "input_ids": ints(pad(instance["tokens"], n)),
        "input_mask": ints(pad([1] * len(instance["tokens"]), n)),
        "segment_ids": ints(pad(instance["segment_ids"], n)),
        "masked_lm_positions": ints(pad(instance["positions"], p)),
        "masked_lm_ids": ints(pad(instance["labels"], p)),
        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (p - k))),
        "next_sentence_labels": ints([1 if instance["random_next"] else 0]),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


def token_ids(tokenizer):
    """The ids google-bert's algorithm needs, and which vocabulary entries continue a word (`##`)."""
    if tokenizer.mask_id is None:
        raise UserError(f"{tokenizer.vocab_file}: vocabulary has no [MASK] token")
    return {"cls": tokenizer.cls_id, "sep": tokenizer.sep_id, "mask": tokenizer.mask_id,
            "vocab_size": tokenizer.vocab_size,
            "is_continuation": word_segments.continues(tokenizer).numpy()}


RANDOM_NEXT_WARNING = 0.75  # google-bert pairs a random next segment half the time, always for a lone segment


def _check_next_sentences(stats):
    """A warning when documents are too short for next-sentence prediction: a document holding one segment
    always gets a random next one, so the NSP task is mostly "random" and the B segments come from
    elsewhere."""
    share = stats["random_next"] / stats["instances"]
    if share > RANDOM_NEXT_WARNING:
        log.warning("%.0f%% of the instances pair a random next segment (50%% on long documents): most documents "
                    "are too short to split into two segments. Join sentences into longer documents (a blank line "
                    "ends one), raise --short_seq_prob, or pretrain without NSP (run_pretraining_mgpu.py "
                    "--input_format=text --nsp=false)", 100 * share)


def create_pretraining_data(input_files, output_files, tokenizer, cfg=None, random_seed=12345,
                            documents_per_buffer=100_000):
    """Write TFRecords for `input_files` round-robin over `output_files`; returns counts for the log."""
    cfg = cfg or MaskingConfig()
    if cfg.max_seq_length < 5:
        raise UserError(f"--max_seq_length={cfg.max_seq_length}: needs room for [CLS] A [SEP] B [SEP]")
    log.info("masking: %s", cfg.plan)  # bad masking flags fail here, before any output
    rng, ids = random.Random(random_seed), token_ids(tokenizer)
    stats = {"documents": 0, "buffers": 0, "instances": 0, "masked": 0, "tokens": 0, "random_next": 0}
    temps = [f"{path}.tmp-{os.getpid()}" for path in output_files]
    writers = [tf.io.TFRecordWriter(t) for t in temps]

    def flush(documents):
        rng.shuffle(documents)
        instances = []
        for _ in range(cfg.dupe_factor):
            for index in range(len(documents)):
                instances.extend(instances_from_document(documents, index, cfg, rng, ids))
        rng.shuffle(instances)
        for inst in instances:
            record = to_example(inst, cfg).SerializeToString(deterministic=True)  # map order: same bytes every run
            writers[stats["instances"] % len(writers)].write(record)
            stats["instances"] += 1
            stats["masked"] += len(inst["positions"])
            stats["tokens"] += len(inst["tokens"])
            stats["random_next"] += inst["random_next"]
        stats["buffers"] += 1

    try:
        buffer = []
        for document in iter_documents(input_files, tokenizer, cfg=cfg):
            buffer.append(document)
            stats["documents"] += 1
            if len(buffer) >= documents_per_buffer:
                flush(buffer)
                buffer = []
        if buffer:
            flush(buffer)
        if not stats["instances"]:
            raise UserError(f"{', '.join(input_files)}: no pretraining instances (is the text empty?)")
        _check_next_sentences(stats)
    except BaseException:
        for w, t in zip(writers, temps):  # leave no partial shard behind; earlier outputs are untouched
            w.close()
            os.remove(t)
        raise
    for w in writers:
        w.close()
    for t, path in zip(temps, output_files):
        os.replace(t, path)  # each shard appears whole or not at all
    return stats
