"""google-research/bert's extract_features.py on every GPU: per-token features as JSON lines, or sentence
embeddings as a .npy.

    python extract_features.py --input_file=sentences.txt --output_file=features.jsonl \
        --init_checkpoint=uncased_L-12_H-768_A-12 --layers=-1,-2,-3,-4 --max_seq_length=128 --n_gpus=4
    python extract_features.py --input_file=sentences.txt --output_npy=embeddings.npy --pooling=mean ...

One input a line, a blank line an empty text (so rows match lines); `text_a ||| text_b` is a pair, as
google-bert reads it. The JSON lines are google-bert's:
{"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}.
A thin wrapper over `bert_mgpu.api.embeddings.Encoder`.
"""

import io
import json

from absl import app, flags

from bert_mgpu.cli import define_tower_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "One text a line; 'text_a ||| text_b' for a pair.")
flags.DEFINE_string("output_file", None, "JSON lines of per-token features, as google-bert writes them.")
flags.DEFINE_string("output_npy", None, "Sentence embeddings [lines, hidden] as a NumPy .npy (--pooling).")
flags.DEFINE_string("init_checkpoint", None, "Any checkpoint run_classifier_mgpu.py reads.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: beside the checkpoint).")
flags.DEFINE_string("vocab_file", None, "vocab.txt (default: beside the checkpoint).")
flags.DEFINE_bool("do_lower_case", None, "Default: what the checkpoint says, else true.")
flags.DEFINE_list("layers", ["-1", "-2", "-3", "-4"], "--output_file: layers to write (-1 = the last).")
flags.DEFINE_enum("pooling", "mean", ["mean", "cls", "pooler"], "--output_npy: mean of the last layer over real "
                  "tokens, the [CLS] state, or BERT's pooler.")
flags.DEFINE_integer("max_seq_length", 128, "Longer inputs are truncated.")
flags.DEFINE_integer("batch_size", 32, "Per tower.")
define_tower_flags()
# Features are read as numbers, often compared across runs: float32 unless asked (bf16 keeps ~3 digits).
flags.FLAGS.set_default("precision", "float32")


def read_inputs(path):
    """One example a line, blank lines included (as google-bert reads them: [CLS] [SEP]), so that row i of
    the output is line i + 1 of the file; the line ending of the last line makes no row."""
    import logging

    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data.examples import Example
    from bert_mgpu.data.text_files import read_text

    lines = read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()
    examples, blank = [], []
    for line, text in enumerate(lines, 1):
        a, sep, b = text.rstrip("\r").partition(" ||| ")
        if not a.strip() and not sep:
            blank.append(line)
        elif not a.strip() or (sep and not b.strip()):
            raise UserError(f"{path}:{line}: empty text on one side of ' ||| '")
        examples.append(Example(str(len(examples)), a, b if sep else None))
    if len(blank) == len(examples):
        raise UserError(f"{path}: no inputs (empty or blank)")
    if blank:
        logging.getLogger("bert_mgpu").warning(
            "%s: %d blank line(s), the first at line %d: each gives the features of an empty text ([CLS] [SEP]), "
            "so that rows match lines", path, len(blank), blank[0])
    return examples


def run():
    import numpy as np

    from bert_mgpu import cli
    from bert_mgpu.api.embeddings import Encoder
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError

    cli.check_numbers(FLAGS, at_least={"max_seq_length": 3, "batch_size": 1})
    for name in ("input_file", "init_checkpoint"):
        if not getattr(FLAGS, name):
            raise UserError(f"--{name} is required")
    if not (FLAGS.output_file or FLAGS.output_npy):
        raise UserError("give --output_file (per-token features) or --output_npy (sentence embeddings), or both")
    for name in ("output_file", "output_npy"):
        if getattr(FLAGS, name):
            cli.check_output_file(getattr(FLAGS, name), f"--{name}", [("--input_file", FLAGS.input_file)])
    try:
        layers = [int(n) for n in FLAGS.layers]
    except ValueError:
        raise UserError(f"--layers={','.join(FLAGS.layers)}: expected layer numbers such as -1,-2") from None
    examples = read_inputs(FLAGS.input_file)
    towers = cli.towers_from_flags(FLAGS, *cli.plan_from_flags(FLAGS), FLAGS.batch_size)
    encoder = Encoder.from_pretrained(FLAGS.init_checkpoint, towers, FLAGS.precision, FLAGS.max_seq_length,
                                      FLAGS.do_lower_case, FLAGS.bert_config_file, FLAGS.vocab_file)
    if not FLAGS["layers"].present:  # google-bert's default, the last 4, on a model that may have fewer
        layers = [n for n in layers if -encoder.backbone.num_layers <= n]
    if FLAGS.output_npy:
        vectors = encoder.embed(examples, FLAGS.pooling, FLAGS.batch_size)
        buffer = io.BytesIO()
        np.save(buffer, vectors)
        storage.write_atomic(FLAGS.output_npy, buffer.getvalue())
        print(f"embeddings: {vectors.shape[0]} x {vectors.shape[1]} ({FLAGS.pooling}) -> {FLAGS.output_npy}")
    if FLAGS.output_file:
        lines = []
        for i, (tokens, values) in enumerate(encoder.features(examples, layers, FLAGS.batch_size)):
            features = [{"token": token, "layers": [{"index": n, "values": [round(float(x), 6) for x in values[j, t]]}
                                                     for j, n in enumerate(layers)]}
                        for t, token in enumerate(tokens)]
            lines.append(json.dumps({"linex_index": i, "features": features}) + "\n")
        storage.write_atomic(FLAGS.output_file, "".join(lines))
        print(f"features: {len(lines)} lines, layers {','.join(map(str, layers))} -> {FLAGS.output_file}")


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
