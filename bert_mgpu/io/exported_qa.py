"""A question answerer's ONNX or LiteRT export, served without TensorFlow: (question, context) in, the answer's text
and character offsets out, as `BertQuestionAnswerer.predict` gives them.

The graph gives each piece's start and end scores; the host does what `predict` does, with the same code
(data/squad_input.py, which loads no TensorFlow but for training's dataset): the context's words and
their pieces through the export's tokenizer.json, the question cut to `max_query_length` pieces, windows
`doc_stride` pieces apart, and run_squad's n-best answer selection with the run's `max_answer_length`,
`n_best_size` and, for SQuAD 2.0, its null score threshold (all in bert_mgpu.json).

Example:
    qa = bert_mgpu.load_exported("out/export/onnx")
    qa.predict([("Who wrote it?", "It was written by Ann.")])   # [{"text": "Ann", "start": 18, ...}]
"""

import numpy as np

from bert_mgpu.data.squad import as_questions
from bert_mgpu.data.squad_input import best_answers, best_of, make_windows
from bert_mgpu.io.served import Pieces, Served, padded


class ExportedQuestionAnswerer(Served):
    """A question answerer's ONNX or LiteRT export loaded for prediction (`Served`'s arguments)."""

    reads = "question_answerer"

    def __init__(self, path, threads=None):
        super().__init__(path, threads)
        self.settings = dict(self.facts["facts"])  # run_squad's: doc_stride, max_query_length, n_best_size, ...
        self.max_seq_length = int(self.facts["max_seq_length"])
        self.pieces = Pieces(path)

    def answer(self, questions, batch_size=8):
        """Every question's answers as run_squad writes them (data/squad_input.Answers: predictions, the
        n best with their probabilities and offsets, and a v2 model's null odds)."""
        questions = as_questions(questions)
        s = self.settings
        windows, cut = make_windows(questions, self.pieces, self.max_seq_length, s["max_query_length"],
                                    s["doc_stride"])
        logits = []
        for i in range(0, len(windows), batch_size):
            inputs = self._inputs(windows[i:i + batch_size])
            logits.extend(np.stack(self.run(["start_logits", "end_logits"], inputs), -1))
        return best_answers(questions, windows, logits, cut, s["n_best_size"], s["max_answer_length"],
                            s["version_2_with_negative"], s["null_score_diff_threshold"])

    def predict(self, questions, batch_size=8):
        """Each question's best answer, in input order: {"text", "start", "end" (character offsets in the
        context, end exclusive), "probability"}; a v2 model's no-answer has text "" and no offsets.
        `questions`: (question, context) pairs, `Question`s or Hugging Face squad rows."""
        questions = as_questions(questions)
        return best_of(questions, self.answer(questions, batch_size))

    def _inputs(self, windows):
        """The graph's inputs for a batch of windows, padded to the longest."""
        return padded([(w.token_ids, w.segment_ids) for w in windows], self.pieces.pad_id)
