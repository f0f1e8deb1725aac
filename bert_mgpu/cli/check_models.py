"""What `make gpu-check`'s checks build alike (checks_gpu.py, checks_gpu_heads.py): BERT's shapes, a
classifier's trainer, random batches, and which variables differ between the towers."""

import numpy as np

SEQ = 128
SHAPES = {  # (hidden, layers, heads, intermediate)
    "tiny": (64, 2, 4, 256), "demo": (384, 6, 12, 1536), "base": (768, 12, 12, 3072)}
TOLERANCE = {"mixed_float16": (0.05, 0.02), "mixed_bfloat16": (0.1, 0.05), "float32": (1e-4, 1e-4)}


def bert_config(shape, vocab=30522):
    from bert_mgpu.model.config import BertConfig

    hidden, layers, heads, inter = SHAPES[shape]
    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=inter, max_position_embeddings=512)


def classifier_trainer(strategy, shape, policy, **kwargs):
    from bert_mgpu.model import modeling
    from bert_mgpu.train import optimization, training

    with strategy.scope():
        model = modeling.build_classifier(bert_config(shape), 2, policy)
        opt = optimization.create_optimizer(1e-4, 1000, 0, float16=policy == "mixed_float16")
    return training.Trainer(strategy, model, opt, **kwargs)


def random_batches(global_batch, seq, steps, seed=0):
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (steps * global_batch, seq)).astype("int32")
    features = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}
    labels = rng.integers(0, 2, steps * global_batch).astype("int32")
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(global_batch, drop_remainder=True)


def towers_differ(strategy, model):
    return [v.path for v in model.trainable_variables
            if any(not np.array_equal(c.numpy(), strategy.experimental_local_results(v.value)[0].numpy())
                   for c in strategy.experimental_local_results(v.value))]
