"""Learn a WordPiece vocab.txt from raw text, for pretraining from scratch (keras-hub's learner).

    python build_vocab.py --input_file=corpus/*.txt --vocab_size=8000 --output_file=vocab.txt --do_lower_case=true
"""


from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("input_file", None, "Input text files, comma-separated (globs allowed).")
flags.DEFINE_string("output_file", None, "vocab.txt to write.")
flags.DEFINE_integer("vocab_size", 30522, "Most tokens in the vocabulary, specials included.")
flags.DEFINE_integer("min_count", 2, "A character seen this many times is always a token (every Chinese character "
                     "of the text, not only the 1,000 most frequent); a word or piece needs as many to enter.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
flags.DEFINE_enum("invalid_utf8", "error", ["error", "replace"], "Invalid UTF-8 in the text: stop naming the "
                  "line, or replace it by U+FFFD and count the lines.")


def run():
    from bert_mgpu import cli
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data.vocab import build_vocab

    for name in ("input_file", "output_file"):
        if not getattr(FLAGS, name):
            raise UserError(f"--{name} is required")
    cli.check_not_an_input(FLAGS.output_file, "--output_file", [("--input_file", FLAGS.input_file)])
    vocab = build_vocab(FLAGS.input_file, FLAGS.vocab_size, FLAGS.output_file, FLAGS.do_lower_case,
                        FLAGS.invalid_utf8, FLAGS.min_count)
    print(f"{len(vocab)} tokens -> {FLAGS.output_file}")


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
