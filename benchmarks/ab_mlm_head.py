"""A/B of the masked-LM head and loss, forward and backward, in one process (benchmarks/NOTES.md, 13, 16).

At case (c)'s shape (batch 32, length 128, 20 predictions, hidden 384, the 30522-word vocabulary),
mixed_bfloat16, traced, calls interleaved so drift in the machine's speed hits both alike:
- `--part head`: keras-hub's MaskedLMHead against bert_mgpu's TiedMaskedLMHead (same weights), each
  followed by Keras' cross-entropy on float32 logits;
- `--part loss`: TiedMaskedLMHead, then Keras' cross-entropy and argmax on a float32 copy of the
  logits (as before item 16) against `sparse_xent` and argmax on the bfloat16 logits.

Usage: python benchmarks/ab_mlm_head.py [--part head|loss] [--reps 30]
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("head", "loss"), default="head")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import keras
    import keras_hub
    import tensorflow as tf

    from bert_mgpu.model.kernels import sparse_xent
    from bert_mgpu.model.pretraining_model import TiedMaskedLMHead

    policy = keras.DTypePolicy("mixed_bfloat16")
    table = keras_hub.layers.ReversibleEmbedding(30522, 384, dtype=policy)
    table.build((None,))
    kw = dict(vocabulary_size=30522, token_embedding=table, intermediate_activation="gelu",
              layer_norm_epsilon=1e-12, dtype=policy)
    if args.part == "head":
        heads = {"keras-hub": keras_hub.layers.MaskedLMHead(**kw), "bert_mgpu": TiedMaskedLMHead(**kw)}
    else:
        heads = {"float32 copy": TiedMaskedLMHead(**kw), "sparse_xent": TiedMaskedLMHead(**kw)}
    hidden = tf.cast(tf.random.normal([32, 128, 384]), tf.bfloat16)
    positions = tf.random.uniform([32, 20], 0, 128, tf.int32)
    labels = tf.random.uniform([32, 20], 0, 30522, tf.int32)
    steps = {}
    for name, head in heads.items():
        def step(head=head, name=name):
            with tf.GradientTape() as tape:
                tape.watch(hidden)
                logits = head(hidden, mask_positions=positions)
                if name == "sparse_xent":
                    per = sparse_xent(tf.reshape(labels, [-1]), tf.reshape(logits, [-1, 30522]))
                else:
                    logits = tf.cast(logits, tf.float32)
                    per = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
                loss = tf.reduce_mean(per)
                hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
            grads = tape.gradient(loss, [hidden] + head.trainable_weights)
            return loss + hits + tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads])
        steps[name] = tf.function(step)
    first, second = heads
    heads[second].set_weights(heads[first].get_weights())
    common.ab_compare({name: (lambda f=f: f().numpy()) for name, f in steps.items()}, args.reps, warmup=2)

if __name__ == "__main__":
    main()
