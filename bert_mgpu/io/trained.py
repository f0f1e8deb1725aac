"""A trained model in one shape, whatever made it: `Trained` (config, vocabulary, weights under Google's names,
labels, head kind), from any directory `checkpoints` reads or a model in memory (each head's own `trained()`
says what it is; nothing here knows a head kind), and the reference Keras model built from it. Every export
format and the SavedModel are written from one.
"""

import dataclasses
import os

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints, names
from bert_mgpu.io.heads import CRF_WEIGHT, HEAD_WEIGHTS, head_for, head_of_weights
from bert_mgpu.model.config import BertConfig
from bert_mgpu.model.objectives import objective

# Texts an export is checked on against the model, besides any the caller gives.
PROBE_TEXTS = ("a gripping, beautifully shot film.", "Dull and far too long; I left early!",
               "Ünïcödé ÀÇÇÉNTS and CAPITALS … “quotes” — dashes", "1984: 12.5% of $3,000", "中文 text 漢字",
               "tabs\tand  double  spaces", "x")


@dataclasses.dataclass
class Trained:
    """What every export writes.

    Args:
        kind: its head's name (`io/heads.HEADS`: a classifier, a tagger, a question answerer, a
            multiple-choice model, or a pretrainer: the encoder and any pretraining heads).
        config: the `BertConfig`.
        vocab_file: its `vocab.txt`.
        do_lower_case: the tokenizer's setting.
        weights: {Google name: float32 array}, Google's shapes.
        labels: the classifier's labels in logit order (empty for a regression or a pretrainer).
        task_type: "classification" or "regression".
        max_seq_length: what the serving graph truncates to.
        truncation: which pieces of a longer text it keeps ("head", "tail", "head+tail").
        pairs: whether the classifier reads sentence pairs.
        facts: a head's own settings for its SavedModel: a question answerer's run_squad ones (doc_stride,
            max_query_length, ...), a classifier's windows over long texts (doc_stride, window_pooling).
    """

    kind: str
    config: BertConfig
    vocab_file: str
    do_lower_case: bool
    weights: dict
    labels: list = dataclasses.field(default_factory=list)
    task_type: str = "classification"
    max_seq_length: int = 128
    pairs: bool = False
    facts: dict = dataclasses.field(default_factory=dict)  # a head's own settings (a question answerer's windows)
    truncation: str = "head"

    def digest(self):
        """sha256 of what the model computes: kind, labels and every weight (names, shapes, values). An
        export stamped with it is this model's, not an earlier run's of the same step."""
        import hashlib

        h = hashlib.sha256(repr((self.kind, self.task_type, list(self.labels))).encode())
        for name in sorted(self.weights):
            value = np.ascontiguousarray(self.weights[name], np.float32)
            h.update(f"{name}{value.shape}".encode())
            h.update(value.tobytes())
        return h.hexdigest()

    def labels_config(self):
        """The head's labels as Hugging Face writes them (google-bert's readers ignore the extra keys)."""
        return {} if self.head is None else self.head.hf_facts(self.labels)

    def hf_config(self, architecture):
        """transformers' config.json of this model as `architecture`, with the head's labels."""
        config = {"architectures": [architecture], "model_type": "bert", **self.config.to_dict(),
                  "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute",
                  "tie_word_embeddings": True, **self.labels_config()}
        config.pop("encoder_ln_mode")
        return config

    @property
    def spec(self):
        """Its head kind (`heads.Head`): what each export asks of it."""
        return head_for(self.kind)

    @property
    def head(self):
        """The head's objective (None for a pretrainer): what its labels mean in an export."""
        return self.spec.objective(self)


def model_weights(model, head=HEAD_WEIGHTS):
    """A head model's encoder and dense head (`model.head`) as they are now, under Google's names: the head's
    kernel and bias as `head` names them (google-bert's `output_weights`/`output_bias`, run_squad's own)."""
    weights = checkpoints.encoder_weights(model.backbone)
    weights[head[0]] = np.asarray(model.head.kernel.numpy(), np.float32).T
    weights[head[1]] = np.asarray(model.head.bias.numpy(), np.float32)
    return weights


def read_trained(path):
    """Any model `--init_checkpoint` reads (a bert_mgpu run directory above all) as a `Trained`."""
    pre = checkpoints.load_pretrained(path)
    run = pre.run or {}
    own = pre.layout == "bert_mgpu"
    spec = head_for(names.kind_of(run)) if own else head_of_weights(pre.weights)
    if own and spec.weights:  # the head from its checkpoint
        head = checkpoints.read_tf_checkpoint(pre.ckpt_prefix, only=("head/",))
        kernel = [v for k, v in head.items() if k.startswith("head/kernel")]
        bias = [v for k, v in head.items() if k.startswith("head/bias")]
        if not (kernel and bias):
            raise UserError(f"{path}: holds no trained head of {spec.noun}")
        pre.weights.update({spec.weights[0]: kernel[0].T, spec.weights[1]: bias[0]})
        transitions = [v for k, v in head.items() if k.startswith("head/transitions")]
        if transitions:  # a tagger's CRF
            pre.weights[CRF_WEIGHT] = transitions[0]
    task_type = run.get("task_type") or pre.task_type or "classification"
    labels = list(run.get("labels") or pre.labels or [])
    if spec.labelled and not labels and objective(task_type).has_classes:  # a head's rows, unnamed
        labels = [str(i) for i in range(pre.weights[spec.weights[0]].shape[0])]
    settings = run.get("settings") or {}
    return Trained(spec.name, pre.config, pre.vocab_file, pre.lower_case(), pre.weights,
                   labels, task_type, int(run.get("max_seq_length") or settings.get("max_seq_length") or 128),
                   bool(run.get("pairs", False)),
                   run.get("squad") or {k: run[k] for k in ("doc_stride", "window_pooling") if run.get(k)},
                   run.get("truncation", "head"))


def build_model(trained, precision="float32"):
    """The reference (unfused) Keras model of `trained` with its weights: the head's model, or the encoder."""
    return trained.spec.build(trained, precision)


def as_trained(source):
    """`source` as a `Trained`: itself, a directory any reader takes, or a model in memory, which says what
    it is (each head's and the pretrainer's `trained()`)."""
    if isinstance(source, Trained):
        return source
    if isinstance(source, (str, os.PathLike)):
        return read_trained(str(source))
    if not callable(getattr(source, "trained", None)):
        raise UserError(f"a {type(source).__name__} is not a model bert_mgpu exports: give a head (BertClassifier, "
                        "...), a BertPretrainer, a Trained or a directory")
    return source.trained()
