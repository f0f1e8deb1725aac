"""google-research/bert's create_pretraining_data.py: raw text -> pretraining TFRecords (same flags).

    python create_pretraining_data.py --input_file=corpus/*.txt --output_file=data/pretrain.tfrecord \
        --vocab_file=vocab.txt --do_lower_case=true --max_seq_length=128 --max_predictions_per_seq=20 \
        --masked_lm_prob=0.15 --random_seed=12345 --dupe_factor=5 --num_output_shards=4

Chinese whole-word masking: --word_segmenter=jieba (or pretokenized, or --ref_file); n-grams of words:
--max_ngram_size=3; one span a sequence: --span_masking.

Input: one sentence per line, a blank line between documents. The corpus is streamed (see
bert_mgpu/data/pretraining_records.py); the same input and flags give the same bytes.
"""

import logging
import os

from absl import app, flags

from bert_mgpu.cli import masking

FLAGS = flags.FLAGS
flags.DEFINE_list("input_file", None, "Input text files, comma-separated (globs allowed).")
flags.DEFINE_list("output_file", None, "Output TFRecord files, comma-separated; instances go round-robin.")
flags.DEFINE_string("vocab_file", None, "vocab.txt of the model to pretrain.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked-LM predictions per sequence.")
flags.DEFINE_integer("random_seed", 12345, "Seed of every random choice.")
flags.DEFINE_integer("dupe_factor", 10, "Times the input is used, each with different masks.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Share of tokens masked.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a sequence shorter than max_seq_length.")
flags.DEFINE_integer("num_output_shards", 1, "With one --output_file: write NAME-0000i-of-0000N shards.")
flags.DEFINE_integer("documents_per_buffer", 100_000, "Documents held in memory at once.")
masking.define_masking_flags()


def run():
    from bert_mgpu import cli
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data import pretraining_records
    from bert_mgpu.data.pretraining_input import expand_files
    from bert_mgpu.data.tokenization import FullTokenizer

    for name in ("input_file", "output_file", "vocab_file"):
        if not getattr(FLAGS, name):
            raise UserError(f"--{name} is required")
    outputs = list(FLAGS.output_file)
    if len(outputs) == 1 and FLAGS.num_output_shards > 1:
        n = FLAGS.num_output_shards
        outputs = [f"{outputs[0]}-{i:05d}-of-{n:05d}" for i in range(n)]
    for path in outputs:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UserError(f"{path}: directory {parent} does not exist")
        cli.check_not_an_input(path, "--output_file", [("--input_file", FLAGS.input_file),
                                                       ("--vocab_file", FLAGS.vocab_file),
                                                       ("--ref_file", FLAGS.ref_file or [])])
    plan = masking.mask_plan(FLAGS)
    cfg = pretraining_records.MaskingConfig(
        FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, FLAGS.masked_lm_prob, FLAGS.short_seq_prob,
        FLAGS.dupe_factor, plan.whole_word, FLAGS.word_segmenter, plan.max_ngram_size,
        plan.span, tuple(FLAGS.ref_file or ()))
    inputs = expand_files(FLAGS.input_file)
    stats = pretraining_records.create_pretraining_data(
        inputs, outputs, FullTokenizer(FLAGS.vocab_file, FLAGS.do_lower_case), cfg, FLAGS.random_seed,
        FLAGS.documents_per_buffer)
    logging.info("%s", stats)
    print(f"{stats['instances']} instances from {stats['documents']} documents -> {', '.join(outputs)}")


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
