"""Google's TF1 names for every BERT tensor, and how keras-hub's and Hugging Face's names map to them.

Google's names (`bert/encoder/layer_3/attention/self/query/kernel`, kernels [in, out]) are the lingua
franca of `checkpoints` and `export`: keras-hub paths map to them one way (its attention kernels are
[hidden, heads, head_dim]), Hugging Face names both ways (its Linear weights are [out, in]).
"""

import re

# keras-hub BertBackbone variable path -> Google TF1 name.
_KERAS_TO_GOOGLE = [
    (r"token_embedding/embeddings", r"bert/embeddings/word_embeddings"),
    (r"position_embedding/embeddings", r"bert/embeddings/position_embeddings"),
    (r"segment_embedding/embeddings", r"bert/embeddings/token_type_embeddings"),
    (r"embeddings_layer_norm/(gamma|beta)", r"bert/embeddings/LayerNorm/\1"),
    (r"embeddings_projection/(kernel|bias)", r"bert/embeddings_project/\1"),  # ELECTRA's
    (r"transformer_layer_(\d+)/self_attention_layer/(query|key|value)/(kernel|bias)",
     r"bert/encoder/layer_\1/attention/self/\2/\3"),
    (r"transformer_layer_(\d+)/self_attention_layer/attention_output/(kernel|bias)",
     r"bert/encoder/layer_\1/attention/output/dense/\2"),
    (r"transformer_layer_(\d+)/self_attention_layer_norm/(gamma|beta)",
     r"bert/encoder/layer_\1/attention/output/LayerNorm/\2"),
    (r"transformer_layer_(\d+)/feedforward_intermediate_dense/(kernel|bias)",
     r"bert/encoder/layer_\1/intermediate/dense/\2"),
    (r"transformer_layer_(\d+)/feedforward_output_dense/(kernel|bias)", r"bert/encoder/layer_\1/output/dense/\2"),
    (r"transformer_layer_(\d+)/feedforward_layer_norm/(gamma|beta)", r"bert/encoder/layer_\1/output/LayerNorm/\2"),
    (r"pooled_dense/(kernel|bias)", r"bert/pooler/dense/\1"),
]
# Head tensors a bert_mgpu checkpoint keeps in Keras' layout, and their Google name.
KERAS_LAYOUT_HEADS = {"cls/seq_relationship/kernel": "cls/seq_relationship/output_weights"}
# Tensors a classifier does not use: pretraining heads and other tasks' heads (ELECTRA's discriminator and
# generator heads, and the generator of a checkpoint that keeps both).
HEAD_PREFIXES = ("cls/", "classifier", "output_weights", "output_bias", "crf/", "discriminator_predictions",
                 "generator")


def family_names(weights):
    """{name: array} under a family's own scope -> under google-bert's (`electra/encoder/...` ->
    `bert/encoder/...`), and the family read from the names: "electra" or "bert"."""
    if not any(n.startswith("electra/") for n in weights):
        return weights, "bert"
    renamed = {("bert/" + n[len("electra/"):]) if n.startswith("electra/") else n: v for n, v in weights.items()}
    return renamed, "electra"


def to_family(weights, family):
    """The inverse of `family_names`: google-bert's encoder names under `family`'s scope."""
    if family == "bert":
        return weights
    return {(family + "/" + n[len("bert/"):]) if n.startswith("bert/") else n: v for n, v in weights.items()}


def google_name(keras_path):
    for pattern, repl in _KERAS_TO_GOOGLE:
        if re.fullmatch(pattern, keras_path):
            return re.sub(pattern, repl, keras_path)
    raise KeyError(f"no Google name for backbone variable {keras_path}")


def google_shape(keras_path, shape):
    """Keras' multi-head attention keeps [hidden, heads, head_dim] kernels; Google keeps [hidden, hidden]."""
    shape = tuple(shape)
    if re.search(r"/(query|key|value)/kernel$", keras_path):
        return (shape[0], shape[1] * shape[2])
    if re.search(r"/(query|key|value)/bias$", keras_path):
        return (shape[0] * shape[1],)
    if keras_path.endswith("attention_output/kernel"):
        return (shape[0] * shape[1], shape[2])
    return shape


def fold_to_google_shape(name, value):
    """A Keras-shaped attention tensor under its Google name -> Google's 2-D/1-D shape."""
    if re.search(r"/attention/self/(query|key|value)/kernel$", name) and value.ndim == 3:
        return value.reshape(value.shape[0], -1)
    if re.search(r"/attention/self/(query|key|value)/bias$", name) and value.ndim == 2:
        return value.reshape(-1)
    if name.endswith("/attention/output/dense/kernel") and value.ndim == 3:
        return value.reshape(-1, value.shape[2])
    return value


# ---------------------------------------------------------------- Hugging Face

# Hugging Face head tensors kept in Google's layout, by their Google names (None: not stored by Google).
_HF_HEADS = {
    "cls.predictions.bias": ("cls/predictions/output_bias", False),
    "cls.seq_relationship.weight": ("cls/seq_relationship/output_weights", False),
    "cls.seq_relationship.bias": ("cls/seq_relationship/output_bias", False),
    "cls.predictions.decoder.weight": (None, False),  # tied to the word embeddings
    "cls.predictions.decoder.bias": (None, False),
    # BertForSequenceClassification's head is google-bert run_classifier's: [labels, hidden] both ways.
    "classifier.weight": ("output_weights", False),
    "classifier.bias": ("output_bias", False),
    # BertForQuestionAnswering's head is google-bert run_squad's: [2, hidden] both ways.
    "qa_outputs.weight": ("cls/squad/output_weights", False),
    "qa_outputs.bias": ("cls/squad/output_bias", False),
}


def google_to_hf_name(name):
    """`bert/encoder/layer_0/attention/self/query/kernel` -> (`bert.encoder.layer.0....weight`, transpose?)."""
    for hf, (google, transpose) in _HF_HEADS.items():
        if google == name:
            return hf, transpose
    parts = name.split("/")
    leaf, scope = parts[-1], parts[:-1]
    transpose = leaf == "kernel"
    if leaf.endswith("_embeddings"):
        scope, leaf = parts, "weight"
    else:
        leaf = {"kernel": "weight", "gamma": "weight", "beta": "bias"}.get(leaf, leaf)
    hf = ".".join(scope + [leaf])
    return re.sub(r"layer_(\d+)\.", r"layer.\1.", hf), transpose


def hf_to_google_name(name):
    """`bert.encoder.layer.0.attention.self.query.weight` -> (`bert/encoder/layer_0/.../kernel`, transpose?)."""
    if name.endswith("position_ids"):
        return None, False
    if name in _HF_HEADS:
        return _HF_HEADS[name]
    n = name.split(".", 1)[1] if name.startswith(("bert.", "electra.")) else name
    n = re.sub(r"layer\.(\d+)\.", r"layer_\1.", n)
    parts = n.split(".")
    leaf, scope = parts[-1], parts[:-1]
    transpose = False
    if scope and scope[-1] == "LayerNorm":
        leaf = {"weight": "gamma", "bias": "beta"}.get(leaf, leaf)
    elif scope and scope[-1].endswith("_embeddings") and leaf == "weight":
        leaf = None
    elif leaf == "weight":
        leaf, transpose = "kernel", True
    parts = scope + ([leaf] if leaf else [])
    prefix = "" if parts[0] in ("cls", "classifier", "discriminator_predictions") or parts[0].startswith(
        "generator") else "bert/"
    return prefix + "/".join(parts), transpose
