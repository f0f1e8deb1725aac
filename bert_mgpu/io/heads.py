"""Each head kind as one object: its name in a run directory, the Google names of its weights, its objective,
its reference Keras model, and what its exports take and give. The io layer asks a run's head (`head_for`),
never its kind's string, so a new head is one class here and its own modules.

Example:
    spec = head_for("tagger")
    spec.formats            # the export formats a token classifier can be written in
    spec.build(trained)     # the unfused Keras model with the trained weights
"""

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints, names
from bert_mgpu.io.span_serving import span_endpoint
from bert_mgpu.io.tag_serving import tagger_endpoint
from bert_mgpu.model import modeling
from bert_mgpu.model.choice_objectives import MultipleChoice
from bert_mgpu.model.global_pointer import build_global_pointer
from bert_mgpu.model.global_pointer_objective import GlobalPointerObjective
from bert_mgpu.model.objectives import objective
from bert_mgpu.model.span_objectives import GOOGLE_HEAD, SpanExtraction
from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification

ALL_FORMATS = ("saved_model", "hf", "google", "keras_hub", "onnx", "onnx_int8", "tflite")
NO_KERAS_HUB = tuple(f for f in ALL_FORMATS if f != "keras_hub")
HEAD_WEIGHTS = ("output_weights", "output_bias")  # google-bert's one dense head: [labels, hidden], [labels]
CRF_WEIGHT = "crf/transitions"


class Head:
    """A head kind. Subclasses set the class attributes and override what their head does differently.

    name: its kind in bert_mgpu.json, in an export's facts and in log lines (run directories keep it).
    noun: how a message names it ("a token classifier").
    formats: the export formats it can be written in; `why_not` says why the others are not.
    weights: the Google names of its head's kernel and bias (none for a pretrained encoder).
    input_rank: 2 for token ids [batch, length], 3 for [batch, choices, length].
    keras_hub_task: whether keras-hub's BertTextClassifier is its preset (otherwise a BertBackbone).
    labelled: whether its outputs are scores of named labels (`Trained.labels`).
    peft_task_type: PEFT's `task_type` for its adapters (None: PEFT's base class, as multiple choice has none).
    """

    name = ""
    noun = ""
    formats = ALL_FORMATS
    why_not = ""
    weights = HEAD_WEIGHTS
    input_rank = 2
    keras_hub_task = False
    labelled = False
    peft_task_type = None

    def objective(self, trained):
        """What its outputs mean: the `Objective` (None for a pretrained encoder)."""
        return None

    def num_outputs(self, trained):
        return max(len(trained.labels), 1)

    def _build(self, trained, precision):
        raise NotImplementedError

    def build(self, trained, precision="float32"):
        """The reference (unfused) Keras model of `trained`, its weights assigned."""
        model = self._build(trained, precision)
        checkpoints.assign_encoder(model.backbone, trained.weights, "export")
        model.head.kernel.assign(trained.weights[self.weights[0]].T)
        model.head.bias.assign(trained.weights[self.weights[1]])
        return model

    def outputs(self, trained, out):
        """The model's output `out` as the named outputs of an ids graph (SavedModel, ONNX, LiteRT)."""
        return {"logits": out}

    def served(self, trained, out, features):
        """The SavedModel's `serving_ids` outputs (label names included where it has labels)."""
        return self.outputs(trained, out)

    def graph_architecture(self, trained):
        """The transformers class named in an ONNX or LiteRT export's config.json."""
        return self.objective(trained).hf_architecture(trained.weights)

    def endpoint(self, trained, tokenizer, model, text_endpoint):
        """(input specs, function) of the SavedModel's raw-text `serving_default`, and {Google name:
        tf.Variable} of any weight it reads besides the model's. `text_endpoint(pairs)` is serving.py's
        for a text (or pair) in, the ids graph's outputs out."""
        raise UserError(f"--export_format=saved_model: {self.noun} exports as {' or '.join(self.formats)}")

    def gpu_probe(self, config, rows, seq):
        """What `make gpu-check`'s heads check (cli/checks_gpu.py) trains for this head in mixed_float16 on
        every GPU, on `rows` full rows of `seq` tokens: (build() -> its Keras model, the training loss, labels
        [rows, ...]), or None for a head that check names itself. A new head gives one and joins the check."""
        return None

    def check_format(self, format):
        if format not in self.formats:
            raise UserError(f"--export_format={format}: {self.noun} exports as {' or '.join(self.formats)}"
                            f"{self.why_not}")


