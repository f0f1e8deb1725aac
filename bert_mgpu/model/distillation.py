"""Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"): a student
learns the teacher's softened distribution over classes beside the hard labels, as DistilBERT and
TextBrewer's classifiers do:

    loss = hard_weight x CE(labels, student) + soft_weight x T^2 x CE(softmax(teacher / T), student / T)

The soft term is a cross-entropy, not a KL divergence: the two differ by the teacher's entropy, a constant
for the student, so the gradients are the same; T^2 keeps their size as T changes (Hinton's section 2).
That is a softmax head's; each head kind owns its soft term (`Objective.soft_loss`): a multi-label head's
is each label's tempered binary cross-entropy, a regression's the squared difference of the two scores.
The teacher runs in the same tower step, without dropout and without gradients: its variables are not
trainable, not in the optimizer and not all-reduced. A row without a label (label -1: unlabelled in-domain
text, which the teacher labels on the fly) adds only its soft term; the mean is over all rows, so each row
counts once whether it has a label or not.

Optionally the student also learns the teacher's insides (`Intermediate`), layer by layer through a layer
map: the hidden states' mean squared difference (TinyBERT, Jiao et al. 2020) and the attention distributions'
KL divergence (TinyBERT's layers, MiniLM's measure, Wang et al. 2020), both over the real tokens.

Example:
    loss_fn = with_teacher(objective.loss, teacher_model, objective, temperature=2.0)
    loss, stats = loss_fn(student_model, features, labels, training=True)   # stats["distill_soft"]
"""

import contextlib
import dataclasses

import tensorflow as tf

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import UserError
from bert_mgpu.model.fused_encoder import tapped
from bert_mgpu.model.rdrop import Recording

CACHED = "teacher_logits"  # a batch's feature holding its rows' teacher outputs, predicted once
CACHED_AND_INSIDES = ("--teacher_logits and --hidden_weight or --attention_weight: the intermediate losses need the "
                      "teacher's insides at each step; drop one of them")


def soft_cross_entropy(student_logits, teacher_logits, temperature=1.0):
    """Each row's cross-entropy of the student's softmax at `temperature` against the teacher's, in float32,
    times temperature^2: -T^2 sum_c softmax(t / T)_c log softmax(s / T)_c."""
    t = tf.cast(temperature, tf.float32)
    student, teacher = tf.cast(student_logits, tf.float32) / t, tf.cast(teacher_logits, tf.float32) / t
    return -tf.reduce_sum(tf.nn.softmax(teacher) * tf.nn.log_softmax(student), -1) * t * t


def check_distillation(temperature, soft_weight, hard_weight):
    """The three numbers of a distillation, or UserError in one line."""
    if not temperature > 0 or temperature == float("inf"):
        raise UserError(f"--temperature={temperature}: must be a finite number above 0")
    for name, value in (("soft_weight", soft_weight), ("hard_weight", hard_weight)):
        if not 0 <= value < float("inf"):
            raise UserError(f"--{name}={value}: must be a finite number, 0 or more")
    if not soft_weight + hard_weight > 0:
        raise UserError("--soft_weight and --hard_weight are both 0: nothing to learn from")
    return float(temperature), float(soft_weight), float(hard_weight)


def hidden_mse(student, teacher, padding_mask):
    """Each row's mean squared difference of two hidden states [B, L, hidden] over its real tokens and the
    hidden units, in float32 -> [B]."""
    real = tf.cast(padding_mask, tf.float32)
    per_token = tf.reduce_mean(tf.square(tf.cast(student, tf.float32) - tf.cast(teacher, tf.float32)), -1)
    return tf.reduce_sum(per_token * real, -1) / tf.maximum(tf.reduce_sum(real, -1), 1.0)


def attention_kl(student, teacher, padding_mask):
    """Each row's KL(teacher || student) of two layers' attention distributions, from their scores
    [B, heads, L, L] (padded keys at a large negative bias), averaged over the heads and the real query
    tokens, in float32 -> [B]."""
    log_s = tf.nn.log_softmax(tf.cast(student, tf.float32))
    log_t = tf.nn.log_softmax(tf.cast(teacher, tf.float32))
    per_query = tf.reduce_mean(tf.reduce_sum(tf.exp(log_t) * (log_t - log_s), -1), 1)  # [B, L]
    real = tf.cast(padding_mask, tf.float32)
    return tf.reduce_sum(per_query * real, -1) / tf.maximum(tf.reduce_sum(real, -1), 1.0)


