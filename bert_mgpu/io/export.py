"""Export a trained model: SavedModel for serving, Hugging Face, Google TF1 release, keras-hub preset, ONNX
(float32 and int8) and LiteRT.

Every format is written from one `Trained`: the config, the vocabulary and the weights under Google's
names and layouts (the classifier head as google-bert's `output_weights` [labels, hidden] and
`output_bias`, pretraining heads as `cls/...`), the form `checkpoints` reads every format into. Each
export is built in a temporary directory and moved into place whole; an existing non-empty directory is
never written into. Each format reads back through `--init_checkpoint` to the same predictions.

Example:
    bert_mgpu.export_model("out", "out/export/hf", format="hf")   # a run directory, or clf.export(...)
"""

import json
import logging
import os

import numpy as np

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.input_pipeline import encode
from bert_mgpu.data.tokenization import FullTokenizer, read_vocab
from bert_mgpu.io import checkpoints, onnx_export, tflite_export, weight_names
from bert_mgpu.io.heads import ALL_FORMATS
from bert_mgpu.io.serving import write_saved_model
from bert_mgpu.io.trained import (  # noqa: F401 (export.Trained, export.read_trained as before)
    PROBE_TEXTS,
    Trained,
    as_trained,
    build_model,
    read_trained,
)
from bert_mgpu.model.mlm_objective import MaskedLanguageModel

log = logging.getLogger("bert_mgpu")
FORMATS = ALL_FORMATS  # each head's own: heads.py
GRAPH_FORMATS = ("saved_model", "onnx", "onnx_int8", "tflite")  # graphs, which express a pre-LN encoder too


def check_new_dir(path):
    """An export goes to a new (or empty) directory: one line, before anything is built, otherwise."""
    if not storage.is_remote(path) and os.path.islink(path):
        raise UserError(f"{path}: is a symbolic link; an export is written as a new directory: remove the link")
    if storage.exists(path) and (not storage.isdir(path) or storage.glob(os.path.join(path, "*"))):
        raise UserError(f"{path}: exists and is not empty; remove it or give another --export_dir")
    return path


def export_model(source, output_dir, format="saved_model", precision="float32", allow_approximate=False,
                 texts=None, extra_files=None, replace=False):
    """Write `source` (a `Trained`, a classifier, a pretrainer or a directory any reader takes) to the new
    directory `output_dir` in `format`; returns output_dir.

    precision: the SavedModel's compute dtype policy (float32, mixed_bfloat16, mixed_float16).
    allow_approximate / texts: see `write_keras_hub`.
    extra_files: {name: text} written into the export before it moves into place (the scripts' stamp).
    replace: an existing `output_dir` is replaced once the new export is whole (the scripts, for their own
        earlier export); by default it must be new or empty.
    """
    if not replace:
        check_new_dir(output_dir)
    trained = as_trained(source)
    check_format(trained, format)
    writers = {"saved_model": lambda t, d: write_saved_model(t, d, precision), "hf": write_hf, "google": write_google,
               "keras_hub": lambda t, d: write_keras_hub(t, d, allow_approximate, texts),
               "onnx": lambda t, d: onnx_export.write_onnx(t, d, False, texts or ()),
               "onnx_int8": lambda t, d: onnx_export.write_onnx(t, d, True, texts or ()),
               "tflite": lambda t, d: tflite_export.write_tflite(t, d, texts or ())}
    tmp = storage.temporary_dir_for(output_dir)  # built aside, moved into place whole
    storage.remove(tmp)
    storage.makedirs(tmp)
    try:
        writers[format](trained, tmp)
        for name, text in (extra_files or {}).items():
            storage.write_atomic(os.path.join(tmp, name), text)
    except BaseException:
        storage.remove(tmp)
        raise
    storage.replace_dir(tmp, output_dir)
    log.info("exported %s (%s) to %s", trained.kind, format, output_dir)
    return output_dir


def check_format(trained, format):
    """UserError when `trained` (a `Trained`) cannot be written in `format`; the scripts check every format
    asked before writing the first, so a list of formats is written whole or not at all."""
    if format not in FORMATS:
        raise UserError(f"--export_format={format}: expected one of {', '.join(FORMATS)}")
    onnx_export.check_available(format)
    if format not in GRAPH_FORMATS and trained.config.encoder_ln_mode == "pre-ln":
        raise UserError(f"--export_format={format}: this model's encoder is pre-LN, which {format} cannot "
                        "express (its BERT is post-LN); export it as saved_model or onnx")
    trained.spec.check_format(format)
    if format == "hf" and trained.head is not None:
        trained.head.hf_architecture(trained.weights)  # a head transformers has no class for (a CRF) says so
    if trained.config.model_type != "bert":
        _check_family(trained, format)


# transformers' ELECTRA classes whose head is bert_mgpu's; its sequence and choice heads add a dense layer
# before the output one, so a google-research/electra head (the output layer on [CLS]) has no class there.
_ELECTRA_HF = {"BertForTokenClassification": "ElectraForTokenClassification",
               "BertForQuestionAnswering": "ElectraForQuestionAnswering"}