class ClassifierHead(Head):
    """A dense layer over the pooled output: classification, regression, multi-label."""

    name = "classifier"
    noun = "a classifier"
    keras_hub_task = True
    labelled = True
    peft_task_type = "SEQ_CLS"

    def objective(self, trained):
        return objective(trained.task_type)

    def _build(self, trained, precision):
        return modeling.build_classifier(trained.config, self.num_outputs(trained), precision, fused=False)

    def outputs(self, trained, out):  # the SavedModel's numeric outputs too (probabilities, or scores)
        served = self.served(trained, out, None)
        return {"logits": out, **{k: v for k, v in served.items() if v.dtype.is_floating}}

    def served(self, trained, out, features):
        return self.objective(trained).serving(out, tf.constant(trained.labels or [""]))

    def endpoint(self, trained, tokenizer, model, text_endpoint):
        return (*text_endpoint(trained.pairs), {})


class TaggerHead(Head):
    """A dense layer on every token, and optionally a CRF's transitions."""

    name = "tagger"
    noun = "a token classifier"
    formats = NO_KERAS_HUB
    why_not = " (keras-hub has no token classifier)"
    labelled = True
    peft_task_type = "TOKEN_CLS"

    def objective(self, trained):
        return CRFTagging() if CRF_WEIGHT in trained.weights else TokenClassification()

    def _build(self, trained, precision):
        return modeling.build_tagger(trained.config, self.num_outputs(trained), precision, fused=False)

    def graph_architecture(self, trained):  # a CRF tagger's graph gives BertForTokenClassification's emissions
        return "BertForTokenClassification"

    def endpoint(self, trained, tokenizer, model, text_endpoint):
        crf, extra = None, {}
        if CRF_WEIGHT in trained.weights:  # kept as a variable: the export reads back as a CRF tagger
            crf = tf.Variable(trained.weights[CRF_WEIGHT], trainable=False, name="crf_transitions")
            extra[CRF_WEIGHT] = crf
        specs = [tf.TensorSpec([None], tf.string, name="text")]
        return specs, tagger_endpoint(trained, tokenizer, model, crf), extra


# run_squad's defaults, for a question answerer whose run did not record its own.
SQUAD_DEFAULTS = {"max_query_length": 64, "doc_stride": 128, "n_best_size": 20, "max_answer_length": 30,
                  "version_2_with_negative": False, "null_score_diff_threshold": 0.0}


class SpanHead(Head):
    """A start and an end score on every token (SQuAD), under run_squad's names."""

    name = "question_answerer"
    noun = "a question answerer"
    formats = NO_KERAS_HUB
    why_not = " (keras-hub has no span head)"
    weights = GOOGLE_HEAD
    peft_task_type = "QUESTION_ANS"

    def objective(self, trained):
        return SpanExtraction()

    def num_outputs(self, trained):
        return 2

    def _build(self, trained, precision):
        return modeling.build_span_model(trained.config, precision, fused=False)

    def outputs(self, trained, out):
        return {"start_logits": out[:, :, 0], "end_logits": out[:, :, 1]}

    def endpoint(self, trained, tokenizer, model, text_endpoint):
        specs = [tf.TensorSpec([None], tf.string, name=n) for n in ("question", "context")]
        return specs, span_endpoint(tokenizer, model, trained.max_seq_length,
                                    **{**SQUAD_DEFAULTS, **trained.facts}), {}


