"""A tagger's ONNX or LiteRT export, served without TensorFlow: raw text (or a list of words) in, a tag a word and
the entities out, as `BertTagger.predict_tags` and `predict` give them.

The graph gives each piece's scores; the host does the rest as `predict` does: the words of a raw text
(data/words.py), their WordPieces through the export's tokenizer.json, a long sentence's windows
`doc_stride` pieces apart with each word read from the window where it has most context (data/windows.py),
a CRF's Viterbi over each window's words with the exported transitions (core/viterbi.py), and the
entities with character offsets into the text.

Example:
    tagger = bert_mgpu.load_exported("out/export/onnx")
    tagger.predict(["张三在北京工作"])   # [[{"type": "PER", "text": "张三", "start": 0, "end": 2}, ...]]
"""

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.core.viterbi import viterbi
from bert_mgpu.data.inputs import check_text
from bert_mgpu.data.windows import sentence_windows, word_predictions
from bert_mgpu.data.words import entity_dicts, split_words
from bert_mgpu.io.served import Pieces, Served, padded


class ExportedTagger(Served):
    """A tagger's ONNX or LiteRT export loaded for prediction (`Served`'s arguments)."""

    reads = "tagger"

    def __init__(self, path, threads=None):
        super().__init__(path, threads)
        self.labels = list(self.facts["labels"])
        self.pieces = Pieces(path)
        self.room = int(self.facts["max_seq_length"]) - 2
        self.doc_stride = int(self.facts["facts"].get("doc_stride") or self.room // 2)
        transitions = self.facts.get("crf_transitions")
        self.transitions = None if transitions is None else np.asarray(transitions, np.float64)

    def predict_tags(self, sentences, batch_size=8):
        """Each sentence's tags, a word each: `sentences` are lists of words, or raw texts (cut into words)."""
        words = []
        for i, s in enumerate(sentences):  # what BertTagger takes, with its errors
            if isinstance(s, str):
                words.append([w for w, _, _ in split_words(check_text(s, f"input {i}"))])
            elif isinstance(s, list | tuple) and all(isinstance(w, str) and w for w in s):
                words.append([check_text(w, f"input {i}") for w in s])
            else:
                raise UserError(f"input {i}: expected a text or a list of tokens (non-empty strings)")
        windows = []
        for n, row in enumerate(words):
            flat, first = [], []
            for k, ids in enumerate(self._word_pieces(row)):
                flat.extend(ids)
                first.extend([k] + [-1] * (len(ids) - 1))
            windows.extend(sentence_windows(n, flat, first, self.room, self.doc_stride, self.pieces.cls_id,
                                              self.pieces.sep_id))
        logits = []
        for i in range(0, len(windows), batch_size):
            logits.extend(self.run(["logits"], self._inputs(windows[i:i + batch_size]))[0])
        decode = None if self.transitions is None else (lambda scores: viterbi(scores, self.transitions))
        ids = word_predictions(windows, logits, [len(row) for row in words], decode)
        return [[self.labels[i] for i in row] for row in ids]

    def predict(self, texts, batch_size=8):
        """Each input's entities, as `BertTagger.predict`: [{"type", "text", "start", "end"}] a text; for a raw
        string, character offsets into it (end exclusive); for a list of words, word indices, and the text
        is the words joined by a space."""
        texts = list(texts)
        found = [split_words(t) if isinstance(t, str) else None for t in texts]
        tags = self.predict_tags([[w for w, _, _ in f] if f is not None else t for f, t in zip(found, texts)],
                                 batch_size)
        return [entity_dicts(text, words, sequence) for text, words, sequence in zip(texts, found, tags)]

    def _word_pieces(self, words):
        """Each word's piece ids (a word that gives none, a control character, is [UNK], as in training)."""
        if not words:
            return []
        encoded = self.pieces.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
        pieces = [[] for _ in words]
        for piece, word in zip(encoded.ids, encoded.word_ids):
            pieces[word].append(piece)
        return [ids or [self.pieces.unk_id] for ids in pieces]

    def _inputs(self, windows):
        """The graph's inputs for a batch of windows, padded to the longest."""
        return padded([(w.token_ids, ()) for w in windows], self.pieces.pad_id)
