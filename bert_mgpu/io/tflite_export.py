"""LiteRT (TensorFlow Lite) export: each head's ids-in graph as `model.tflite`, with dynamic-range int8 weights,
for phones and small CPUs, and the same files a server needs beside it as the ONNX export.

The graph is the ONNX export's (onnx_export.ids_graph: the reference keras-hub encoder, exact GELU written
with `erf`), its weights frozen into constants, converted by `tf.lite.TFLiteConverter` with
`Optimize.DEFAULT`: each dense kernel stored as int8 with a scale per output channel, multiplied in int8
where LiteRT's kernels can (XNNPACK), activations float32. Only LiteRT's built-in ops are used, so the plain
interpreter runs it (no Flex delegate). Inputs `input_ids`, `attention_mask`, `token_type_ids` (int64,
`[batch, length]` of any size: resize the inputs, or call the signature runner, which does), outputs under
the ONNX export's names. The export is run by LiteRT's interpreter (`ai-edge-litert`) on probe texts before it
is written; the largest difference to TensorFlow is kept in `bert_mgpu.json`.

Example:
    bert_mgpu.export_model("out", "out/export/tflite", format="tflite")
    runner = ai_edge_litert.interpreter.Interpreter("out/export/tflite/model.tflite").get_signature_runner()
"""

import logging
import os

import numpy as np
import tensorflow as tf

from bert_mgpu.core import storage
from bert_mgpu.io import onnx_export

log = logging.getLogger("bert_mgpu")
SIGNATURE = "serving_default"


def write_tflite(trained, directory, probe_texts=()):
    """Write `trained` (an `export.Trained`) as `model.tflite` and its files into the empty `directory`."""
    function = onnx_export.ids_graph(trained, onnx_export.portable_model(trained))
    data = convert(function, onnx_export.specs(trained))
    probe = onnx_export.probe_inputs(trained, probe_texts)
    difference, outputs = _runtime_difference(data, function, probe)
    storage.write_atomic(os.path.join(directory, "model.tflite"), data)
    onnx_export.write_files(trained, directory, {"outputs": outputs, "weights": "int8 (dynamic range)",
                                                 "signature": SIGNATURE, "max_difference_to_tensorflow": difference})
    log.info("LiteRT export: %.1f MB, the interpreter within %.2g of TensorFlow on %d probe rows", len(data) / 1e6,
             difference, len(probe["input_ids"]))
    return directory


def convert(function, input_signature):
    """The flatbuffer of `function` (a tf.function with variables) with int8 weights. The converter keeps a
    variable it reads through a Keras 3 layer as a READ_VARIABLE op, which the interpreter cannot run
    (nothing assigns it), so the variables are made constants first; the frozen function returns a flat
    list, so it is called from one that names its outputs again (the signature's names)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = function.get_concrete_function()
    names = sorted(concrete.structured_outputs)  # tf.nest.flatten's order of a dict
    frozen = convert_variables_to_constants_v2(concrete)

    def named(input_ids, attention_mask, token_type_ids):  # onnx_export.INPUTS
        return dict(zip(names, tf.nest.flatten(frozen(input_ids=input_ids, attention_mask=attention_mask,
                                                      token_type_ids=token_type_ids))))

    wrapper = tf.function(named, input_signature=input_signature, autograph=False)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([wrapper.get_concrete_function()], tf.Module())
    converter.optimizations = [tf.lite.Optimize.DEFAULT]  # dynamic range: int8 weights, float activations
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex: the plain interpreter
    return converter.convert()


def _runtime_difference(data, function, probe):
    """(largest |LiteRT - TensorFlow| over every output on the probe rows, the output names)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=data).get_signature_runner(SIGNATURE)
    got = runner(**probe)
    want = function(**{k: tf.constant(v) for k, v in probe.items()})
    names = sorted(got)
    return max(float(np.max(np.abs(got[k] - want[k].numpy()))) for k in names), names
