"""Masked-LM scoring and fill-mask on every GPU: each text's per-token probabilities and pseudo-perplexity
(every token masked in turn, as bert-ad's run_lm_predict), or the likeliest tokens for its [MASK]s.

    python score_text_mgpu.py --input_file=texts.txt --output_file=scores.jsonl \
        --init_checkpoint=chinese_L-12_H-768_A-12 --n_gpus=4
    python score_text_mgpu.py --mode=fill_mask --top_k=5 --input_file=masked.txt --output_file=fills.jsonl ...

One text a line. --mode=score writes a JSON line a text: {"line", "text", "tokens", "log_probs",
"probabilities", "pseudo_log_likelihood", "pseudo_perplexity"}; --mode=fill_mask {"line", "text", "masks":
[[{"token", "token_str", "score", "sequence"}, ...] for each [MASK]]}. The checkpoint needs its masked-LM
head (a Google or Hugging Face pretraining release, or run_pretraining_mgpu.py's output).
"""

import json

from absl import app, flags

from bert_mgpu.cli import define_tower_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "One text a line.")
flags.DEFINE_string("output_file", None, "JSON lines, one a text, in input order.")
flags.DEFINE_enum("mode", "score", ["score", "fill_mask"], "score: per-token probabilities and pseudo-perplexity; "
                  "fill_mask: the likeliest tokens for each [MASK] written in a text.")
flags.DEFINE_integer("top_k", 5, "fill_mask: tokens given for each [MASK].")
flags.DEFINE_string("init_checkpoint", None, "A checkpoint with its masked-LM head.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: beside the checkpoint).")
flags.DEFINE_string("vocab_file", None, "vocab.txt (default: beside the checkpoint).")
flags.DEFINE_bool("do_lower_case", None, "Default: what the checkpoint says, else true.")
flags.DEFINE_integer("max_seq_length", 512, "A longer text (in tokens, with [CLS] and [SEP]) is an error.")
flags.DEFINE_integer("batch_size", 64, "Rows (masked copies) per tower.")
define_tower_flags()
flags.FLAGS.set_default("precision", "float32")  # probabilities are compared across runs


def run():
    import logging

    from bert_mgpu import cli
    from bert_mgpu.api.pretraining import BertPretrainer
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.data.text_files import read_lines

    cli.check_numbers(FLAGS, at_least={"max_seq_length": 3, "batch_size": 1, "top_k": 1})
    for name in ("input_file", "output_file", "init_checkpoint"):
        if not getattr(FLAGS, name):
            raise UserError(f"--{name} is required")
    cli.check_output_file(FLAGS.output_file, "--output_file", [("--input_file", FLAGS.input_file)])
    lines = [(n, text) for n, text in read_lines(FLAGS.input_file) if text.strip()]
    if not lines:
        raise UserError(f"{FLAGS.input_file}: no text")
    towers = cli.towers_from_flags(FLAGS, *cli.plan_from_flags(FLAGS), FLAGS.batch_size)
    pre = BertPretrainer.from_pretrained(FLAGS.init_checkpoint, towers, FLAGS.precision, nsp=False,
                                         do_lower_case=FLAGS.do_lower_case, bert_config_file=FLAGS.bert_config_file,
                                         vocab_file=FLAGS.vocab_file)
    texts = [t for _, t in lines]
    try:
        if FLAGS.mode == "score":
            results = pre.score(texts, FLAGS.batch_size, FLAGS.max_seq_length)
        else:
            from bert_mgpu.api import mlm_scoring

            results = [{"masks": m} for m in mlm_scoring.fill_mask(pre, texts, FLAGS.top_k, FLAGS.batch_size,
                                                                     FLAGS.max_seq_length)]
    except UserError as e:  # "text 3: ..." -> the file and its line
        message = str(e)
        if message.startswith("text "):
            number, _, rest = message[5:].partition(":")
            message = f"{FLAGS.input_file}:{lines[int(number) - 1][0]}:{rest}"
        raise UserError(message) from None
    out = [json.dumps({"line": n, "text": t, **r}, ensure_ascii=False, allow_nan=False) + "\n"
           for (n, t), r in zip(lines, results)]
    storage.write_atomic(FLAGS.output_file, "".join(out))
    if FLAGS.mode == "score":
        log = logging.getLogger("bert_mgpu")
        scored = [r["pseudo_perplexity"] for r in results if r["pseudo_perplexity"] is not None]
        empty = [str(n) for (n, _), r in zip(lines, results) if r["pseudo_perplexity"] is None]
        if empty:
            log.warning("%s: line(s) %s hold no token to score (their pseudo_perplexity is null)",
                        FLAGS.input_file, ", ".join(empty[:10]) + (" ..." if len(empty) > 10 else ""))
        if scored:
            log.info("mean pseudo-perplexity %.3f over %d texts", sum(scored) / len(scored), len(scored))
    print(f"{FLAGS.mode}: {len(out)} texts -> {FLAGS.output_file}")


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
