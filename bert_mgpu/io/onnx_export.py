"""ONNX export: each head's ids-in graph for ONNX Runtime, and the files a server needs to tokenize beside it.

The graph takes what a Hugging Face BERT takes (`input_ids`, `attention_mask`, `token_type_ids`, int64,
[batch, length] of any size; [batch, choices, length] for multiple choice) and returns the head's raw scores
under transformers' names (`logits`; `start_logits` and `end_logits`), plus a classifier's probabilities
(scores for a regression); a pretrained encoder's hidden states, and its masked-LM (and NSP) logits where it
has those heads: a server scores text with them (score_text_mgpu.py's pseudo-log-likelihood). It is the
reference keras-hub encoder, converted by tf2onnx at opset 17, with exact GELU written with `erf`: TensorFlow's
own is an `Erfc`, which ONNX Runtime cannot run.

Beside `model.onnx`: `vocab.txt`, Hugging Face's `config.json` (labels) and `tokenizer.json` (the same ids as
bert_mgpu's tokenizer, for Hugging Face `tokenizers` in any language), and `bert_mgpu.json` with what the
graph leaves to the host: the labels, the length and truncation, a long text's windows, a CRF's transitions
(Viterbi decoding stays on the host), and the largest difference between ONNX Runtime and TensorFlow on
probe texts, measured at export. `onnx_int8` is the same graph after ONNX Runtime's dynamic quantization
(int8 weights with a scale per output channel, activations quantized as they come): per channel keeps the
outputs closer to float32 than one scale a tensor (measured in benchmarks/NOTES.md item 77).

Example:
    bert_mgpu.export_model("out", "out/export/onnx", format="onnx")
    session = onnxruntime.InferenceSession("out/export/onnx/model.onnx")
"""

import importlib.util
import json
import logging
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from bert_mgpu.core import _compat, storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import encode
from bert_mgpu.data.tokenization import FullTokenizer, read_vocab
from bert_mgpu.io import checkpoints
from bert_mgpu.io.heads import CRF_WEIGHT
from bert_mgpu.io.trained import PROBE_TEXTS, build_model
from bert_mgpu.model.kernels import ACTIVATIONS
from bert_mgpu.model.pretraining_model import assign_heads, build_pretrainer

log = logging.getLogger("bert_mgpu")
OPSET = 17  # tf2onnx 1.17 converts at most 18; 17 is what ONNX Runtime releases of the last years all run
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
FACTS = "bert_mgpu.json"
# What each graph format needs beyond TensorFlow, and the extra of setup.py that installs it.
_ONNX = (("tf2onnx", "onnx", "onnxruntime"), "onnx")
NEEDS = {"onnx": _ONNX, "onnx_int8": _ONNX, "tflite": (("ai_edge_litert",), "tflite")}
MLM_HEAD, NSP_HEAD = "cls/predictions/output_bias", "cls/seq_relationship/output_bias"
TOLERANCE = 1e-3  # a float32 export further than this from TensorFlow is refused (measured: about 1e-6)


def check_available(fmt):
    """One line naming the extra to install when a package `fmt` needs is missing (before any training)."""
    modules, extra = NEEDS.get(fmt, ((), None))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"--export_format={fmt}: needs {', '.join(missing)}; pip install 'bert_mgpu[{extra}]'")


def write_onnx(trained, directory, int8=False, probe_texts=()):
    """Write `trained` (an `export.Trained`) as `model.onnx` and its files into the empty `directory`."""
    import tf2onnx

    function = ids_graph(trained, portable_model(trained))
    path = os.path.join(directory, "model.onnx")
    scratch = tempfile.mkdtemp(prefix="bert_mgpu_onnx_")  # tf2onnx and the quantizer write local files
    try:
        local = os.path.join(scratch, "model.onnx")
        converted = local + ".float32" if int8 else local
        tf2onnx.convert.from_function(function, input_signature=specs(trained), opset=OPSET, output_path=converted)
        _tidy(converted, matmul=int8)
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(local + ".float32", local, weight_type=QuantType.QInt8, per_channel=True)
        probe = probe_inputs(trained, probe_texts)
        difference, outputs = _runtime_difference(local, function, probe)
        if not int8 and difference > TOLERANCE:
            raise RuntimeError(f"ONNX export: ONNX Runtime's outputs differ from TensorFlow's by {difference:.3g}; "
                               "please report this with the model's bert_config.json")
        with open(local, "rb") as f:  # into the export's own directory (local or gs://), which moves into place
            storage.write_atomic(path, f.read())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_files(trained, directory, {"outputs": outputs, "opset": OPSET, "weights": "int8" if int8 else "float32",
                                     "max_difference_to_tensorflow": difference})
    log.info("ONNX export%s: ONNX Runtime within %.2g of TensorFlow on %d probe rows", " (int8)" if int8 else "",
             difference, len(probe["input_ids"]))
    return directory


