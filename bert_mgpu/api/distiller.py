"""Distil a fine-tuned classifier or tagger (the teacher) into a smaller one (the student) on every tower: the
student learns the teacher's softened outputs beside the labels (model/distillation.py), the teacher running
in the same tower step without gradients. Unlabelled in-domain text joins the training rows with its soft
term alone: the teacher labels it on the fly. The student is an ordinary model of its head: its output
directory is an ordinary run, which evaluates, predicts, resumes and exports as any.

Example:
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    teacher = bert_mgpu.BertClassifier.from_pretrained("out/teacher", towers=towers)
    student = bert_mgpu.Distiller.student_from_layers(teacher, (0, 2, 4))   # DistilBERT's and RBT3's start
    bert_mgpu.Distiller(teacher, student, temperature=2.0, unlabeled=texts).fit(train, "out/student", epochs=3)
    student.evaluate(dev)
"""

import dataclasses
import hashlib

from bert_mgpu.api.fine_tuning import FineTuned
from bert_mgpu.api.teacher_logits import TeacherLogits
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.distillation import (
    CACHED_AND_INSIDES,
    Intermediate,
    check_distillation,
    hidden_projection,
    with_teacher,
)
from bert_mgpu.model.tagging_objectives import CRFTagging

ROW_HEADS = ("classification", "regression", "multi_label")  # one output a text: another vocabulary can teach it


def weights_digest(model):
    """sha256 of a model's weights, in their order: which teacher a distilled run learnt from."""
    h = hashlib.sha256()
    for v in model.weights:
        h.update(v.path.encode() + b"\x00" + v.numpy().tobytes())
    return h.hexdigest()


def _kind(model):
    return model.objective.name + (" (CRF)" if isinstance(model.objective, CRFTagging) else "")


