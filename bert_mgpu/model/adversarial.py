"""Adversarial training on the word embeddings, the fast gradient method (FGM; Miyato et al. 2017, "Adversarial
Training Methods for Semi-Supervised Text Classification", section 3): each training batch goes through the
model a second time with every example's word embeddings moved by epsilon along its own loss gradient, and that
pass's loss is added:

    r_i = epsilon x g_i / ||g_i||,   g_i = d loss / d (example i's word embeddings), over its tokens and units
    loss = loss(embeddings) + loss(embeddings + r)

The norm is each example's, as Miyato et al. define it. bert4keras' FGM example divides instead by the norm of
the whole embedding matrix's gradient, which ties each example's step to the rest of its batch and, on several
towers, to the other towers (one more all-reduce, the size of the embedding matrix, inside the step); with
each example's norm a step on 2 towers is the step on 1 (tested). The first pass's gradient is taken in the
tower step itself; the perturbation is a constant for the second pass, and the gradients of both passes are
all-reduced once, with the step's.

Example:
    loss_fn = with_fgm(objective.loss, epsilon=1.0)
    loss, stats = loss_fn(model, features, labels, training=True)   # stats["adversarial_loss"]
"""

import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.model.fused_encoder import word_embeddings


def fgm_perturbation(gradient, epsilon):
    """epsilon x each example's gradient [B, L, hidden] over its L2 norm (0 where the gradient is 0), float32."""
    g = tf.cast(gradient, tf.float32)
    norm = tf.sqrt(tf.reduce_sum(tf.square(g), axis=[1, 2], keepdims=True))
    return epsilon * tf.math.divide_no_nan(g, norm)


def check_fgm(epsilon):
    if not 0 < epsilon < float("inf"):
        raise UserError(f"--adv_epsilon={epsilon}: must be a finite number above 0")
    return float(epsilon)


def with_fgm(loss_fn, epsilon=1.0):
    """A training loss `(model, features, labels, training) -> (loss, stats)` from `loss_fn` (the head's) with
    FGM's second pass; evaluation keeps one pass. The model must run the fused encoder. Its statistics are the
    first pass's and `adversarial_loss`, the second pass's loss."""
    epsilon = check_fgm(epsilon)

    def loss(model, features, labels, training=True):
        if not training:
            return loss_fn(model, features, labels, training)
        looked_up, tape = [], tf.GradientTape()

        def keep(rows):
            tape.watch(rows)
            looked_up.append(rows)
            return rows

        with tape, word_embeddings(keep):
            clean, stats = loss_fn(model, features, labels, training)
            # Each example's own loss, not its share of the mean: gradients of one example's size, which
            # float16 holds (the direction is what counts; its scale goes in the norm).
            summed = clean * tf.cast(tf.shape(tf.nest.flatten(labels)[0])[0], clean.dtype)
        if not looked_up:
            raise UserError("--adversarial needs the fused encoder: drop --fused_encoder=false")
        delta = tf.stop_gradient(fgm_perturbation(tape.gradient(summed, looked_up[0]), epsilon))
        with word_embeddings(lambda r: r + tf.cast(delta, r.dtype)):
            adversarial, _ = loss_fn(model, features, labels, training)
        return clean + adversarial, {**stats, "adversarial_loss": adversarial}

    return loss