@dataclasses.dataclass(frozen=True)
class Intermediate:
    """The intermediate losses' weights and which teacher layer each student layer learns from
    (`layer_map[j]`: the teacher's encoder layer, from 0, of the student's layer j). The hidden term is the
    mean over the embeddings' output and each mapped layer's; the attention term the mean over mapped layers."""

    layer_map: tuple
    hidden_weight: float = 0.0
    attention_weight: float = 0.0

    @property
    def active(self):
        return self.hidden_weight > 0 or self.attention_weight > 0

    def check(self, student_config, teacher_config):
        """UserError in one line for weights or a map that do not fit the two encoders; returns self."""
        for name in ("hidden_weight", "attention_weight"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise UserError(f"--{name}={value}: must be a finite number, 0 or more")
        layers, depth = len(student_config.schedule), len(teacher_config.schedule)  # an ALBERT's passes
        given = ",".join(map(str, self.layer_map))
        if len(self.layer_map) != layers or any(not 0 <= i < depth for i in self.layer_map):
            raise UserError(f"--layer_map={given}: one teacher layer (0-{depth - 1}) for each of the student's "
                            f"{layers} layers")
        if self.attention_weight and student_config.num_attention_heads != teacher_config.num_attention_heads:
            raise UserError(f"--attention_weight: the student has {student_config.num_attention_heads} attention "
                            f"heads, the teacher {teacher_config.num_attention_heads}; they must be as many")
        return self

    def settings(self):
        return {"layer_map": list(self.layer_map), "hidden_weight": self.hidden_weight,
                "attention_weight": self.attention_weight} if self.active else {}

    @staticmethod
    def uniform(student_layers, teacher_layers):
        """TinyBERT's map: the student's layer j learns from the teacher's (j + 1) x teacher/student - 1,
        so the last learns from the last."""
        return tuple((j + 1) * teacher_layers // student_layers - 1 for j in range(student_layers))

    def terms(self, student_tap, teacher_tap, projection=None):
        """(hidden term, attention term) [B] each of one pass of the student against the teacher's;
        `projection` (a layer) maps the student's hidden states to the teacher's width first."""
        mask = student_tap.padding_mask
        zero = tf.zeros(tf.shape(mask)[:1], tf.float32)
        hidden = attention = zero
        if self.hidden_weight:
            pairs = [(0, 0), *((j + 1, t + 1) for j, t in enumerate(self.layer_map))]
            mapped = (lambda h: h) if projection is None else projection  # noqa: E731
            hidden = tf.add_n([hidden_mse(mapped(student_tap.hidden[s]), tf.stop_gradient(teacher_tap.hidden[t]),
                                          mask) for s, t in pairs]) / len(pairs)
        if self.attention_weight:
            attention = tf.add_n([attention_kl(student_tap.scores[j], tf.stop_gradient(teacher_tap.scores[t]), mask)
                                  for j, t in enumerate(self.layer_map)]) / len(self.layer_map)
        return hidden, attention


def hidden_projection(student_config, teacher_config, policy):
    """TinyBERT's learnt map from the student's hidden size to the teacher's (one for the embeddings' output and
    every layer), built in the current strategy's scope; None where the sizes agree."""
    import keras

    if student_config.hidden_size == teacher_config.hidden_size:
        return None
    layer = keras.layers.Dense(teacher_config.hidden_size, dtype=policy, name="distillation_projection")
    layer.build((None, None, student_config.hidden_size))
    return layer


def with_teacher(loss_fn, teacher, objective, temperature=1.0, soft_weight=1.0, hard_weight=1.0,
                 intermediate=None, projection=None):
    """A training loss `(model, features, labels, training) -> (loss, stats)` from the student head's
    `loss_fn`: its loss times `hard_weight` plus `soft_weight` x the head `objective`'s soft term
    (`soft_term`) of the student's first pass against `teacher(features)`, or against the batch's feature
    `teacher_logits` where it has one (the teacher's outputs predicted once: api/teacher_logits.py). A row (or
    word) without a label (unlabelled text) has no hard term: `objective.hard_part` hides it from the head's
    loss. With an active `intermediate` (Intermediate; both models on the fused encoder) its weighted terms
    are added, each the mean over the rows (a long document's windows weighted as the soft term weighs them);
    `projection` (`hidden_projection`) maps a narrower or wider student's hidden states to the teacher's, and
    is trained and checkpointed with the student (the loss's `trainable_variables` and `checkpointed`). Statistics: the
    head's, `distill_hard` and `distill_soft`, and `distill_hidden` and `distill_attention` when weighted."""
    temperature, soft_weight, hard_weight = check_distillation(temperature, soft_weight, hard_weight)
    if not objective.distillable:
        raise UserError(f"distillation: a {objective.name} head has no soft loss")
    inside = intermediate is not None and intermediate.active

    def taps():
        return tapped(scores=bool(intermediate.attention_weight)) if inside else contextlib.nullcontext([])

    def loss(model, features, labels, training=True):
        features = dict(features)
        cached = features.pop(CACHED, None)  # the teacher's outputs, predicted once (--teacher_logits)
        if inside and cached is not None:
            raise UserError(CACHED_AND_INSIDES)
        if inside and intermediate.attention_weight and training and any(
                getattr(layer, "recompute", False) for layer in _compat.sublayers(model)):
            raise UserError("--attention_weight and --recompute: the recomputed layers cannot hand out their "
                            "attention; drop one of them")
        recording = Recording(model)
        hard_features, hard_labels = objective.hard_part(features, labels)
        with taps() as student_taps:
            hard, stats = loss_fn(recording, hard_features, hard_labels, training)
        if cached is None:
            inputs = {k: v for k, v in features.items() if k != "window_weight"}
            with taps() as teacher_taps:
                teacher_logits = tf.stop_gradient(teacher(inputs, training=False))
        else:
            teacher_logits = cached
        soft = objective.soft_term(recording.outputs[0], teacher_logits, labels, temperature, features)
        total, stats = hard_weight * hard + soft_weight * soft, {**stats, "distill_hard": hard, "distill_soft": soft}
        if inside:
            if not (student_taps and teacher_taps):
                raise UserError("intermediate distillation (--hidden_weight, --attention_weight) needs the fused "
                                "encoder in the teacher and the student: drop --fused_encoder=false")
            weight = features.get("window_weight")
            weight = 1.0 if weight is None else tf.cast(weight, tf.float32)
            hidden, attention = (tf.reduce_mean(t * weight)
                                 for t in intermediate.terms(student_taps[0], teacher_taps[0], projection))
            total += intermediate.hidden_weight * hidden + intermediate.attention_weight * attention
            stats = {**stats, **({"distill_hidden": hidden} if intermediate.hidden_weight else {}),
                     **({"distill_attention": attention} if intermediate.attention_weight else {})}
        return total, stats

    if projection is not None:
        loss.trainable_variables = projection.trainable_variables
        loss.checkpointed = {"distillation_projection": projection}
    return loss
