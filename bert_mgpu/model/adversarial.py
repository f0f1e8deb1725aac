"""Adversarial training on the word embeddings: the fast gradient method (FGM; Miyato et al. 2017, "Adversarial
Training Methods for Semi-Supervised Text Classification", section 3) and its iterated form, projected gradient
descent (PGD; Madry et al. 2018). Each training batch goes through the model again with every example's word
embeddings moved uphill, and that pass's loss is added:

    FGM:  r_i = epsilon x g_i / ||g_i||,   g_i = d loss / d (example i's word embeddings), over its tokens and units
    PGD:  K steps r <- project_epsilon(r + alpha x g_i(r) / ||g_i(r)||) from r = 0, each g taken at the moved point
    loss = loss(embeddings) + loss(embeddings + r)

as the FGM/PGD recipes competition users run in PyTorch (the first pass's and the last pass's gradients summed;
PGD's intermediate passes only find the direction). The norm is each example's, as Miyato et al. define it.
bert4keras' FGM example divides instead by the norm of the whole embedding matrix's gradient, which ties each
example's step to the rest of its batch and, on several towers, to the other towers (one more all-reduce, the
size of the embedding matrix, inside the step); with each example's norm a step on 2 towers is the step on 1
(tested). The gradients that find r are taken in the tower step itself; r is a constant for the last pass, and
the gradients of both counted passes are all-reduced once, with the step's.

Example:
    loss_fn = with_adversarial(objective.loss, epsilon=0.05)                        # FGM
    loss_fn = with_adversarial(objective.loss, epsilon=0.05, steps=3, alpha=0.02)   # PGD
    loss, stats = loss_fn(model, features, labels, training=True)   # stats["adversarial_loss"]
"""

import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.model.fused_encoder import word_embeddings


def _per_example_norm(t):
    return tf.sqrt(tf.reduce_sum(tf.square(t), axis=[1, 2], keepdims=True))


def fgm_perturbation(gradient, epsilon):
    """epsilon x each example's gradient [B, L, hidden] over its L2 norm (0 where the gradient is 0), float32."""
    g = tf.cast(gradient, tf.float32)
    return epsilon * tf.math.divide_no_nan(g, _per_example_norm(g))


def project(r, epsilon):
    """Each example's r [B, L, hidden] scaled back onto the ball of radius epsilon where it left it."""
    norm = _per_example_norm(r)
    return r * tf.minimum(1.0, tf.math.divide_no_nan(tf.cast(epsilon, r.dtype), norm) + tf.cast(norm == 0, r.dtype))


def with_adversarial(loss_fn, epsilon=0.05, steps=1, alpha=None):
    """A training loss `(model, features, labels, training) -> (loss, stats)` from `loss_fn` (the head's) with an
    adversarial pass: FGM with one step (alpha = epsilon), PGD with `steps` steps of `alpha`, each example's r
    kept within `epsilon` (a word embedding's own norm is about 1; benchmarks/NOTES.md item 87 on the size).
    Evaluation keeps one pass. The model must run the fused encoder. Its statistics are
    the first pass's and `adversarial_loss`, the last pass's loss. The numbers are `fit`'s to check
    (train_config.check_adversarial)."""
    alpha = epsilon if alpha is None else alpha

    def loss(model, features, labels, training=True):
        if not training:
            return loss_fn(model, features, labels, training)
        rows_in_batch = tf.shape(tf.nest.flatten(labels)[0])[0]
        r, clean, stats = None, None, None
        for step in range(steps):
            looked_up, tape = [], tf.GradientTape()

            def moved(rows, r=r, tape=tape, looked_up=looked_up):
                tape.watch(rows)
                looked_up.append(rows)
                return rows if r is None else rows + tf.cast(r, rows.dtype)

            with tape, word_embeddings(moved):
                value, step_stats = loss_fn(model, features, labels, training)
                # Each example's own loss, not its share of the mean: gradients of one example's size, which
                # float16 holds (the direction is what counts; its scale goes in the norm).
                summed = value * tf.cast(rows_in_batch, value.dtype)
            if not looked_up:
                raise UserError("--adversarial needs the fused encoder: drop --fused_encoder=false")
            if step == 0:
                clean, stats = value, step_stats
            g = fgm_perturbation(tape.gradient(summed, looked_up[0]), alpha)
            r = tf.stop_gradient(project(g if r is None else r + g, epsilon))
        with word_embeddings(lambda rows: rows + tf.cast(r, rows.dtype)):
            adversarial, _ = loss_fn(model, features, labels, training)
        return clean + adversarial, {**stats, "adversarial_loss": adversarial}

    return loss


def with_fgm(loss_fn, epsilon=0.05):
    """FGM: `with_adversarial` with one step of `epsilon`."""
    return with_adversarial(loss_fn, epsilon)