class ChoiceHead(Head):
    """One score a choice from its pooled output (SWAG, C3): inputs [batch, choices, length]."""

    name = "multiple_choice"
    noun = "a multiple-choice model"
    formats = ("hf", "google", "onnx", "onnx_int8", "tflite")  # no SavedModel: it would take choices, not yet
    input_rank = 3

    def objective(self, trained):
        return MultipleChoice()

    def _build(self, trained, precision):
        return modeling.build_choice_model(trained.config, precision, fused=False)


class GlobalPointerHead(Head):
    """A score for every span of every entity type (model/global_pointer.py): one dense layer of types x 2 x
    head_size units on every token, google-bert's output_weights/output_bias, the types as its labels."""

    name = "global_pointer"
    noun = "a GlobalPointer"
    formats = ("google", "onnx", "onnx_int8")
    why_not = " (transformers and keras-hub have no GlobalPointer head; no SavedModel or LiteRT graph is written yet)"
    labelled = True

    def objective(self, trained):
        return GlobalPointerObjective().read_as(types=tuple(trained.labels))

    def num_outputs(self, trained):
        return trained.weights[self.weights[0]].shape[0]

    def graph_architecture(self, trained):  # no transformers class: the ONNX export's config.json names bert_mgpu's
        return "BertGlobalPointer"

    def gpu_probe(self, config, rows, seq):
        """Two types, head size 16; each row a span of type row % 2, and on even rows a second span over the
        whole row around it (nested)."""
        first = np.arange(rows) % (seq - 2)
        labels = np.full((rows, 2, 3), -1, np.int32)
        labels[:, 0] = np.stack([np.arange(rows) % 2, first, first + 2], 1)
        labels[::2, 1] = (1, 0, seq - 1)
        return (lambda: build_global_pointer(config, 2, 16, "mixed_float16"), GlobalPointerObjective().loss, labels)

    def _build(self, trained, precision):
        types = len(trained.labels)
        return build_global_pointer(trained.config, types, self.num_outputs(trained) // (2 * types), precision,
                                    fused=False)


class EncoderHead(Head):
    """A pretrained encoder, with any pretraining heads (masked LM, next sentence) its weights hold."""

    name = "pretrainer"
    noun = "a pretrained encoder"
    weights = ()

    def build(self, trained, precision="float32"):
        backbone = modeling.build_backbone(trained.config, precision)
        checkpoints.assign_encoder(backbone, trained.weights, "export")
        return backbone

    def served(self, trained, out, features):
        mask = tf.cast(features["padding_mask"], tf.float32)[:, :, None]
        sequence = tf.cast(out["sequence_output"], tf.float32)
        return {"pooled_output": tf.cast(out["pooled_output"], tf.float32), "sequence_output": sequence,
                "mean_pooled": tf.reduce_sum(sequence * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)}

    def graph_architecture(self, trained):
        return "BertModel"

    def endpoint(self, trained, tokenizer, model, text_endpoint):
        return (*text_endpoint(False), {})


HEADS = {head.name: head for head in (ClassifierHead(), TaggerHead(), SpanHead(), ChoiceHead(), GlobalPointerHead(),
                                      EncoderHead())}


def head_for(kind):
    """The `Head` of a run or export kind."""
    try:
        return HEADS[names.current({"kind": kind})["kind"]]
    except KeyError:
        raise UserError(f"unknown head kind {kind!r}; expected one of {', '.join(HEADS)}") from None


def head_of_weights(weights):
    """The head a checkpoint from outside bert_mgpu holds, from its Google weight names."""
    for head in (HEADS["classifier"], HEADS["question_answerer"]):  # a tagger's or a chooser's look the same
        if head.weights[0] in weights:
            return head
    return HEADS["pretrainer"]
