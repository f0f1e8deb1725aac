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

Example:
    loss_fn = with_teacher(objective.loss, teacher_model, objective, temperature=2.0)
    loss, stats = loss_fn(student_model, features, labels, training=True)   # stats["distill_soft"]
"""

import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.model.rdrop import Recording


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


def with_teacher(loss_fn, teacher, objective, temperature=1.0, soft_weight=1.0, hard_weight=1.0):
    """A training loss `(model, features, labels, training) -> (loss, stats)` from the student head's
    `loss_fn`: its loss times `hard_weight` plus `soft_weight` x the head `objective`'s soft term
    (`soft_term`) of the student's first pass against `teacher(features)`. A row (or word) without a label
    (unlabelled text) has no hard term: `objective.hard_part` hides it from the head's loss. Statistics:
    the head's, `distill_hard` and `distill_soft`."""
    temperature, soft_weight, hard_weight = check_distillation(temperature, soft_weight, hard_weight)
    if not objective.distillable:
        raise UserError(f"distillation: a {objective.name} head has no soft loss")

    def loss(model, features, labels, training=True):
        recording = Recording(model)
        hard_features, hard_labels = objective.hard_part(features, labels)
        hard, stats = loss_fn(recording, hard_features, hard_labels, training)
        inputs = {k: v for k, v in features.items() if k != "window_weight"}
        teacher_logits = tf.stop_gradient(teacher(inputs, training=False))
        soft = objective.soft_term(recording.outputs[0], teacher_logits, labels, temperature, features)
        return hard_weight * hard + soft_weight * soft, {**stats, "distill_hard": hard, "distill_soft": soft}

    return loss