def _check_family(trained, format):
    if format == "keras_hub":
        raise UserError(f"--export_format=keras_hub: an {trained.config.model_type.upper()} model is written as "
                        "saved_model, onnx, tflite, google (its family's Google names) or hf")
    if format == "hf" and _hf_architecture(trained) is None:
        raise UserError(f"--export_format=hf: transformers has no ELECTRA class with this {trained.kind}'s head "
                        "(its ElectraFor... heads add a dense layer); export saved_model, onnx or google")


def _hf_architecture(trained):
    """transformers' class of `trained`, or None: an ELECTRA head it has no class for."""
    if trained.head is not None:
        architecture = trained.head.hf_architecture(trained.weights)
    elif "cls/predictions/output_bias" in trained.weights:
        architecture = MaskedLanguageModel().hf_architecture(trained.weights)
    else:
        architecture = "BertModel"
    if trained.config.model_type == "electra":
        return "ElectraModel" if architecture == "BertModel" else _ELECTRA_HF.get(architecture)
    if trained.config.model_type == "albert":  # ALBERT's task classes have BERT's heads
        return "Albert" + architecture[len("Bert"):]
    return architecture


def _copy_vocab(trained, directory, name="vocab.txt"):
    storage.write_atomic(os.path.join(directory, name), storage.read_bytes(trained.vocab_file))


# ---------------------------------------------------------------- Google TF1 release

def write_google(trained, directory):
    """`bert_model.ckpt.*` under google-bert's names, `bert_config.json`, `vocab.txt`."""
    config = {**trained.config.to_dict(), **trained.labels_config(), "do_lower_case": trained.do_lower_case}
    config.pop("encoder_ln_mode")  # post-LN, google-bert's only kind
    storage.write_atomic(os.path.join(directory, "bert_config.json"), json.dumps(config, indent=2) + "\n")
    _copy_vocab(trained, directory)
    c = trained.config  # ELECTRA's names under electra/, ALBERT's shared layers under bert/encoder/transformer/
    weights = weight_names.to_family(trained.weights, c.model_type, c.inner_group_num)
    checkpoints.write_google_checkpoint(weights, os.path.join(directory, "bert_model.ckpt"))


# ---------------------------------------------------------------- Hugging Face