def _tidy(path, matmul):
    """Two rewrites of tf2onnx's graph, in place. Each `Shape` of a constant becomes the constant's shape:
    tf2onnx keeps every attention kernel's 5-d einsum form only for its shape (14 MB of MiniLM's 102).
    With `matmul`, each Gemm of a constant weight (its form of the attention projections) becomes MatMul
    (+ Add): ONNX Runtime's dynamic quantization takes MatMul, not Gemm, and left those float32."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(path)
    graph = model.graph
    weights = {w.name: w for w in graph.initializer}
    nodes = []
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Shape" and node.input[0] in weights and not attributes:
            shape = np.array(weights[node.input[0]].dims, np.int64)
            nodes.append(helper.make_node("Constant", [], list(node.output), name=node.name + "/folded",
                                          value=numpy_helper.from_array(shape, node.output[0] + "/value")))
            continue
        beta = attributes.get("beta", 1.0)
        if (not matmul or node.op_type != "Gemm" or node.input[1] not in weights or attributes.get("transA", 0)
                or attributes.get("alpha", 1.0) != 1.0 or beta not in (0.0, 1.0)):
            nodes.append(node)
            continue
        if attributes.get("transB", 0):
            w = weights[node.input[1]]
            w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).T.copy(), w.name))
        bias = len(node.input) > 2 and node.input[2] and beta == 1.0
        product = node.output[0] + "/matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", node.input[:2], [product], name=node.name + "/MatMul"))
        if bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], list(node.output), name=node.name + "/Add"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    kept = [w for w in graph.initializer if w.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.save(model, path)


def portable_model(trained):
    """The reference keras-hub encoder and head of `trained`, its GELU written with ops every converter takes
    (tf2onnx, LiteRT's): TensorFlow's exact GELU is an `Erfc`. A pretrainer with its masked-LM head keeps its
    heads (`.mlm_head`, `.nsp_head`), for scoring."""
    model = _pretrainer(trained) if trained.head is None and MLM_HEAD in trained.weights else build_model(trained)
    portable = ACTIVATIONS[trained.config.hidden_act].portable
    for layer in model.backbone.transformer_layers if hasattr(model, "backbone") else model.transformer_layers:
        _compat.transformer_parts(layer).intermediate.activation = portable
    if hasattr(model, "mlm_head"):  # its transform's activation is the encoder's
        _compat.masked_lm_parts(model.mlm_head).dense.activation = portable
    return model


def _pretrainer(trained):
    """The unfused pretraining model of `trained` (a pretrainer's weights, heads included)."""
    model = build_pretrainer(trained.config, nsp=NSP_HEAD in trained.weights, fused=False)
    checkpoints.assign_encoder(model.backbone, trained.weights, "export")
    assign_heads(model, trained.weights, "export")
    return model


def specs(trained):
    shape = [None] * trained.spec.input_rank
    return [tf.TensorSpec(shape, tf.int64, name=n) for n in INPUTS]


def ids_graph(trained, model):
    """A tf.function over the ONNX inputs to the head's named outputs."""
    head = trained.head

    def outputs(input_ids, attention_mask, token_type_ids):
        features = {"token_ids": tf.cast(input_ids, tf.int32), "segment_ids": tf.cast(token_type_ids, tf.int32),
                    "padding_mask": attention_mask > 0}
        if head is None:  # a pretrained encoder, and its pretraining heads at every position where it has them
            out = getattr(model, "backbone", model)(features, training=False)
            named = {"last_hidden_state": out["sequence_output"], "pooler_output": out["pooled_output"]}
            if hasattr(model, "mlm_head"):
                every = tf.broadcast_to(tf.range(tf.shape(input_ids)[1])[None], tf.shape(input_ids))
                named["mlm_logits"] = model.mlm_head(out["sequence_output"], mask_positions=every)
                if model.nsp_head is not None:
                    named["nsp_logits"] = model.nsp_head(out["pooled_output"])
            return named
        return trained.spec.outputs(trained, model(features, training=False))

    return tf.function(outputs, input_signature=specs(trained), autograph=False)


def probe_inputs(trained, texts):
    """The export's own probe rows: real texts of the vocabulary (padded, pairs with segment 1), in a batch."""
    texts = list(PROBE_TEXTS) + list(texts)
    tokenizer = FullTokenizer(trained.vocab_file, trained.do_lower_case)
    ids, segments = tf.function(lambda a, b: encode(tokenizer, a, b, trained.max_seq_length, True),
                                autograph=False)(tf.constant(texts), tf.constant(texts[::-1]))
    ids, segments = ids.to_tensor(tokenizer.pad_id).numpy(), segments.to_tensor(0).numpy()
    mask = (ids != tokenizer.pad_id).astype(np.int64)
    rows = {"input_ids": ids.astype(np.int64), "attention_mask": mask, "token_type_ids": segments.astype(np.int64)}
    if trained.spec.input_rank == 3:  # the texts as two questions' choices
        half = len(texts) // 2
        rows = {k: v[:2 * half].reshape(2, half, -1) for k, v in rows.items()}
    return rows


def _runtime_difference(path, function, probe):
    """(largest |ONNX Runtime - TensorFlow| over every output on the probe rows, the outputs' names in the
    graph's order)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, probe)))
    want = function(**{k: tf.constant(v) for k, v in probe.items()})
    return max(float(np.max(np.abs(got[k] - want[k].numpy()))) for k in names), names


def write_files(trained, directory, graph_facts):
    """Beside a graph (ONNX or LiteRT): vocab.txt, config.json, tokenizer.json and bert_mgpu.json, the last with
    what the graph leaves to the host and `graph_facts` (its outputs, weights and measured difference)."""
    storage.write_atomic(os.path.join(directory, "vocab.txt"), storage.read_bytes(trained.vocab_file))
    architecture = trained.spec.graph_architecture(trained)
    storage.write_atomic(os.path.join(directory, "config.json"),
                         json.dumps(trained.hf_config(architecture), indent=2) + "\n")
    storage.write_atomic(os.path.join(directory, "tokenizer.json"), json.dumps(tokenizer_json(trained)) + "\n")
    facts = {"kind": trained.kind, "task_type": trained.task_type, "labels": trained.labels,
             "max_seq_length": trained.max_seq_length, "truncation": trained.truncation, "pairs": trained.pairs,
             "do_lower_case": trained.do_lower_case, "facts": trained.facts, "inputs": list(INPUTS), **graph_facts}
    if CRF_WEIGHT in trained.weights:  # decoded on the host: transitions[i, j] scores tag i then tag j
        facts["crf_transitions"] = np.asarray(trained.weights[CRF_WEIGHT], np.float64).tolist()
    storage.write_atomic(os.path.join(directory, FACTS), json.dumps(facts, indent=2) + "\n")


def tokenizer_json(trained):
    """Hugging Face `tokenizers`' file for this model's tokenizer: google-bert's normalization (Unicode spaces
    to " ", control characters dropped, lower case and accents stripped when uncased), its splitting on
    white space, punctuation and CJK characters, WordPiece with `##`, [CLS] A [SEP] (B [SEP]) and the
    truncation bert_mgpu applies (the longer text of a pair loses a piece at a time; "head+tail" has no
    equivalent there and is left to the caller)."""
    vocab = read_vocab(trained.vocab_file)
    ids = {token: i for i, token in enumerate(vocab)}
    special = {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")}
    piece = lambda kind, name, segment: {kind: {"id": name, "type_id": segment}}  # noqa: E731
    truncation = None
    if trained.truncation in ("head", "tail"):
        truncation = {"direction": "Right" if trained.truncation == "head" else "Left",
                      "max_length": trained.max_seq_length, "strategy": "LongestFirst", "stride": 0}
    return {
        "version": "1.0",
        "truncation": truncation,
        "padding": None,
        "added_tokens": [],  # google-bert splits "[CLS]" written in a text like any other word
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": bool(trained.do_lower_case)},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [piece("SpecialToken", "[CLS]", 0), piece("Sequence", "A", 0), piece("SpecialToken", "[SEP]", 0)],
            "pair": [piece("SpecialToken", "[CLS]", 0), piece("Sequence", "A", 0), piece("SpecialToken", "[SEP]", 0),
                     piece("Sequence", "B", 1), piece("SpecialToken", "[SEP]", 1)],
            "special_tokens": special},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        # tf-text's WordPiece reads a word of more than 100 bytes as [UNK]; `tokenizers` counts characters.
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids},
    }
