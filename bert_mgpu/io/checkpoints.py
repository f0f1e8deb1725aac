"""Checkpoint readers and writers. Every format is read into one dict {Google TF1 name: float32 array}.

Google's names (`bert/encoder/layer_3/attention/self/query/kernel`, kernels [in, out]) are the lingua
franca: a Google release is read as is, Hugging Face safetensors are renamed (Linear weights transposed),
a keras-hub preset and bert_mgpu's own checkpoints are read back from their variables. One function,
`assign_encoder`, then puts that dict into a keras-hub BertBackbone and fails listing every missing,
unexpected or mis-shaped tensor, so a wrong checkpoint can never half-load.

Pickle is never read: a `pytorch_model.bin` is refused with the conversion to run instead.
"""

import dataclasses
import logging
import os
import re

import numpy as np

from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.io import names
from bert_mgpu.io.checkpoint_files import note_damaged, run_checkpoints
from bert_mgpu.io.weight_names import (
    HEAD_PREFIXES,
    KERAS_LAYOUT_HEADS,
    family_names,
    fold_to_google_shape,
    google_name,
    google_shape,
    hf_family_to_bert,
    hf_to_google_name,
)
from bert_mgpu.model import lora
from bert_mgpu.model.config import BertConfig
from bert_mgpu.model.modeling import encoder_variables
from bert_mgpu.model.objectives import KINDS

log = logging.getLogger("bert_mgpu")
RUN_FILE = "bert_mgpu.json"  # marks a bert_mgpu output directory (config, labels, tokenizer settings)


def encoder_weights(backbone):
    """The backbone's weights as {Google name: float32 array}."""
    return {google_name(v.path): np.asarray(v.numpy(), np.float32).reshape(google_shape(v.path, v.shape))
            for v in encoder_variables(backbone)}


