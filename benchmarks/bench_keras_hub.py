"""keras-hub as its documentation recommends: BertClassifier / BertMaskedLM, compile, fit and predict.

Precision: `common.precision()` (mixed_bfloat16 or float32), without XLA, its fastest here (XLA made bf16
slower; see NOTES.md). Rotten
Tomatoes goes through its own BertTextClassifierPreprocessor (tokenize and pad to sequence_length).

Usage: python benchmarks/bench_keras_hub.py CASE
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


class _Clock:
    """Keras callback feeding a Meter one call per batch (lengths come from the data, in order)."""

    def __init__(self, meter, lengths):
        self.meter, self.lengths, self.i = meter, lengths, 0

    def __call__(self, batch, logs=None):
        n = self.lengths[self.i % len(self.lengths)]
        self.i += 1
        self.meter.step(n)


def main(case):
    spec = common.CASES[case]
    shape = common.SHAPES[spec["shape"]]
    import keras
    import keras_hub
    import numpy as np
    import tensorflow as tf

    keras.mixed_precision.set_global_policy("mixed_bfloat16" if common.precision() == "bf16" else "float32")
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=shape["vocab"], num_layers=shape["layers"], num_heads=shape["heads"],
        hidden_dim=shape["hidden"], intermediate_dim=shape["inter"], max_sequence_length=512)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    b = common.BATCH

    if spec["data"] == "rt":
        tokenizer = keras_hub.models.BertTokenizer(vocabulary=common.VOCAB, lowercase=True)
        pre = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=common.SEQ)
        model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=pre)
        rows = common.rotten_tomatoes("dev" if spec["mode"] == "predict" else "train")
        texts = np.array([t for t, _ in rows], dtype=object)
        labels = np.array([y for _, y in rows], np.int32)
        # Real lengths, for the token count only (keras-hub pads every one to sequence_length).
        real = np.asarray(pre(tf.constant(texts))["padding_mask"]).sum(1)
        batches = [real[i:i + b] for i in range(0, len(real), b)]
    else:
        d = common.synthetic(8 * b)
        batches = [d["padding_mask"][:b].sum(1)]
        features = {"token_ids": d["token_ids"], "segment_ids": d["segment_ids"],
                    "padding_mask": d["padding_mask"]}
        if spec["mode"] == "mlm":
            model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
            features = dict(features, token_ids=d["masked_ids"], mask_positions=d["mask_positions"])
            data = tf.data.Dataset.from_tensor_slices((features, d["mask_ids"], np.ones_like(d["mask_ids"], "float32")))
        else:
            model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)
            data = tf.data.Dataset.from_tensor_slices((features, d["labels"]))

    model.compile(optimizer=keras.optimizers.AdamW(5e-5), loss=loss, jit_compile=False)
    if spec["mode"] == "predict":
        if spec["data"] == "rt":
            model.predict(texts, batch_size=b, verbose=0)  # warm-up pass
            meter = common.Meter(0)
            model.predict(texts, batch_size=b, verbose=0)
            for n in batches:
                meter.seen += 1
                meter.examples += len(n)
                meter.lengths.extend(int(x) for x in n)
        else:
            n = spec["warmup"] + spec["steps"]
            meter = common.Meter(spec["warmup"])
            clock = _Clock(meter, batches)
            cb = keras.callbacks.LambdaCallback(on_predict_batch_end=clock)
            ds = data.map(lambda f, *rest: f).repeat().batch(b).take(n).prefetch(tf.data.AUTOTUNE)
            model.predict(ds, verbose=0, callbacks=[cb])
    else:
        n = spec["warmup"] + spec["steps"]
        meter = common.Meter(spec["warmup"])
        cb = keras.callbacks.LambdaCallback(on_train_batch_end=_Clock(meter, batches))
        if spec["data"] == "rt":
            ds = tf.data.Dataset.from_tensor_slices((texts, labels)).shuffle(len(texts), seed=0).repeat().batch(b)
            # The length list follows the shuffled order only on average; tokens/s uses the mean length.
            mean = float(np.mean(np.concatenate(batches)))
            cb = keras.callbacks.LambdaCallback(on_train_batch_end=_Clock(meter, [np.full(b, mean)]))
        else:
            ds = data.repeat().batch(b, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        model.fit(ds, epochs=1, steps_per_epoch=n, verbose=0, callbacks=[cb])
    common.emit(meter.result("keras_hub", case, shape, spec["mode"], precision=common.precision()))


if __name__ == "__main__":
    main(sys.argv[1])
