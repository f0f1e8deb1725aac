"""bert_mgpu: fine-tune and run google-research/bert checkpoints on every GPU (or CPU core) of a machine.

    import bert_mgpu
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    clf = bert_mgpu.BertClassifier.from_pretrained("uncased_L-12_H-768_A-12/bert_model.ckpt",
                                                   labels=["0", "1"], towers=towers)
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

# Number GPUs as nvidia-smi does (PCI bus order; CUDA's default puts the fastest first) before anything can
# start CUDA, so CUDA_VISIBLE_DEVICES=1, `nvidia-smi -i 1` and bert_mgpu's GPU 1 are one card. A user's own
# CUDA_DEVICE_ORDER stays.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

# Loaded on first use, so that `import bert_mgpu.cli` (every script's first import) does not load TensorFlow
# before the script has quieted its start-up lines.
_HOMES = {"BertClassifier": "api.classifier", "Distiller": "api.distiller", "BertConfig": "model.config",
          "DevicePlan": "parallel.devices",
          "Towers": "parallel.devices", "plan_devices": "parallel.devices", "make_strategy": "parallel.distribute",
          "UserError": "core.errors", "BertPretrainer": "api.pretraining", "Budget": "train.budget",
          "Validation": "train.budget", "PretrainingData": "data.pretraining_input", "Example": "data.examples",
          "get_task": "data.tasks", "FullTokenizer": "data.tokenization", "export_model": "io.export",
          "TrainConfig": "train.train_config", "PretrainConfig": "train.train_config", "BertTagger": "api.tagger",
          "read_tagged": "data.tagged", "tag_set": "data.tagged", "Sentence": "data.tagged",
          "BertQuestionAnswerer": "api.question_answering", "read_squad": "data.squad", "Question": "data.squad",
          "BertMultipleChoice": "api.multiple_choice", "read_choices": "data.choices",
          "ChoiceQuestion": "data.choices", "BertGlobalPointer": "api.global_pointer", "read_spans": "data.spans",
          "entity_types": "data.spans", "SpanSentence": "data.spans",
          "load_exported": "io.exported", "Exported": "io.exported",
          "ExportedTagger": "io.exported_tagger", "ExportedQuestionAnswerer": "io.exported_qa",
          "ExportedMultipleChoice": "io.exported_choice", "ExportedGlobalPointer": "io.exported_global_pointer"}
__all__ = sorted(_HOMES)


def __getattr__(name):
    if name not in _HOMES:
        raise AttributeError(f"module 'bert_mgpu' has no attribute {name!r}")
    # The others load TensorFlow: quietly, as scripts do.
    if _HOMES[name] not in ("core.errors", "model.config", "train.train_config", "io.exported",
                            "io.exported_tagger", "io.exported_qa", "io.exported_choice",
                            "io.exported_global_pointer"):
        quiet = importlib.import_module("bert_mgpu.core.quiet")
        quiet.start_tensorflow_quietly()
        quiet.console_logging()
    value = getattr(importlib.import_module(f"bert_mgpu.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


# Module paths from before the layers were subpackages (`bert_mgpu.loop`, `from bert_mgpu import plot`) name
# the same module objects as their new ones (`bert_mgpu.train.loop`), so notebooks written then keep working.
_LAYER_OF = {"_compat": "core", "checkpoints": "io", "checks_gpu": "cli", "classifier": "api",
             "cluster": "parallel", "config": "model", "devices": "parallel", "distribute": "parallel",
             "embeddings": "api", "errors": "core", "evaluation": "train", "export": "io",
             "fused_encoder": "model", "glue": "api", "glue_tasks": "data", "gpu_check": "cli",
             "guards": "parallel", "input_pipeline": "data", "kernels": "model", "loading": "io", "loop": "train",
             "memory": "train", "metrics": "core", "modeling": "model", "objectives": "model",
             "optimization": "train", "outputs": "io", "plot": "io", "precision": "parallel", "pretraining": "api",
             "pretraining_input": "data", "pretraining_model": "model", "pretraining_records": "data",
             "quiet": "core", "run_dir": "io", "schedules": "train", "serving": "io", "session": "train",
             "storage": "core", "supervise": "core", "tasks": "data", "text_files": "data", "tokenization": "data",
             "train_config": "train", "trained": "io", "training": "train", "vocab": "data", "weight_names": "io"}


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in _LAYER_OF:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        name = spec.name.rpartition(".")[2]
        return importlib.import_module(f"{__name__}.{_LAYER_OF[name]}.{name}")

    def exec_module(self, module):
        pass


sys.meta_path.append(_OldPath())


def __dir__():
    return sorted([*globals(), *_HOMES])


__version__ = "0.1.0"
