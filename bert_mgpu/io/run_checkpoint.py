"""bert_mgpu's own checkpoints: what a training checkpoint holds (the encoder under Google's names, so
`checkpoints.load_pretrained` reads it as any release; the head; the training state) and the files that
make a directory holding one loadable."""

import json
import os

from bert_mgpu.core import storage
from bert_mgpu.io.checkpoints import RUN_FILE
from bert_mgpu.io.weight_names import google_name
from bert_mgpu.model import lora
from bert_mgpu.model.modeling import encoder_variables, head_variables


def training_checkpoint(model, optimizer=None, step=None, heads=None, **state):
    """bert_mgpu's checkpoint: encoder under Google names (readable by `load_pretrained`), head, state.

    `heads` ({name: variable}) replaces the classifier head for a pretraining model; `state` adds
    more variables (elapsed time, ...).
    """
    import tensorflow as tf

    encoder = {google_name(v.path): v for v in encoder_variables(model.backbone)}
    adapted = lora.adapters(model)
    if adapted is not None:  # beside the encoder, under Google-style names; a reader folds them in (lora.fold)
        encoder.update(adapted.named_variables())
    objects = {"encoder": encoder}
    objects.update({"heads": heads} if heads is not None else {"head": _head(model)})
    if optimizer is not None:
        objects["optimizer"] = optimizer
    if step is not None:
        objects["step"] = step
    objects.update(state)
    return tf.train.Checkpoint(**objects)


def _head(model):
    return head_variables(model)  # a tagger's CRF transitions go with its head


def restore_head(model, prefix):
    """The classifier head of a bert_mgpu checkpoint (the encoder goes through `assign_encoder`)."""
    import tensorflow as tf

    tf.train.Checkpoint(head=_head(model)).read(prefix).expect_partial()


def write_run_files(directory, run, config, vocab_file):
    """bert_mgpu.json (run metadata + config), bert_config.json and vocab.txt: what makes a directory
    holding a bert_mgpu checkpoint loadable by `load_pretrained`."""
    run = {**run, "bert_config": config.to_dict()}
    storage.write_atomic(os.path.join(directory, "bert_config.json"), json.dumps(config.to_dict(), indent=2) + "\n")
    vocab = os.path.join(directory, "vocab.txt")
    if os.path.abspath(vocab_file) != os.path.abspath(vocab):  # a copy, never written through a link
        storage.write_atomic(vocab, storage.read_bytes(vocab_file))
    # Last: the file that makes the directory a bert_mgpu run, so a directory that has it is whole.
    storage.write_atomic(os.path.join(directory, RUN_FILE), json.dumps(run, indent=2) + "\n")