class Distiller:
    """A teacher's knowledge into a student of the same head, by the student's own `fit`.

    Args:
        teacher: a fine-tuned `BertClassifier` (classification, regression or multi-label) or `BertTagger`
            (without a CRF), on the towers the student trains on; its weights are not trained.
        student: a model of the same head with the teacher's labels on the same towers, e.g.
            `student_from_layers(teacher, (0, 2, 4))`; of the teacher's vocabulary, but for a classifier taught
            from `teacher_logits` (the teacher then reads each training text with its own tokenizer).
        temperature: the soft loss's temperature (Hinton's T; 1: the outputs as they are): both softmaxes'
            (classification, each word's tags) or sigmoids' (multi-label); a regression's squared difference
            has none.
        soft_weight, hard_weight: the soft loss's (times T^2) and the labels' loss's weights.
        unlabeled: text without labels, as the teacher's `predict` takes it (texts, (text_a, text_b) pairs for
            a pair classifier, a DataFrame; a tagger's texts or token lists), added to every epoch's training
            rows: each adds its soft term alone (where distillation gains most: much in-domain text, few labels).
        hidden_weight, attention_weight: the intermediate losses' weights (0: none): the hidden states' mean
            squared difference (a student of another hidden size through a learnt projection, trained and
            checkpointed with it, not part of its model) and the attention distributions' KL divergence (as
            many heads), layer by layer (model/distillation.py's `Intermediate`).
        layer_map: the teacher's encoder layer (from 0) each student layer learns from. Default: the layers a
            `student_from_layers` student was made of, else TinyBERT's uniform map (the last from the last).
        teacher_logits: a file that keeps the teacher's outputs on the training rows (api/teacher_logits.py):
            predicted there once, or read if it was made from the same rows and teacher; the steps then run
            the student alone. Not with the intermediate losses, which need the teacher's insides each step.
    """

    def __init__(self, teacher: FineTuned, student: FineTuned, temperature: float = 1.0,
                 soft_weight: float = 1.0, hard_weight: float = 1.0, unlabeled=None, hidden_weight: float = 0.0,
                 attention_weight: float = 0.0, layer_map=None, teacher_logits: str | None = None):
        self.temperature, self.soft_weight, self.hard_weight = check_distillation(temperature, soft_weight,
                                                                                  hard_weight)
        for model, role in ((teacher, "teacher"), (student, "student")):
            if not model.objective.distillable:
                raise UserError(f"distillation: the {role} is a {_kind(model)} head, which has no soft loss")
        if (type(teacher), teacher.objective.name) != (type(student), student.objective.name):
            raise UserError(f"distillation: the student is a {_kind(student)} head, the teacher a "
                            f"{_kind(teacher)} one")
        if list(teacher.labels) != list(student.labels):
            raise UserError(f"distillation: the student's labels ({', '.join(student.labels)}) are not the "
                            f"teacher's ({', '.join(teacher.labels)}), in the same order")
        self.own_words = (teacher.tokenizer.vocab, teacher.tokenizer.do_lower_case) != (
            student.tokenizer.vocab, student.tokenizer.do_lower_case)  # each reads the text its own way
        if self.own_words and not (teacher_logits and teacher.objective.name in ROW_HEADS
                                   and not getattr(teacher, "doc_stride", None)
                                   and not getattr(student, "doc_stride", None)):
            raise UserError("distillation: the student's vocabulary or casing is not the teacher's: only a "
                            "classifier (no --doc_stride) is taught across vocabularies, by --teacher_logits (the "
                            "teacher reads each training text its own way once)")
        if teacher.towers.strategy is not student.towers.strategy:
            raise UserError("distillation: the teacher and the student must be opened on the same Towers")
        self.teacher, self.student = teacher, student
        if layer_map is None:
            layer_map = getattr(student, "teacher_layers", None) or Intermediate.uniform(
                student.config.num_hidden_layers, teacher.config.num_hidden_layers)
        self.intermediate = Intermediate(tuple(int(i) for i in layer_map), float(hidden_weight),
                                         float(attention_weight)).check(student.config, teacher.config)
        if self.intermediate.active and not (teacher.fused_encoder and student.fused_encoder):
            raise UserError("--hidden_weight and --attention_weight need the fused encoder in the teacher and the "
                            "student: drop --fused_encoder=false")
        self.projection = None  # a student of another width: its hidden states through a learnt map
        if self.intermediate.hidden_weight:
            with student.towers.strategy.scope():
                self.projection = hidden_projection(student.config, teacher.config, student.policy)
        self.unlabeled = teacher.unlabelled_rows(unlabeled) if unlabeled is not None and len(unlabeled) else []
        if teacher_logits and self.intermediate.active:
            raise UserError(CACHED_AND_INSIDES)
        self.teacher_sha256 = weights_digest(teacher.model)
        self.cache = TeacherLogits(teacher_logits, teacher, self.teacher_sha256, self.own_words) \
            if teacher_logits else None

    @staticmethod
    def student_from_layers(teacher: FineTuned, layers) -> FineTuned:
        """A student of `len(layers)` encoder layers, each the teacher's layer of that index, with the teacher's
        embeddings, pooler and head (DistilBERT takes every second layer; HFL's RBT3 the first three)."""
        layers = [int(i) for i in layers]
        if teacher.config.model_type == "albert":
            raise UserError("teacher_layers: an ALBERT's layers are shared by its passes, so a student cannot take "
                            "some of them; give the student's own checkpoint or config")
        depth = teacher.config.num_hidden_layers
        if not layers or any(not 0 <= i < depth for i in layers) or len(set(layers)) != len(layers):
            raise UserError(f"teacher_layers={','.join(map(str, layers))}: distinct layers of the teacher's "
                            f"0-{depth - 1}")
        student = teacher.with_encoder(dataclasses.replace(teacher.config, num_hidden_layers=len(layers)))
        source = {v.path: v for v in teacher.model.weights}
        for v in student.model.weights:
            path = v.path
            if path.startswith("transformer_layer_"):
                index, rest = path[len("transformer_layer_"):].split("/", 1)
                path = f"transformer_layer_{layers[int(index)]}/{rest}"
            v.assign(source[path].value)
        student.teacher_layers = tuple(layers)  # the intermediate losses' default layer map
        return student

    def settings(self):
        """What a resumed distillation must share: the loss's numbers and the teacher's weights."""
        return {"distillation": {"temperature": self.temperature, "soft_weight": self.soft_weight,
                                 "hard_weight": self.hard_weight, "teacher_sha256": self.teacher_sha256,
                                 **({"unlabeled_examples": len(self.unlabeled)} if self.unlabeled else {}),
                                 **({"teacher_logits": "cached"} if self.cache else {}),
                                 **self.intermediate.settings()}}

    def attach(self):
        """From now on the student's `fit` learns from the teacher too, on the unlabelled rows as well, and
        records `settings()` (run_distill_mgpu.py's way in)."""
        def wrapper(loss):
            return with_teacher(loss, self.teacher.model, self.student.objective, self.temperature,
                                self.soft_weight, self.hard_weight, self.intermediate, self.projection)

        wrapper.settings = self.settings()  # recorded in the run and compared on resume, as the script's flags
        if self.cache:
            wrapper.batches = self.cache.batches  # each batch carries its rows' cached teacher outputs
        self.student.loss_wrapper, self.student.unlabelled = wrapper, self.unlabeled
        return self.student

    def fit(self, examples, output_dir: str, settings: dict | None = None, **keywords) -> dict:
        """The student's `fit` (every keyword of it) with the teacher's soft outputs in its loss -> its history."""
        self.attach()
        try:
            return self.student.fit(examples, output_dir, settings=settings, **keywords)
        finally:
            self.student.loss_wrapper, self.student.unlabelled = None, ()
