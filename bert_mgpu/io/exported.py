"""Predict from an ONNX or LiteRT export with no TensorFlow: raw text through its tokenizer.json (Hugging Face
`tokenizers`) and model.onnx (ONNX Runtime) or model.tflite (LiteRT's interpreter), the head's usual
predictions out, and the files `--do_predict` writes (`predict_exported.py`).

Importing this module loads numpy and tokenizers, and the runtime the export needs, only, so a server that
imports it alone (or `bert_mgpu.load_exported`, which loads nothing else) starts in a second and needs neither
TensorFlow nor a GPU. A classifier's exports are read here (labels and probabilities, scores for a regression,
each label's probability for multi-label; long texts in windows or cut head+tail as the model reads them), a
tagger's in exported_tagger.py, a question answerer's in exported_qa.py and a multiple-choice model's in
exported_choice.py.

Example:
    model = bert_mgpu.load_exported("out/export/onnx_int8")
    model.predict(["a gripping film"])          # probabilities [1, labels], as clf.predict
    model.predict_labels(["a gripping film"])   # ["pos"]
    model.prediction_files(texts)                # {"test_results.tsv": ..., "predict.txt": ..., ...}
"""

import numpy as np

from bert_mgpu.core import prediction_files
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.windows import kept, pair_counts, pool, spans
from bert_mgpu.io.exported_choice import ExportedMultipleChoice  # noqa: F401 (each head's reader registers
from bert_mgpu.io.exported_global_pointer import ExportedGlobalPointer  # noqa: F401 itself in READERS as it
from bert_mgpu.io.exported_qa import ExportedQuestionAnswerer  # noqa: F401 is imported)
from bert_mgpu.io.exported_tagger import ExportedTagger  # noqa: F401
from bert_mgpu.io.served import (  # noqa: F401 (FACTS: as before)
    FACTS,
    READERS,
    Pieces,
    Served,
    onnx_inputs,
    padded,
    read_facts,
    read_tokenizer,
)


