"""bert_mgpu: fine-tune and run google-research/bert checkpoints on every GPU (or CPU core) of a machine.

    import bert_mgpu
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    clf = bert_mgpu.BertClassifier.from_pretrained("uncased_L-12_H-768_A-12/bert_model.ckpt",
                                                   labels=["0", "1"], towers=towers)
"""

import importlib
import os

# Number GPUs as nvidia-smi does (PCI bus order; CUDA's default puts the fastest first) before anything can
# start CUDA, so CUDA_VISIBLE_DEVICES=1, `nvidia-smi -i 1` and bert_mgpu's GPU 1 are one card. A user's own
# CUDA_DEVICE_ORDER stays.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

# Loaded on first use, so that `import bert_mgpu.cli` (every script's first import) does not load TensorFlow
# before the script has quieted its start-up lines.
_HOMES = {"BertClassifier": "classifier", "BertConfig": "config", "DevicePlan": "devices", "Towers": "devices",
          "plan_devices": "devices", "make_strategy": "distribute", "UserError": "errors",
          "BertPretrainer": "pretraining", "Budget": "pretraining", "Validation": "pretraining",
          "PretrainingData": "pretraining_input", "Example": "tasks", "get_task": "tasks",
          "FullTokenizer": "tokenization", "export_model": "export", "TrainConfig": "train_config",
          "PretrainConfig": "train_config"}
__all__ = sorted(_HOMES)


def __getattr__(name):
    if name not in _HOMES:
        raise AttributeError(f"module 'bert_mgpu' has no attribute {name!r}")
    if _HOMES[name] not in ("errors", "config", "train_config"):  # the others load TensorFlow: quietly, as scripts do
        quiet = importlib.import_module("bert_mgpu.quiet")
        quiet.start_tensorflow_quietly()
        quiet.console_logging()
    value = getattr(importlib.import_module(f"bert_mgpu.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_HOMES])


__version__ = "0.1.0"
