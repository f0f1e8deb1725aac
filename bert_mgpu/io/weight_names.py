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


# ALBERT's layer tensors in Google's checkpoints (under bert/encoder/transformer/group_G/inner_group_J/) and in
# Hugging Face's (under albert.encoder.albert_layer_groups.G.albert_layers.J.), and google-bert's for the same.
_ALBERT_GOOGLE = (("attention_1/self/", "attention/self/"), ("attention_1/output/dense/", "attention/output/dense/"),
                  ("LayerNorm/", "attention/output/LayerNorm/"), ("ffn_1/intermediate/dense/", "intermediate/dense/"),
                  ("ffn_1/intermediate/output/dense/", "output/dense/"), ("LayerNorm_1/", "output/LayerNorm/"))
_ALBERT_HF = (("attention.query.", "attention.self.query."), ("attention.key.", "attention.self.key."),
              ("attention.value.", "attention.self.value."), ("attention.dense.", "attention.output.dense."),
              ("attention.LayerNorm.", "attention.output.LayerNorm."), ("ffn.", "intermediate.dense."),
              ("ffn_output.", "output.dense."), ("full_layer_layer_norm.", "output.LayerNorm."))
_ALBERT_GROUP = re.compile(r"bert/encoder/transformer/group_(\d+)/inner_group_(\d+)/(.*)")
_BERT_LAYER = re.compile(r"bert/encoder/layer_(\d+)/(.*)")


def _swap(rest, pairs, reverse=False):
    for theirs, ours in pairs:
        a, b = (ours, theirs) if reverse else (theirs, ours)
        if rest.startswith(a):
            return b + rest[len(a):]
    raise KeyError(rest)


def family_names(weights, inner_group_num=1):
    """{name: array} of a Google checkpoint -> under google-bert's names, and its family read from them:
    google-research/electra's scope (`electra/encoder/...` -> `bert/encoder/...`), ALBERT's shared layers
    (`bert/encoder/transformer/group_G/inner_group_J/...` -> `bert/encoder/layer_<G x inner_group_num + J>/...`,
    `bert/encoder/embedding_hidden_mapping_in` -> `bert/embeddings_project`), or "bert"."""
    if any(n.startswith("electra/") for n in weights):
        renamed = {("bert/" + n[len("electra/"):]) if n.startswith("electra/") else n: v for n, v in weights.items()}
        return renamed, "electra"
    if not any(_ALBERT_GROUP.match(n) for n in weights):
        return weights, "bert"
    renamed = {}
    for name, value in weights.items():
        found = _ALBERT_GROUP.fullmatch(name)
        if found:
            group, inner, rest = int(found[1]), int(found[2]), found[3]
            name = f"bert/encoder/layer_{group * inner_group_num + inner}/{_swap(rest, _ALBERT_GOOGLE)}"
        elif name.startswith("bert/encoder/embedding_hidden_mapping_in/"):
            name = "bert/embeddings_project/" + name.rsplit("/", 1)[1]
        renamed[name] = value
    return renamed, "albert"


def to_family(weights, family, inner_group_num=1):
    """The inverse of `family_names`: google-bert's names as `family`'s checkpoints keep them."""
    if family == "electra":
        return {(family + "/" + n[len("bert/"):]) if n.startswith("bert/") else n: v for n, v in weights.items()}
    if family != "albert":
        return weights
    out = {}
    for name, value in weights.items():
        found = _BERT_LAYER.fullmatch(name)
        if found:
            group, inner = divmod(int(found[1]), inner_group_num)
            name = f"bert/encoder/transformer/group_{group}/inner_group_{inner}/" + _swap(found[2], _ALBERT_GOOGLE,
                                                                                          reverse=True)
        elif name.startswith("bert/embeddings_project/"):
            name = "bert/encoder/embedding_hidden_mapping_in/" + name.rsplit("/", 1)[1]
        out[name] = value
    return out


_HF_ALBERT_LAYER = re.compile(r"albert\.encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)\.(.*)")
_HF_BERT_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.*)")
# ALBERT's other tensors in Hugging Face's names, and google-bert's; its pretraining heads go under cls.
_HF_ALBERT_OTHER = (("albert.embeddings.", "bert.embeddings."),
                    ("albert.encoder.embedding_hidden_mapping_in.", "bert.embeddings_project."),
                    ("albert.pooler.", "bert.pooler.dense."), ("predictions.", "cls.albert_predictions."),
                    ("sop_classifier.classifier.", "cls.albert_sop."))


def hf_family_to_bert(name, inner_group_num=1):
    """A Hugging Face ELECTRA or ALBERT tensor's name -> BertModel's (ELECTRA's `electra.` reads as `bert.`)."""
    found = _HF_ALBERT_LAYER.fullmatch(name)
    if found:
        layer = int(found[1]) * inner_group_num + int(found[2])
        return f"bert.encoder.layer.{layer}.{_swap(found[3], _ALBERT_HF)}"
    if name.startswith(("albert.", "predictions.", "sop_classifier.")):
        return _swap(name, _HF_ALBERT_OTHER)
    return name


def bert_to_hf_family(name, family, inner_group_num=1):
    """A BertModel tensor's name (`bert.encoder.layer.3...`) -> `family`'s in Hugging Face's layout."""
    if family == "electra":
        return "electra" + name[len("bert"):] if name.startswith("bert.") else name
    if family != "albert" or not name.startswith("bert."):
        return name
    found = _HF_BERT_LAYER.fullmatch(name)
    if found:
        group, inner = divmod(int(found[1]), inner_group_num)
        return f"albert.encoder.albert_layer_groups.{group}.albert_layers.{inner}." + _swap(found[2], _ALBERT_HF,
                                                                                             reverse=True)
    return _swap(name, _HF_ALBERT_OTHER, reverse=True)


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
