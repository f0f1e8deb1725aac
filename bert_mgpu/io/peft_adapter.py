"""A run's LoRA adapters kept apart, in PEFT's layout: `adapter_config.json` and `adapter_model.safetensors`, what
`peft.PeftModel.from_pretrained(base, directory)` reads over the model the run started from (its encoder is
frozen, so the base is the `--init_checkpoint` as transformers reads it: `bert_mgpu.export_model(init, dir,
format="hf")` for a Google release). The adapters travel with the task's head (PEFT's `modules_to_save`).

Written at a run's end into `<output_dir>/peft_adapter/`, before the adapters are added into the encoder (after
which the run's checkpoints and exports are one ordinary BERT).
"""

import json
import os
import re

import numpy as np
from safetensors.numpy import save

from bert_mgpu.core import storage
from bert_mgpu.io import weight_names
from bert_mgpu.io.trained import as_trained
from bert_mgpu.model import lora

DIRECTORY = "peft_adapter"
# transformers' module of each --lora_targets name inside `bert.encoder.layer.<i>`.
HF_MODULES = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
              "attention_output": "attention.output.dense", "intermediate": "intermediate.dense",
              "output": "output.dense"}


def write(head_model, directory):
    """`head_model` (a fine-tuned head with adapters, before they are added in) -> PEFT's adapter directory."""
    found = lora.adapters(head_model.model)
    spec = found.spec
    tensors = {}
    for name, variable in found.named_variables().items():
        m = re.fullmatch(r"bert/encoder/layer_(\d+)/.+/lora_([ab])", name)
        if m is None:
            continue  # the scale: adapter_config.json's lora_alpha / r
        target = next(t for t in spec.targets if name.startswith(f"bert/encoder/layer_{m[1]}/{lora.TARGETS[t]}/"))
        key = f"base_model.model.bert.encoder.layer.{m[1]}.{HF_MODULES[target]}.lora_{m[2].upper()}.weight"
        tensors[key] = np.ascontiguousarray(np.asarray(variable.numpy(), np.float32).T)  # torch: [out, in]
    trained = as_trained(head_model)
    saved = set()
    for name, value in trained.weights.items():
        if name.startswith(weight_names.HEAD_PREFIXES):
            hf, transpose = weight_names.google_to_hf_name(name)
            tensors[f"base_model.model.{hf}"] = np.ascontiguousarray(value.T if transpose else value, np.float32)
            saved.add(hf.split(".")[0])
    modules = "|".join(re.escape(HF_MODULES[t]) for t in spec.targets)
    config = {"peft_type": "LORA", "task_type": trained.spec.peft_task_type, "r": spec.rank,
              "lora_alpha": spec.alpha, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "target_modules": rf".*encoder\.layer\.\d+\.({modules})", "modules_to_save": sorted(saved),
              "init_lora_weights": True, "inference_mode": True, "base_model_name_or_path": None}
    storage.makedirs(directory)
    storage.write_atomic(os.path.join(directory, "adapter_model.safetensors"), save(tensors, metadata={"format": "pt"}))
    storage.write_atomic(os.path.join(directory, "adapter_config.json"), json.dumps(config, indent=2) + "\n")
    return directory
