"""A SavedModel for TensorFlow Serving that takes raw text: tokenization is part of the graph.

The graph tokenizes as training does (the same `FullTokenizer` and `encode`, tensorflow-text ops), runs the
reference (unfused) keras-hub encoder with the trained weights, and returns probabilities, label ids and
label names (scores for a regression; encoder outputs for a pretrained model). A process that imports
only TensorFlow and tensorflow-text serves it. Built with Keras' `ExportArchive`.

The directory also keeps, in `assets.extra/` (which TensorFlow Serving ignores), the config, vocabulary
and run facts, and the archive keeps the weights under Google's names, so `--init_checkpoint` reads an
export back (`read_saved_model`).

Example:
    clf.export("serving/1", format="saved_model")
    served = tf.saved_model.load("serving/1")   # after `import tensorflow_text`
    served.signatures["serving_default"](text=tf.constant(["a fine film"]))["probabilities"]
"""

import json
import os

import keras
import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.data.doc_windows import pool_in_graph, windows_in_graph
from bert_mgpu.data.input_pipeline import encode
from bert_mgpu.data.tokenization import FullTokenizer
from bert_mgpu.io import weight_names
from bert_mgpu.io.checkpoints import EXTRA, META  # where an export's own facts go (read back there)
from bert_mgpu.io.heads import SQUAD_DEFAULTS  # noqa: F401 (serving.SQUAD_DEFAULTS, as before)
from bert_mgpu.io.trained import build_model
from bert_mgpu.model.modeling import encoder_variables


def _text_specs(pairs):
    names = ("text_a", "text_b") if pairs else ("text",)
    return [tf.TensorSpec([None], tf.string, name=n) for n in names]


def _id_specs():
    return [tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec([None, None], tf.int32, name="segment_ids")]


def write_saved_model(trained, path, precision="float32"):
    """Write `trained` (an `export.Trained`) as a SavedModel in the empty directory `path`.

    Signatures: `serving_default` (raw strings: `text`, `text_a` and `text_b` for a pair task, or `question` and
    `context` for a question answerer: span_serving.py) and
    `serving_ids` (`token_ids` and `segment_ids`, [CLS] ... [SEP] as training packs them, 0 = [PAD]).
    """
    tokenizer = FullTokenizer(trained.vocab_file, trained.do_lower_case)
    spec = trained.spec  # the head kind: its outputs and its raw-text endpoint (heads.py)
    model = build_model(trained, precision)
    backbone = getattr(model, "backbone", model)
    labels = tf.constant(trained.labels or [""])
    pad = tokenizer.pad_id

    def run(ids, segments):
        features = {"token_ids": ids, "segment_ids": segments, "padding_mask": tf.not_equal(ids, pad)}
        return spec.served(trained, model(features, training=False), features)

    def from_text(text_a, text_b=None):
        if trained.facts.get("doc_stride"):  # a long text's windows, their logits pooled (data/doc_windows.py)
            ids, segments, real, doc_of = windows_in_graph(tokenizer, text_a, trained.max_seq_length,
                                                           trained.facts["doc_stride"])
            out = model({"token_ids": ids, "segment_ids": segments, "padding_mask": real}, training=False)
            pooled = pool_in_graph(out, doc_of, tf.shape(text_a)[0], trained.facts.get("window_pooling", "mean"))
            return trained.head.serving(pooled, labels)
        ids, segments = encode(tokenizer, text_a, text_b, trained.max_seq_length, text_b is not None,
                               truncation=trained.truncation)
        return run(ids.to_tensor(pad), segments.to_tensor(0))

    def text_endpoint(pairs):
        if pairs:
            return _text_specs(True), lambda text_a, text_b: from_text(text_a, text_b)
        return _text_specs(False), lambda text: from_text(text)

    # The model is not `track`ed: under TensorFlow a Keras variable and the tf.Variable inside it are two
    # trackables that SavedModel saves apart, so every weight was stored twice (issue 68 item 1). The endpoints
    # track the tf.Variables they read, and the weights' collection below names those same objects.
    archive = keras.export.ExportArchive()
    text_specs, endpoint, extra = spec.endpoint(trained, tokenizer, model, text_endpoint)
    for name, variable in extra.items():  # a weight the endpoint reads besides the model's (a CRF's)
        archive.add_variable_collection(name.split("/")[0], [variable])
    archive.add_endpoint("serving_default", endpoint, text_specs)
    archive.add_endpoint("serving_ids", run, _id_specs())
    # Every weight, its Google name in the meta file: what `read_saved_model` reads back.
    named = {**_named_variables(model, backbone), **extra}
    archive.add_variable_collection("bert_weights", [_tf_variable(v) for v in named.values()])
    archive.write_out(path, verbose=False)
    storage.makedirs(os.path.join(path, EXTRA))
    meta = {"kind": trained.kind, "labels": trained.labels, "task_type": trained.task_type, "facts": trained.facts,
            "max_seq_length": trained.max_seq_length, "pairs": trained.pairs,
            "do_lower_case": trained.do_lower_case, "precision": precision, "weights": list(named),
            "signatures": {"serving_default": [s.name for s in text_specs],
                           "serving_ids": [s.name for s in _id_specs()]}}
    storage.write_atomic(os.path.join(path, EXTRA, META), json.dumps(meta, indent=2) + "\n")
    storage.write_atomic(os.path.join(path, EXTRA, "bert_config.json"),
                         json.dumps(trained.config.to_dict(), indent=2) + "\n")
    storage.write_atomic(os.path.join(path, EXTRA, "vocab.txt"), storage.read_bytes(trained.vocab_file))
    return path


def _tf_variable(variable):
    """The tf.Variable holding a Keras variable's value (outside an autocast scope `value` is that variable)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _named_variables(model, backbone):
    named = {weight_names.google_name(v.path): v for v in encoder_variables(backbone)}
    if getattr(model, "head", None) is not None:
        named["classifier/kernel"], named["classifier/bias"] = model.head.kernel, model.head.bias
    return named
