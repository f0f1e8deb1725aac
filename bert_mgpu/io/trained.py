"""A trained model in one shape, whatever made it: `Trained` (config, vocabulary, weights under Google's names,
labels, head kind), from a classifier or pretrainer in memory or any directory `checkpoints` reads, and the
reference Keras model built from it. Every export format and the SavedModel are written from one.
"""

import dataclasses
import os

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints
from bert_mgpu.io.heads import CRF_WEIGHT, head_for, head_of_weights
from bert_mgpu.model.choice_objectives import MultipleChoice
from bert_mgpu.model.config import BertConfig
from bert_mgpu.model.modeling import head_variables
from bert_mgpu.model.objectives import objective
from bert_mgpu.model.pretraining_model import head_weights
from bert_mgpu.model.span_objectives import GOOGLE_HEAD, SpanExtraction
from bert_mgpu.model.tagging_objectives import TokenClassification

SPAN = "question_answerer"  # the kind of a span head (SQuAD)
CHOICE = "multiple_choice"  # the kind of a multiple-choice head (SWAG, C3)

# Texts an export is checked on against the model, besides any the caller gives.
PROBE_TEXTS = ("a gripping, beautifully shot film.", "Dull and far too long; I left early!",
               "Ünïcödé ÀÇÇÉNTS and CAPITALS … “quotes” — dashes", "1984: 12.5% of $3,000", "中文 text 漢字",
               "tabs\tand  double  spaces", "x")


@dataclasses.dataclass
class Trained:
    """What every export writes.

    Args:
        kind: "classifier" (a head over the pooled output), "tagger" (a head on every token),
            "question_answerer" (a start and an end score on every token), "multiple_choice" (a score a
            choice) or "pretrainer" (the encoder and any pretraining heads).
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


def _with_head(model, weights):
    weights["output_weights"] = np.asarray(model.head.kernel.numpy(), np.float32).T
    weights["output_bias"] = np.asarray(model.head.bias.numpy(), np.float32)
    return weights


def from_classifier(clf):
    """A `BertClassifier`'s weights as they are now."""
    weights = _with_head(clf.model, checkpoints.encoder_weights(clf.model.backbone))
    return Trained("classifier", clf.config, clf.tokenizer.vocab_file, clf.tokenizer.do_lower_case, weights,
                   list(clf.labels), clf.task_type, clf.max_seq_length, bool(getattr(clf, "pairs", False)),
                   truncation=clf.truncation, facts=clf._window_facts())


def from_tagger(tagger):
    """A `BertTagger`'s weights as they are now."""
    weights = _with_head(tagger.model, checkpoints.encoder_weights(tagger.model.backbone))
    transitions = head_variables(tagger.model).get("transitions")
    if transitions is not None:
        weights[CRF_WEIGHT] = np.asarray(transitions.numpy(), np.float32)
    return Trained("tagger", tagger.config, tagger.tokenizer.vocab_file, tagger.tokenizer.do_lower_case, weights,
                   list(tagger.labels), TokenClassification.name, tagger.max_seq_length,
                   facts={"doc_stride": tagger._stride()})


def from_multiple_choice(mc):
    """A `BertMultipleChoice`'s weights as they are now (the head as a one-label classifier's)."""
    weights = _with_head(mc.model, checkpoints.encoder_weights(mc.model.backbone))
    return Trained(CHOICE, mc.config, mc.tokenizer.vocab_file, mc.tokenizer.do_lower_case, weights, [],
                   MultipleChoice.name, mc.max_seq_length)


def from_question_answerer(qa):
    """A `BertQuestionAnswerer`'s weights as they are now (the head under run_squad's names)."""
    weights = checkpoints.encoder_weights(qa.model.backbone)
    weights[GOOGLE_HEAD[0]] = np.asarray(qa.model.head.kernel.numpy(), np.float32).T
    weights[GOOGLE_HEAD[1]] = np.asarray(qa.model.head.bias.numpy(), np.float32)
    return Trained(SPAN, qa.config, qa.tokenizer.vocab_file, qa.tokenizer.do_lower_case, weights, [],
                   SpanExtraction.name, qa.max_seq_length, facts=qa._facts())


def from_pretrainer(pretrainer, max_seq_length=128):
    """A `BertPretrainer`'s encoder and heads as they are now."""
    weights = {**checkpoints.encoder_weights(pretrainer.model.backbone), **head_weights(pretrainer.model)}
    return Trained("pretrainer", pretrainer.config, pretrainer.tokenizer.vocab_file,
                   pretrainer.tokenizer.do_lower_case, weights, max_seq_length=max_seq_length)


def read_trained(path):
    """Any model `--init_checkpoint` reads (a bert_mgpu run directory above all) as a `Trained`."""
    pre = checkpoints.load_pretrained(path)
    run = pre.run or {}
    own = pre.layout == "bert_mgpu"
    spec = head_for(run.get("kind", "classifier")) if own else head_of_weights(pre.weights)
    if own and spec.weights:  # the head from its checkpoint
        head = checkpoints.read_tf_checkpoint(pre.ckpt_prefix, only=("head/",))
        kernel = [v for k, v in head.items() if k.startswith("head/kernel")]
        bias = [v for k, v in head.items() if k.startswith("head/bias")]
        if not (kernel and bias):
            raise UserError(f"{path}: holds no trained {'span' if spec.weights == GOOGLE_HEAD else 'classifier'} head")
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
    if isinstance(source, Trained):
        return source
    if isinstance(source, (str, os.PathLike)):
        return read_trained(str(source))
    if isinstance(getattr(source, "objective", None), TokenClassification):
        return from_tagger(source)
    if isinstance(getattr(source, "objective", None), MultipleChoice):
        return from_multiple_choice(source)
    if isinstance(getattr(source, "objective", None), SpanExtraction):
        return from_question_answerer(source)
    if hasattr(source, "labels") and hasattr(source, "task_type"):
        return from_classifier(source)
    return from_pretrainer(source)