def assign_encoder(backbone, weights, source):
    """Put {Google name: array} into the backbone; UserError listing every mismatch. Returns unused heads."""
    missing, misshaped, used = [], [], set()
    for var in encoder_variables(backbone):
        name = google_name(var.path)
        want = google_shape(var.path, var.shape)
        if name not in weights:
            missing.append(name)
        else:
            used.add(name)
            if tuple(weights[name].shape) != want:
                misshaped.append(f"{name} is {list(weights[name].shape)}, model wants {list(want)}")
    heads = sorted(n for n in weights if n not in used and n.startswith(HEAD_PREFIXES))
    unexpected = sorted(n for n in weights if n not in used and n not in heads)
    problems = []
    for label, found in (("mis-shaped", misshaped), ("missing", missing), ("unexpected", unexpected)):
        if found:
            shown = "; ".join(found[:6]) + (f"; ... ({len(found)} in all)" if len(found) > 6 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise UserError(f"{source}: checkpoint does not match the model config: " + " | ".join(problems))
    for var in encoder_variables(backbone):
        var.assign(weights[google_name(var.path)].reshape(tuple(var.shape)))
    return heads


# ---------------------------------------------------------------- Hugging Face (safetensors only)

def read_safetensors(path, config=None):
    """Hugging Face safetensors -> {Google name: float32 array}, without torch and without pickle. `config`:
    the model's (BERT when None), whose family names the tensors (ALBERT's shared layers)."""
    from safetensors import SafetensorError
    from safetensors.tensorflow import load_file

    try:
        tensors = load_file(path)
    except (OSError, SafetensorError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    out, albert = {}, config is not None and config.model_type == "albert"
    for hf_name, tensor in tensors.items():
        if albert:  # AlbertModel saved alone names its tensors without the albert. of its task models
            bare = not hf_name.startswith(("albert.", "predictions.", "sop_classifier.", "classifier.", "qa_outputs."))
            hf_name = hf_family_to_bert("albert." + hf_name if bare else hf_name, config.inner_group_num)
        name, transpose = hf_to_google_name(hf_name)
        if name is None:
            continue
        value = np.asarray(tensor.numpy(), np.float32)
        out[name] = value.T if transpose else value
    return out


# ---------------------------------------------------------------- Google TF1 checkpoints

def read_tf_checkpoint(prefix, only=None, check=()):
    """A TF checkpoint's float variables as {name: float32 array}, Adam slots and counters dropped.

    `only`: read just the names under this prefix (the encoder of a bert_mgpu checkpoint, not its
    optimizer state, which is twice the model's size). `check`: names under these prefixes are read too,
    to find damage in what is used later (the classifier head, the object graph), and not returned.
    """
    import tensorflow as tf

    try:
        # A prefix is read as itself: tf.train.load_checkpoint first asks whether it is a directory, which
        # some file systems (ram://) answer yes for any prefix of a file name.
        reader = (tf.compat.v1.train.NewCheckpointReader(prefix) if storage.exists(prefix + ".index")
                  else tf.train.load_checkpoint(prefix))
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(f"{prefix}: not a readable TensorFlow checkpoint ({str(e).splitlines()[0]})") from None
    out = {}
    for name in reader.get_variable_to_shape_map():
        checked = bool(check) and name.startswith(tuple(check))
        wanted = (only is None or name.startswith(only)) and not (
            name.endswith(("/adam_m", "/adam_v")) or name in ("global_step",)
            or name.startswith("_CHECKPOINTABLE") or "OPTIMIZER_SLOT" in name)
        if not (wanted or checked):
            continue
        try:
            value = reader.get_tensor(name)
        except (tf.errors.OpError, IndexError, ValueError) as e:  # how a cut or damaged data file reads
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"{prefix}: damaged checkpoint, {name} cannot be read ({first[:160]})") from None
        if wanted and np.issubdtype(np.asarray(value).dtype, np.floating):
            out[name] = np.asarray(value, np.float32)
    return out


def write_google_checkpoint(weights, prefix):
    """Write {Google name: array} as a TF1 `bert_model.ckpt` (what google-research/bert reads)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        feeds, variables = {}, []
        for name, value in weights.items():
            ph = tf.compat.v1.placeholder(tf.float32, value.shape)
            variables.append(tf.compat.v1.Variable(ph, name=name))
            feeds[ph] = value
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer(), feeds)
            saver.save(sess, prefix, write_meta_graph=False, write_state=False)  # as Google ships it
    return prefix


# ---------------------------------------------------------------- format detection

@dataclasses.dataclass
class Pretrained:
    """What --init_checkpoint points to, read into one shape."""

    layout: str  # "google", "huggingface", "keras_hub", "bert_mgpu", or "config" (a config alone: no weights)
    path: str
    config: BertConfig
    vocab_file: str
    weights: dict  # Google name -> float32 array (encoder and any heads)
    do_lower_case: bool = None  # None where the checkpoint does not say
    run: dict = None  # bert_mgpu's own run metadata (labels, max_seq_length, ...)
    ckpt_prefix: str = None  # bert_mgpu checkpoint prefix, to restore head and optimizer
    labels: list = None  # the classifier head's labels, where the checkpoint names them
    task_type: str = None  # "classification" or "regression", where the checkpoint says

    def run_of(self, kind):
        """bert_mgpu.json when this is a bert_mgpu run of the head `kind` ("classifier", "tagger", ...; a
        classifier's older runs recorded none), else None: another layout, or another head's run, which
        gives its encoder alone."""
        run = self.run or {}
        return run if self.layout == "bert_mgpu" and names.kind_of(run) == kind else None

    @property
    def checkpoint_step(self):
        """The step of the bert_mgpu checkpoint read, or None: an older one than the run file names when the
        newest is damaged."""
        used = re.search(r"ckpt-(\d+)$", str(self.ckpt_prefix or ""))
        return int(used.group(1)) if used else None

    def lower_case(self, given=None):
        """`given` if set, else what the checkpoint says, else True (Google's uncased releases)."""
        if given is not None:
            return bool(given)
        return True if self.do_lower_case is None else bool(self.do_lower_case)


def _need(path, what):
    if not storage.exists(path):
        raise UserError(f"{path}: {what} not found")
    return path


def _tf_prefixes(path):
    """Checkpoint prefixes for `path`, newest first: `path` itself when it is one, else a run directory's
    (`run_checkpoints`), else a `*.ckpt` in it. Empty when none."""
    if storage.exists(path + ".index"):
        return [path]
    if not storage.isdir(path):
        return []
    found, _ = run_checkpoints(path)
    return found or [p[: -len(".index")] for p in sorted(storage.glob(os.path.join(path, "*.ckpt.index")))]


def _read_newest(prefixes, only):
    """The weights of the newest readable checkpoint of `prefixes` (newest first), and its prefix; a damaged
    one (a crash while it was copied, a disk error) is passed over with a warning, as resuming does."""
    for prefix in prefixes:
        try:
            weights = read_tf_checkpoint(prefix, only=only, check=("head/", "_CHECKPOINTABLE_OBJECT_GRAPH"))
        except UserError as e:
            if prefix == prefixes[-1]:
                raise
            log.warning("%s; trying the checkpoint before it", e)
            note_damaged(prefix)
            continue
        if prefix != prefixes[0]:
            log.warning("using %s, not the damaged %s", prefix, prefixes[0])
        return weights, prefix
    raise AssertionError("no prefixes")


def load_pretrained(path, bert_config_file=None, vocab_file=None, config_alone=False):
    """Detect the checkpoint format from what is on disk and read it. UserError when nothing fits, when a
    tensor holds NaN or infinity (a damaged file, a diverged run: found before training, not after), or
    when a bert_mgpu run directory is given a --bert_config_file or --vocab_file other than its own.
    `config_alone`: no `path` but a config and a vocabulary give a Pretrained of layout "config", no weights."""
    pre = _load_pretrained(path, bert_config_file, vocab_file, config_alone)
    bad = sorted(name for name, value in pre.weights.items()
                 if np.issubdtype(np.asarray(value).dtype, np.floating) and not np.isfinite(value).all())
    if bad:
        raise UserError(f"{path}: {len(bad)} tensor(s) hold NaN or infinity ({', '.join(bad[:3])}"
                        f"{', ...' if len(bad) > 3 else ''}): a damaged checkpoint or a diverged run")
    if pre.layout == "bert_mgpu":
        if bert_config_file:  # the shape the file gives must be the run's (flags may set the rest, as pre-LN)
            BertConfig.from_json_file(bert_config_file)  # a missing or bad file is refused as such
            given, own = storage.read_json(bert_config_file), pre.config.to_dict()
            differ = sorted(k for k in _SHAPE_KEYS if k in given and k in own and given[k] != own[k])
            if differ:
                raise UserError(f"--bert_config_file={bert_config_file} differs from the config of the bert_mgpu run "
                                f"{path} ({', '.join(differ)}), which carries its own: leave the flag out")
        if vocab_file and storage.read_bytes(vocab_file) != storage.read_bytes(pre.vocab_file):
            raise UserError(f"--vocab_file={vocab_file} differs from {pre.vocab_file} of the bert_mgpu run {path}, "
                            "which carries its own: leave the flag out")
    return pre


_SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "max_position_embeddings", "type_vocab_size", "model_type", "embedding_size")


def _load_pretrained(path, bert_config_file=None, vocab_file=None, config_alone=False):
    if not path and config_alone and bert_config_file and vocab_file:  # no weights: the model starts from random ones
        return Pretrained("config", bert_config_file, BertConfig.from_json_file(bert_config_file),
                          _need(vocab_file, "vocab.txt"), {})
    if not path:
        raise UserError("--init_checkpoint is required (a Google release, a Hugging Face or keras-hub "
                        "directory, or a bert_mgpu output directory)" + (", or --bert_config_file and --vocab_file "
                        "to start from random weights" if config_alone else ""))
    directory = path if storage.isdir(path) else os.path.dirname(path)
    if not storage.exists(path) and not storage.exists(path + ".index"):
        raise UserError(f"{path}: checkpoint not found")

    run_file = os.path.join(directory, RUN_FILE)
    if storage.exists(run_file):
        run = names.current(storage.read_json(run_file))
        if not isinstance(run, dict) or not isinstance(run.get("bert_config"), dict):
            raise UserError(f"{run_file}: not a bert_mgpu run file (no bert_config in it)")
        prefixes = _tf_prefixes(path)
        if not prefixes:
            raise UserError(f"{path}: bert_mgpu run directory holds no checkpoint yet")
        config = BertConfig.from_dict(run["bert_config"], source=run_file)
        # Encoder and pretraining heads, not the optimizer state (twice the model's size).
        weights, prefix = _read_newest(prefixes, only=("encoder/", "heads/"))
        encoder = {}
        for key, value in weights.items():
            name = key.split("/", 1)[1][: -len("/.ATTRIBUTES/VARIABLE_VALUE")].replace(".S", "/")
            if name in KERAS_LAYOUT_HEADS:  # kept in Keras' [in, out] layout; Google's is [out, in]
                name, value = KERAS_LAYOUT_HEADS[name], value.T
            encoder[name] = fold_to_google_shape(name, value)
        encoder = lora.fold(encoder)  # a run trained with LoRA adapters reads as the BERT they make
        return Pretrained("bert_mgpu", path, config, _need(os.path.join(directory, "vocab.txt"), "vocab.txt"),
                          encoder, run.get("do_lower_case"), run, prefix)

    hf_config = os.path.join(directory, "config.json")
    if storage.isdir(path) and storage.exists(hf_config):
        cfg = storage.read_json(hf_config)
        if "registered_name" in cfg or str(cfg.get("module", "")).startswith("keras_hub"):
            return _load_keras_hub(path)
        safetensors = os.path.join(path, "model.safetensors")
        if not storage.exists(safetensors):
            if storage.glob(os.path.join(path, "*.bin")) or storage.glob(os.path.join(path, "*.pt")):
                raise UserError(
                    f"{path}: only pickle weights (pytorch_model.bin) found; bert_mgpu never unpickles. "
                    "Convert them once with transformers: model.save_pretrained(dir, safe_serialization=True)"
                )
            raise UserError(f"{path}: config.json found but no model.safetensors")
        config = BertConfig.from_json_file(bert_config_file or hf_config)
        lower = None
        tok_cfg = os.path.join(path, "tokenizer_config.json")
        if storage.exists(tok_cfg):
            lower = storage.read_json(tok_cfg).get("do_lower_case")
        vocab = vocab_file or _need(os.path.join(path, "vocab.txt"), "vocab.txt")
        return Pretrained("huggingface", path, config, vocab, read_safetensors(safetensors, config), lower,
                          **_head_facts(cfg))

    if storage.isdir(path) and is_saved_model(path):
        return read_saved_model(path)
    prefix = next(iter(_tf_prefixes(path)), None)
    if prefix is not None:
        config_file = bert_config_file or _need(os.path.join(directory, "bert_config.json"), "bert_config.json")
        config = BertConfig.from_json_file(config_file)
        vocab = vocab_file or _need(os.path.join(directory, "vocab.txt"), "vocab.txt")
        facts = storage.read_json(config_file)  # bert_mgpu's exports add the head's labels (see _head_facts)
        # google-research/electra's scope (electra/), ALBERT's shared layers: read as google-bert's names
        weights, family = family_names(read_tf_checkpoint(prefix), config.inner_group_num)
        if family != config.model_type:
            if config.model_type != "bert":
                raise UserError(f"{config_file}: says model_type={config.model_type!r}, but {prefix} holds a "
                                f"{family.upper()} checkpoint (by its tensors' names)")
            config = dataclasses.replace(config, model_type=family)
        return Pretrained("google", prefix, config, vocab, weights, facts.get("do_lower_case"), **_head_facts(facts))
    raise UserError(f"{path}: not a Google checkpoint, a Hugging Face or keras-hub directory, "
                    "or a bert_mgpu output directory")


def _head_facts(config):
    """The classifier head's labels and task type from a config's Hugging Face keys (`id2label`,
    `problem_type`), which bert_mgpu's Google exports write too; None where it has none."""
    kind = next((k for k in KINDS.values() if k.problem_type == config.get("problem_type")), None)
    id2label = config.get("id2label")
    labels = None
    if isinstance(id2label, dict) and (kind is None or kind.has_classes):
        try:
            labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except ValueError:
            labels = None
    return {"labels": labels, "task_type": kind.name if kind else None}


def _load_keras_hub(path):
    import keras_hub

    try:
        backbone = keras_hub.models.BertBackbone.from_preset(path)
    except Exception as e:  # keras-hub raises many types for a bad preset
        raise UserError(f"{path}: not a loadable keras-hub BERT preset ({e})") from None
    c = backbone.get_config()
    config = BertConfig(
        vocab_size=c["vocabulary_size"], hidden_size=c["hidden_dim"], num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"], intermediate_size=c["intermediate_dim"],
        hidden_dropout_prob=c["dropout"], attention_probs_dropout_prob=c["dropout"],
        max_position_embeddings=c["max_sequence_length"], type_vocab_size=c["num_segments"],
        hidden_act="gelu_new")  # keras-hub's BERT is built with tanh-GELU
    vocab = _need(os.path.join(path, "assets", "tokenizer", "vocabulary.txt"), "keras-hub vocabulary")
    lower = None
    tok = os.path.join(path, "tokenizer.json")
    if storage.exists(tok):
        lower = storage.read_json(tok).get("config", {}).get("lowercase")
    weights = encoder_weights(backbone)
    task = os.path.join(path, "task.json")
    if storage.exists(task) and "BertTextClassifier" in str(storage.read_json(task).get("class_name", "")):
        try:
            head = keras_hub.models.BertTextClassifier.from_preset(path).output_dense
        except Exception as e:  # as above
            raise UserError(f"{path}: its BertTextClassifier does not load ({e})") from None
        weights["output_weights"] = np.asarray(head.kernel.numpy(), np.float32).T
        weights["output_bias"] = np.asarray(head.bias.numpy(), np.float32)
    meta = os.path.join(path, "metadata.json")
    facts = (storage.read_json(meta).get("bert_mgpu") or {}) if storage.exists(meta) else {}
    return Pretrained("keras_hub", path, config, vocab, weights, lower, labels=facts.get("labels") or None,
                      task_type=facts.get("task_type"))


EXTRA = "assets.extra"  # a SavedModel export's files TensorFlow Serving does not read (serving.py writes them)
META = "bert_mgpu_export.json"


def is_saved_model(path):
    return storage.exists(os.path.join(path, "saved_model.pb")) and storage.exists(os.path.join(path, EXTRA, META))


def read_saved_model(path):
    """A bert_mgpu SavedModel export -> `checkpoints.Pretrained` (weights under Google's names)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer's ops the graph holds)

    meta = names.current(storage.read_json(os.path.join(path, EXTRA, META)))
    config = BertConfig.from_json_file(os.path.join(path, EXTRA, "bert_config.json"))
    try:
        loaded = tf.saved_model.load(path)
    except (tf.errors.OpError, ValueError, OSError) as e:
        raise UserError(f"{path}: not a loadable SavedModel ({str(e).splitlines()[0][:160]})") from None
    weights = {}
    for name, var in zip(meta["weights"], loaded.bert_weights):
        value = np.asarray(var.numpy(), np.float32)
        span = meta.get("kind") == "question_answerer"  # run_squad's head names
        if name == "classifier/kernel":
            name, value = ("cls/squad/output_weights" if span else "output_weights"), value.T
        elif name == "classifier/bias":
            name = "cls/squad/output_bias" if span else "output_bias"
        weights[name] = fold_to_google_shape(name, value)
    return Pretrained(
        "saved_model", path, config, os.path.join(path, EXTRA, "vocab.txt"), weights, meta.get("do_lower_case"),
        labels=meta.get("labels") or None, task_type=meta.get("task_type"))