def write_hf(trained, directory):
    """config.json, model.safetensors, vocab.txt and the tokenizer's files, as transformers saves
    `BertForSequenceClassification` (a classifier), `BertForTokenClassification` (a tagger),
    `BertForQuestionAnswering`, `BertForMultipleChoice`,
    `BertForPreTraining` (masked-LM and next-sentence heads) or `BertForMaskedLM`."""
    from safetensors.numpy import save_file

    tensors, c = {}, trained.config
    for name, value in trained.weights.items():
        hf, transpose = weight_names.google_to_hf_name(name)
        hf = weight_names.bert_to_hf_family(hf, c.model_type, c.inner_group_num)  # ELECTRA's, ALBERT's names
        tensors[hf] = np.ascontiguousarray(value.T if transpose else value, np.float32)
    architecture = _hf_architecture(trained)
    if architecture in ("BertModel", "ElectraModel", "AlbertModel"):  # their own names have no prefix
        tensors = {k.split(".", 1)[1]: v for k, v in tensors.items()}
    config = trained.hf_config(architecture)
    storage.write_atomic(os.path.join(directory, "config.json"), json.dumps(config, indent=2) + "\n")
    weights_file = os.path.join(directory, "model.safetensors")
    save_file(tensors, weights_file, metadata={"format": "pt"})
    storage.follow_umask(weights_file)  # safetensors writes it 0600
    _copy_vocab(trained, directory)
    tokenizer = {"tokenizer_class": "BertTokenizer", "do_lower_case": trained.do_lower_case,
                 "strip_accents": None, "tokenize_chinese_chars": True, "model_max_length": c.max_position_embeddings,
                 "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                 "mask_token": "[MASK]"}
    if trained.truncation == "tail":  # transformers' tokenizers cut a long text's start instead of its end
        tokenizer["truncation_side"] = "left"
    storage.write_atomic(os.path.join(directory, "tokenizer_config.json"), json.dumps(tokenizer, indent=2) + "\n")
    specials = {k: v for k, v in tokenizer.items() if k.endswith("_token")}
    storage.write_atomic(os.path.join(directory, "special_tokens_map.json"), json.dumps(specials, indent=2) + "\n")


# ---------------------------------------------------------------- keras-hub

def write_keras_hub(trained, directory, allow_approximate=False, texts=None):
    """A keras-hub preset: `BertTextClassifier` (with its preprocessor) for a classifier, `BertBackbone`
    and `BertTokenizer` otherwise (keras-hub has no BERT pretraining heads; they are left out).

    keras-hub's BERT computes tanh-GELU and lower-cases by NFKC case folding; a model trained with exact
    GELU, or on text where the two lower-casings differ, gives other outputs there. The preset is loaded
    back and compared on PROBE_TEXTS and `texts`; where the outputs differ by more than 1e-4 the export is
    refused with the measured difference unless `allow_approximate`.
    """
    import keras_hub

    classifier = trained.spec.keras_hub_task  # keras-hub's BertTextClassifier; a BertBackbone otherwise
    if classifier and not allow_approximate and (
            trained.truncation != "head" or trained.facts.get("doc_stride")):
        how = "windows (--doc_stride)" if trained.facts.get("doc_stride") else f"{trained.truncation} (--truncation)"
        raise UserError(f"--export_format=keras_hub: keras-hub's preprocessor keeps the head of a long text; this "
                        f"model reads its {how}. Pass --allow_approximate_export to write it anyway")
    c = trained.config
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=c.vocab_size, num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
        hidden_dim=c.hidden_size, intermediate_dim=c.intermediate_size, dropout=c.hidden_dropout_prob,
        max_sequence_length=c.max_position_embeddings, num_segments=c.type_vocab_size)
    checkpoints.assign_encoder(backbone, trained.weights, "export")
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=read_vocab(trained.vocab_file),
                                               lowercase=trained.do_lower_case)
    if classifier:
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer,
                                                                       sequence_length=trained.max_seq_length)
        task = keras_hub.models.BertTextClassifier(backbone, num_classes=max(len(trained.labels), 1),
                                                   preprocessor=preprocessor, dropout=c.hidden_dropout_prob)
        head = task.output_dense
        head.kernel.assign(trained.weights["output_weights"].T)
        head.bias.assign(trained.weights["output_bias"])
        task.save_to_preset(directory)
        # keras-hub's classifier has no label names; its metadata.json (written, never read by keras-hub)
        # carries them for `--init_checkpoint`.
        meta = os.path.join(directory, "metadata.json")
        facts = {"labels": trained.labels, "task_type": trained.task_type, "max_seq_length": trained.max_seq_length}
        storage.write_atomic(meta, json.dumps({**storage.read_json(meta), "bert_mgpu": facts}, indent=4) + "\n")
    else:
        backbone.save_to_preset(directory)
        tokenizer.save_to_preset(directory)
    difference = _keras_hub_difference(trained, directory, list(PROBE_TEXTS) + list(texts or []))
    exact = c.hidden_act in ("gelu_new", "gelu_pytorch_tanh")
    if difference > 1e-4 and not allow_approximate:
        why = [] if exact else [f"tanh-GELU where this model has {c.hidden_act}"]
        why += ["NFKC case folding where this model lower-cases as google-bert"] if trained.do_lower_case else []
        raise UserError(f"--export_format=keras_hub: keras-hub's BERT computes {' and '.join(why or ['otherwise'])}; "
                        f"its outputs differ from this model's by up to {difference:.2g} on "
                        f"{len(PROBE_TEXTS) + len(texts or [])} texts. "
                        "Pass --allow_approximate_export to write it anyway")
    if difference > 1e-4:
        log.warning("keras-hub export: outputs differ from this model's by up to %.2g", difference)


def _keras_hub_difference(trained, directory, texts):
    """Largest |difference| between this model's outputs and the preset's (loaded back from `directory`):
    probabilities (scores for a regression) of a classifier, the pooled output of an encoder."""
    import keras_hub
    import tensorflow as tf

    texts = tf.constant(texts)
    ours_tok = FullTokenizer(trained.vocab_file, trained.do_lower_case)
    # Traced: called eagerly, keras-hub's tokenizer returns Python lists.
    ids, segments = tf.function(lambda t: encode(ours_tok, t, None, trained.max_seq_length, False,
                                                 truncation=trained.truncation),
                                 autograph=False)(texts)
    features = {"token_ids": ids.to_tensor(0), "segment_ids": segments.to_tensor(0)}
    features["padding_mask"] = tf.not_equal(features["token_ids"], 0)
    ours = build_model(trained)
    if trained.spec.keras_hub_task:
        theirs = keras_hub.models.BertTextClassifier.from_preset(directory)
        a, b = ours(features, training=False), theirs.predict(texts, verbose=0)
        head = trained.head
        a, b = head.outputs(a), head.outputs(b)
    else:
        theirs = keras_hub.models.BertBackbone.from_preset(directory)
        tok = keras_hub.models.BertTokenizer.from_preset(directory)
        packer = keras_hub.layers.MultiSegmentPacker(sequence_length=trained.max_seq_length,
                                                     start_value=tok.cls_token_id, end_value=tok.sep_token_id)
        their_ids, their_segments = packer(tok(texts))
        a = ours(features, training=False)["pooled_output"]
        b = theirs({"token_ids": their_ids, "segment_ids": their_segments,
                    "padding_mask": their_ids != tok.pad_token_id}, training=False)["pooled_output"]
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
