"""A GlobalPointer's ONNX export, served without TensorFlow: raw text (or a list of words) in, its entities out,
nested ones included, as `BertGlobalPointer.predict_entities` and `predict` give them.

The graph gives each window's span scores [windows, types, length, length]; the host does the rest as the
notebook class does: the words of a raw text (data/words.py), their WordPieces through the export's
tokenizer.json, a long sentence's windows `doc_stride` pieces apart, and each span above 0 read from the
window that owns its first word (data/spans.py).

Example:
    gp = bert_mgpu.load_exported("out/export/onnx")
    gp.predict(["北京大学的张三"])   # [[{"type": "ORG", "text": "北京大学", "start": 0, "end": 4}, ...]]
"""

from bert_mgpu.data.spans import as_span_sentences, by_position, entity_offsets, span_windows, window_entities
from bert_mgpu.data.words import split_words
from bert_mgpu.io.served import Pieces, Served, padded


class ExportedGlobalPointer(Served):
    """A GlobalPointer's ONNX export loaded for prediction (`Served`'s arguments)."""

    reads = "global_pointer"

    def __init__(self, path, threads=None):
        super().__init__(path, threads)
        self.labels = list(self.facts["labels"])
        self.pieces = Pieces(path)
        self.max_seq_length = int(self.facts["max_seq_length"])
        self.doc_stride = self.facts["facts"].get("doc_stride")

    def predict_entities(self, sentences, batch_size=8):
        """Each sentence's entities [(type, first word, end word exclusive)] by position: `sentences` are lists of
        words, or raw texts (cut into words)."""
        rows = as_span_sentences(sentences)
        windows, _ = span_windows(rows, self.pieces, self.labels, self.max_seq_length, self.doc_stride)
        found = [set() for _ in rows]
        for i in range(0, len(windows), batch_size):
            batch = windows[i:i + batch_size]
            scores = self.run(["logits"], padded([(w.token_ids, ()) for w in batch], self.pieces.pad_id))[0]
            window_entities(batch, scores, len(rows), found)
        return by_position(found, self.labels)

    def predict(self, texts, batch_size=8):
        """Each input's entities, as `BertGlobalPointer.predict`: [{"type", "text", "start", "end"}] a text; for
        a raw string, character offsets into it (end exclusive); for a list of words, word indices."""
        texts = list(texts)
        words = [split_words(t) if isinstance(t, str) else None for t in texts]
        found = self.predict_entities([[w for w, _, _ in f] if f is not None else list(t)
                                       for f, t in zip(words, texts)], batch_size)
        return entity_offsets(texts, words, found)
