"""What every head's served export shares: its files read (bert_mgpu.json, tokenizer.json) and its runtime (ONNX
Runtime or LiteRT's interpreter), with nothing of TensorFlow. Each head's predictor is its own module
(exported.py: a classifier's, exported_tagger.py, exported_qa.py, exported_choice.py); `load_exported`
picks one by the export's kind.
"""

import json
import os

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import names

FACTS = "bert_mgpu.json"  # written by onnx_export.py (which loads TensorFlow; its FACTS is this name)
GRAPHS = ("model.onnx", "model.tflite")
READERS = {}  # head kind -> the `Served` subclass that reads its exports; each registers itself (`reads`)


class Served:
    """What every head's served export holds: bert_mgpu.json's `facts`, the head's `kind` and `run(output
    names, inputs)`, its runtime. A head's reader is a subclass naming the kind it `reads`, which
    `exported.load_exported` then picks for that kind's exports.

    Args:
        path: the export's directory (`--export_dir/onnx`, `onnx_int8` or `tflite`).
        threads: the runtime's threads (None: its default).
    """

    reads = None  # the head kind (its name in io/heads.py) whose exports a subclass reads

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.reads:
            READERS[cls.reads] = cls

    def __init__(self, path, threads=None):
        self.facts, graph = read_facts(path)
        self.kind = self.facts["kind"]
        self.run = runner(path, graph, threads)


def read_facts(path):
    """(bert_mgpu.json's facts, the graph's file name) of the export in `path`; one line when it is none."""
    facts_file = os.path.join(path, FACTS)
    graph = next((g for g in GRAPHS if os.path.isfile(os.path.join(path, g))), None)
    if not os.path.isfile(facts_file) or graph is None:
        raise UserError(f"{path}: not an ONNX or LiteRT export of bert_mgpu (no {FACTS} and model.onnx or "
                        "model.tflite); export one with --do_export --export_format=onnx (or tflite)")
    with open(facts_file, encoding="utf-8") as f:
        return names.current(json.load(f)), graph


def runner(path, graph, threads):
    """(output names, inputs) -> those outputs, by the runtime of `graph` (a file name in `path`)."""
    return (_onnx_runner if graph == "model.onnx" else _litert_runner)(os.path.join(path, graph), threads)


def _onnx_runner(path, threads):
    """(output names, inputs) -> those outputs, by ONNX Runtime."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return lambda names, feed: session.run(list(names), feed)


def _litert_runner(path, threads):
    """(output names, inputs) -> those outputs, by LiteRT's interpreter (its signature runner sizes the inputs)."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise UserError(f"{path}: a LiteRT export needs ai-edge-litert; pip install 'bert_mgpu[tflite]'") from None
    runner = Interpreter(model_path=path, num_threads=threads).get_signature_runner("serving_default")
    return lambda names, feed: (lambda out: [out[n] for n in names])(runner(**feed))


class Pieces:
    """An export's tokenizer.json as the hosts use it: each text's WordPieces with no [CLS]/[SEP], truncation
    or padding (`tokenizer`), the vocabulary and special ids, and `id_lists`, what squad_input and
    data/windows ask of a tokenizer."""

    def __init__(self, path):
        self.tokenizer = read_tokenizer(path)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        ids = self.tokenizer.get_vocab()
        self.vocab = [None] * (max(ids.values()) + 1)
        for token, i in ids.items():
            self.vocab[i] = token
        self.unk_id, self.cls_id, self.sep_id, self.pad_id = (ids[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))

    def id_lists(self, texts):
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def padded(rows, pad_id):
    """The graph's inputs for rows of (ids, segment ids), padded to the longest."""
    width = max(len(ids) for ids, _ in rows)
    out = {"input_ids": np.full((len(rows), width), pad_id, np.int64),
           "attention_mask": np.zeros((len(rows), width), np.int64),
           "token_type_ids": np.zeros((len(rows), width), np.int64)}
    for n, (ids, segments) in enumerate(rows):
        out["input_ids"][n, :len(ids)] = ids
        out["attention_mask"][n, :len(ids)] = 1
        out["token_type_ids"][n, :len(segments)] = segments
    return out


def read_tokenizer(path):
    """The export's tokenizer.json in Hugging Face `tokenizers`, padding each batch to its longest text."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


def onnx_inputs(tokenizer, texts):
    """The graph's inputs for `texts` (strings, or (a, b) pairs) from `read_tokenizer`'s tokenizer."""
    rows = tokenizer.encode_batch(list(texts))
    return {"input_ids": np.array([r.ids for r in rows], np.int64),
            "attention_mask": np.array([r.attention_mask for r in rows], np.int64),
            "token_type_ids": np.array([r.type_ids for r in rows], np.int64)}