class Exported(Served):
    """A classifier's ONNX or LiteRT export loaded for prediction (`Served`'s arguments)."""

    reads = "classifier"

    def __init__(self, path, threads=None):
        super().__init__(path, threads)
        self.task_type = self.facts["task_type"]
        self.labels, self.pairs = list(self.facts["labels"]), bool(self.facts["pairs"])
        self.max_seq_length, self.truncation = self.facts["max_seq_length"], self.facts["truncation"]
        self.doc_stride = self.facts["facts"].get("doc_stride")
        self.pooling = self.facts["facts"].get("window_pooling", "mean")
        self.tokenizer = read_tokenizer(path)
        # tokenizer.json cuts a single text's head or tail as bert_mgpu does. Windows, head+tail and pairs are
        # cut here, from its pieces: its LongestFirst gives a pair's odd piece to the second text, and bert_mgpu
        # (tf-text's round robin, google-bert's _truncate_seq_pair) to the first.
        self.pieces = Pieces(path) if self.doc_stride or self.truncation == "head+tail" or self.pairs else None
        self.output = "scores" if self.task_type == "regression" else "probabilities"

    def predict(self, texts, text_b=None, batch_size=32):
        """Probabilities [N, labels] (each label's for multi-label), or scores [N] for a regression, as the
        classifier's `predict` returns them. `text_b`: the second texts of a pair task."""
        texts = list(texts)
        if self.pairs != (text_b is not None):
            raise UserError("this classifier reads sentence pairs: give text_b" if self.pairs else
                            "this classifier reads single texts: text_b is not used")
        if self.doc_stride:
            return self._windows(texts, batch_size)
        out = []
        for i in range(0, len(texts), batch_size):
            batch = texts[i:i + batch_size] if text_b is None else list(zip(texts[i:i + batch_size],
                                                                             list(text_b)[i:i + batch_size]))
            inputs = (onnx_inputs(self.tokenizer, batch) if self.pieces is None else
                      padded(self._encoded(batch), self.pieces.pad_id))
            out.append(self.run([self.output], inputs)[0])
        width = (0,) if self.output == "scores" else (0, len(self.labels))
        return np.concatenate(out) if out else np.zeros(width, np.float32)

    def _encoded(self, batch):
        """(ids, segments) of [CLS] a [SEP] (b [SEP]), each text cut to its share of the room (`pair_counts`) by
        --truncation (`kept`)."""
        cls, sep = self.pieces.cls_id, self.pieces.sep_id
        rows = []
        if not self.pairs:
            for a in self.pieces.id_lists(batch):
                a = kept(a, self.max_seq_length - 2, self.truncation)
                rows.append(([cls, *a, sep], [0] * (len(a) + 2)))
            return rows
        for a, b in zip(self.pieces.id_lists([p[0] for p in batch]), self.pieces.id_lists([p[1] for p in batch])):
            keep_a, keep_b = pair_counts(len(a), len(b), self.max_seq_length - 3)
            a, b = kept(a, keep_a, self.truncation), kept(b, keep_b, self.truncation)
            rows.append(([cls, *a, sep, *b, sep], [0] * (len(a) + 2) + [1] * (len(b) + 1)))
        return rows

    def _windows(self, texts, batch_size):
        """A long text's windows (`doc_stride` pieces apart) run, their logits pooled, then the head's outputs."""
        rows, doc_of = [], []
        cls, sep = self.pieces.cls_id, self.pieces.sep_id
        for d, pieces in enumerate(self.pieces.id_lists(texts)):
            for start, end in spans(len(pieces), self.max_seq_length - 2, self.doc_stride):
                rows.append(([cls, *pieces[start:end], sep], ()))
                doc_of.append(d)
        logits = [self.run(["logits"], padded(rows[i:i + batch_size], self.pieces.pad_id))[0]
                  for i in range(0, len(rows), batch_size)]
        width = len(self.labels) if self.task_type != "regression" else 1
        pooled = pool(np.concatenate(logits) if logits else np.zeros((0, width), np.float32),
                      np.array(doc_of, np.int64), len(texts), self.pooling)
        if self.task_type == "regression":
            return pooled[:, 0]
        if self.task_type == "multi_label":
            return 1 / (1 + np.exp(-pooled))
        e = np.exp(pooled - pooled.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def predict_labels(self, texts, text_b=None, threshold=0.5):
        """Each text's label (for multi-label: the labels at or over `threshold`, comma-separated)."""
        p = self.predict(texts, text_b)
        if self.task_type == "regression":
            raise ValueError("a regression has no labels: use predict")
        if self.task_type == "multi_label":
            return [",".join(label for label, x in zip(self.labels, row) if x >= threshold) for row in p]
        return [self.labels[i] for i in p.argmax(axis=1)]


    def prediction_files(self, texts, text_b=None, guids=None, predict_format="label", batch_size=32):
        """{file name: text}: the test_results.tsv, predict.txt and predictions.tsv that `--do_predict` writes
        for these texts (`guids`: each row's id, default test-0, test-1, ... as a test file's rows)."""
        texts = list(texts)
        guids = [f"test-{i}" for i in range(len(texts))] if guids is None else list(guids)
        p = self.predict(texts, text_b, batch_size)
        if self.task_type == "regression":
            return prediction_files.scores(p, guids)
        if self.task_type == "multi_label":
            facts = self.facts["facts"]
            return prediction_files.label_sets(p, self.labels, guids, facts.get("threshold", 0.5),
                                               facts.get("label_separator", ","))
        return prediction_files.classes(p, self.labels, guids, predict_format)


def load_exported(path, threads=None):
    """The ONNX or LiteRT export in `path`, ready to predict from raw text: an `Exported` (a classifier's), an
    `exported_tagger.ExportedTagger` (a tagger's, with or without a CRF) or an
    `exported_qa.ExportedQuestionAnswerer` or an `exported_choice.ExportedMultipleChoice`."""
    kind = read_facts(path)[0]["kind"]
    if kind not in READERS:  # a pretrained encoder's: its outputs are the graph's (docs/export.md)
        raise UserError(f"{path}: a {kind}'s export has no predictions; run its model.onnx or model.tflite "
                        "(docs/export.md)")
    return READERS[kind](path, threads)
