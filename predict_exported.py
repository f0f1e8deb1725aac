"""Predict with any head's export (ONNX, int8 ONNX or LiteRT) without TensorFlow: text in, the files
`--do_predict` writes out (a classifier's test_results.tsv, predict.txt, predictions.tsv; a tagger's
predict.txt in CoNLL columns, predictions.jsonl, and test_results.txt when the file has its tags; a question
answerer's predictions.json, nbest_predictions.json and null_odds.json; a multiple-choice model's
predictions.jsonl, predict.txt and CLUE's submission file; a GlobalPointer's predictions.jsonl, and
test_results.txt when the file has its entities).

    python predict_exported.py --model_dir=out/export/onnx_int8 --input_file=test.tsv --output_dir=predicted
    python predict_exported.py --model_dir=ner/export/tflite --input_file=test.txt --output_dir=predicted

A classifier's --input_file: a TSV or CSV file with a header row (the text in --text_column; a pair task's
second text in --text_b_column), JSON lines (the same keys), or any other file as one text a line
('text_a ||| text_b' for a pair, as extract_features.py reads it); row i is `test-i`, as a test file's rows
are in a run. A tagger's, a question answerer's (SQuAD JSON) and a multiple-choice model's: what its script
reads (--data_format). Loads numpy, Hugging Face `tokenizers` and the export's runtime (onnxruntime or
ai-edge-litert) only.
"""

import os

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "The export: --export_dir/onnx, onnx_int8 or tflite of a classifier.")
flags.DEFINE_string("input_file", None, "The texts: .tsv/.csv with a header, .jsonl, or one text a line.")
flags.DEFINE_string("output_dir", None, "Where test_results.tsv, predict.txt and predictions.tsv go.")
flags.DEFINE_string("text_column", None, "The text's column or key (default: text, text_a or sentence).")
flags.DEFINE_string("text_b_column", None, "A pair task's second text (default: text_b, or sentence2).")
flags.DEFINE_enum("predict_format", "label", ["label", "index"], "predict.txt: each label, or its index.")
flags.DEFINE_integer("batch_size", 32, "Texts a call of the runtime.")
flags.DEFINE_integer("threads", None, "The runtime's threads (default: its own, every core).")
flags.DEFINE_string("data_format", "auto", "A tagger's or multiple-choice model's input, as run_ner_mgpu.py "
                    "and run_multiple_choice_mgpu.py read it (auto: told from the file).")
FILES = {"classifier": ("test_results.tsv", "predict.txt", "predictions.tsv"),
         "tagger": ("predict.txt", "predictions.jsonl", "test_results.txt", "cluener_predict.json"),
         "question_answerer": ("predictions.json", "nbest_predictions.json", "null_odds.json"),
         "multiple_choice": ("predictions.jsonl", "predict.txt", "c311_predict.json", "chid11_predict.json"),
         "global_pointer": ("predictions.jsonl", "test_results.txt")}


def run():
    from bert_mgpu import cli
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.io.exported import load_exported

    for name in ("model_dir", "input_file", "output_dir"):
        if not getattr(FLAGS, name):
            raise UserError(f"--{name} is required")
    cli.check_numbers(FLAGS, at_least={"batch_size": 1, "threads": 1})
    model = load_exported(FLAGS.model_dir, FLAGS.threads)
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    for name in FILES[model.kind]:
        cli.check_output_file(os.path.join(FLAGS.output_dir, name), "--output_dir",
                              [("--input_file", FLAGS.input_file)])
    if model.kind in HEAD_FILES:
        count, files = HEAD_FILES[model.kind](model, FLAGS.input_file, FLAGS.data_format, FLAGS.batch_size)
    else:
        from bert_mgpu.data.text_files import read_texts

        texts, second = read_texts(FLAGS.input_file, FLAGS.text_column, FLAGS.text_b_column, model.pairs)
        count, files = len(texts), model.prediction_files(texts, second, predict_format=FLAGS.predict_format,
                                                          batch_size=FLAGS.batch_size)
    for name, text in files.items():
        storage.write_atomic(os.path.join(FLAGS.output_dir, name), text)
    print(f"predicted {count} {UNITS.get(model.kind, 'texts')} with {FLAGS.model_dir} -> {', '.join(files)} in "
          f"{FLAGS.output_dir}")


def tagger_files(model, path, data_format, batch_size):
    """(sentences, {file name: text}) of a tagger's export on `path`, read as run_ner_mgpu.py reads a test file."""
    from bert_mgpu.core import prediction_files
    from bert_mgpu.data.tagged import detect_format, read_tagged

    form = detect_format(path) if data_format == "auto" else data_format
    sentences = read_tagged(path, form, split="test")
    predicted = model.predict_tags([s.tokens for s in sentences], batch_size)
    return len(sentences), prediction_files.tagged(sentences, predicted, form)


def answer_files(model, path, data_format, batch_size):
    """(questions, run_squad's files) of a question answerer's export on a SQuAD JSON file."""
    from bert_mgpu.core import prediction_files
    from bert_mgpu.data.squad import read_squad

    v2 = bool(model.settings["version_2_with_negative"])
    questions = read_squad(path, v2)[0]
    return len(questions), prediction_files.answers(model.answer(questions, batch_size), v2)


def choice_files(model, path, data_format, batch_size):
    """(questions, the files of run_multiple_choice_mgpu.py) of a multiple-choice export on one file."""
    from bert_mgpu.core import prediction_files
    from bert_mgpu.data.choices import detect_format, read_choices

    form = detect_format(path) if data_format == "auto" else data_format
    questions = read_choices(path, form)
    predicted = model.predict(questions, batch_size)
    return len(questions), prediction_files.choices(questions, [p["probabilities"] for p in predicted], form)


def span_files(model, path, data_format, batch_size):
    """(sentences, the files of run_global_pointer_mgpu.py --do_predict) of a GlobalPointer's export on one file,
    read as that script reads it."""
    from bert_mgpu.core import prediction_files
    from bert_mgpu.data.spans import read_spans

    sentences = read_spans(path, split="test", **({} if data_format == "auto" else {"data_format": data_format}))
    return len(sentences), prediction_files.spans(sentences, model.predict_entities([s.tokens for s in sentences],
                                                                                    batch_size))


HEAD_FILES = {"tagger": tagger_files, "question_answerer": answer_files, "multiple_choice": choice_files,
              "global_pointer": span_files}
UNITS = {"tagger": "sentences", "question_answerer": "questions", "multiple_choice": "questions",
         "global_pointer": "sentences"}


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run, tensorflow=False))


if __name__ == "__main__":
    _console()
