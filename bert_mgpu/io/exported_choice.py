"""A multiple-choice model's ONNX or LiteRT export, served without TensorFlow: questions with their choices in,
each question's choice and its probabilities out, as `BertMultipleChoice.predict` gives them.

Each choice is read with its context as one pair (data/choices.choice_texts: `context`, `question choice`;
a CHID blank takes the choice in place), each text's pieces by the export's tokenizer.json, a pair too long
cut as bert_mgpu cuts it (`windows.pair_counts`: tokenizers' LongestFirst gives an odd piece to the other text), a
question's choices one row [choices, length] of the graph's input; a question with fewer choices than the
widest is padded with empty choices, which the graph scores -1e4. The probabilities are a softmax over the
question's own choices.

Example:
    mc = bert_mgpu.load_exported("out/export/onnx")
    mc.predict([("", "The sky is", ["blue", "a fish"])])   # [{"label": 0, "answer": "blue", ...}]
"""

import numpy as np

from bert_mgpu.data.choices import as_questions, choice_texts, chosen
from bert_mgpu.data.windows import pair_counts
from bert_mgpu.io.served import Pieces, Served


class ExportedMultipleChoice(Served):
    """A multiple-choice model's ONNX or LiteRT export loaded for prediction (`Served`'s arguments)."""

    reads = "multiple_choice"

    def __init__(self, path, threads=None):
        super().__init__(path, threads)
        self.pieces = Pieces(path)
        self.max_seq_length = int(self.facts["max_seq_length"])

    def predict(self, questions, batch_size=8):
        """Each question's choice, in input order: {"label" (its index), "answer" (its text), "probabilities"
        (over its choices)}. `questions`: (context, question, choices) tuples, dicts or `ChoiceQuestion`s."""
        questions = as_questions(questions)
        probabilities = []
        for i in range(0, len(questions), batch_size):
            batch = questions[i:i + batch_size]
            logits = self.run(["logits"], self._inputs(batch))[0]
            for q, row in zip(batch, logits):
                scores = np.asarray(row[:len(q.choices)], np.float64)
                p = np.exp(scores - scores.max())
                probabilities.append(p / p.sum())
        return chosen(questions, probabilities)

    def _inputs(self, questions):
        """[questions, choices, length] inputs: each choice a pair (a single text where the second is empty,
        as bert_mgpu encodes it), padded choices all zeros."""
        rows = [[self._encode(*choice_texts(q, c)) for c in q.choices] for q in questions]
        width = max(len(ids) for row in rows for ids, _ in row)
        shape = (len(rows), max(len(row) for row in rows), width)
        out = {name: np.zeros(shape, np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}
        for n, row in enumerate(rows):
            for k, (ids, segments) in enumerate(row):
                out["input_ids"][n, k, :len(ids)] = ids
                out["attention_mask"][n, k, :len(ids)] = 1
                out["token_type_ids"][n, k, :len(ids)] = segments
        return out

    def _encode(self, first, second):
        """(ids, segments) of [CLS] first [SEP] (second [SEP]), cut to max_seq_length (a single text where the
        second is empty, as bert_mgpu encodes it)."""
        a, b = self.pieces.id_lists([first, second])
        cls, sep = self.pieces.cls_id, self.pieces.sep_id
        if not second:
            a = a[:self.max_seq_length - 2]
            return [cls, *a, sep], [0] * (len(a) + 2)
        kept_a, kept_b = pair_counts(len(a), len(b), self.max_seq_length - 3)
        return ([cls, *a[:kept_a], sep, *b[:kept_b], sep],
                [0] * (kept_a + 2) + [1] * (kept_b + 1))
