"""bert_mgpu in its best configuration here: fused encoder, its own input pipeline, in `common.precision()`.

Usage: python benchmarks/bench_bert_mgpu.py CASE [TOWERS] [--no-fused] [--recompute] [--length_buckets]

`--length_buckets`: real-length training batches (cases b, t) of similar lengths, not in shuffled order.
"""

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

from bert_mgpu.parallel.distribute import distribute_dataset  # noqa: E402  (input as the library distributes it)

BUCKETS = "--length_buckets" in sys.argv


def rt_dataset(case, make_dataset=None):
    """Rotten Tomatoes for a case, through bert_mgpu's input pipeline (or another make_dataset)."""
    from bert_mgpu.data import input_pipeline
    from bert_mgpu.data.examples import Example

    spec = common.CASES[case]
    split = "dev" if spec["mode"] == "predict" else "train"
    examples = [Example(str(i), text, None, str(label))
                for i, (text, label) in enumerate(common.rotten_tomatoes(split))]
    make_dataset = make_dataset or input_pipeline.make_dataset
    training = spec["mode"] != "predict"
    return make_dataset(examples, _tokenizer(), ["0", "1"], common.SEQ, common.BATCH, training=training, seed=0,
                        **({"buckets": True} if training and BUCKETS else {}))


def ner_dataset(case):
    """make ner-demo's sentences for a case, as BertTagger reads them: windows of a word's pieces."""
    from bert_mgpu.data.tagged import Sentence
    from bert_mgpu.data.tagging_input import make_windows, tagging_dataset

    training = common.CASES[case]["mode"] != "predict"
    rows = common.ner_sentences("train" if training else "test")
    windows = make_windows([Sentence(str(i), w, t, 1) for i, (w, t) in enumerate(rows)], _tokenizer(),
                           common.NER_TAGS, common.SEQ)
    return tagging_dataset(windows, _tokenizer(), common.SEQ, common.BATCH, training=training, seed=0,
                           buckets=BUCKETS)


def case_dataset(case):
    return (ner_dataset if common.CASES[case]["data"] == "ner" else rt_dataset)(case)


@functools.lru_cache(maxsize=None)
def _tokenizer():
    """One, as an application keeps its tokenizer."""
    from bert_mgpu.data.tokenization import FullTokenizer

    return FullTokenizer(common.VOCAB, do_lower_case=True)


def build(case, towers=1, fused=True, recompute=False):
    """(towers, model, trainer, dataset) for a case: the model, optimizer and input of the benchmark."""
    spec = common.CASES[case]
    shape = common.SHAPES[spec["shape"]]
    from bert_mgpu.parallel.devices import Towers

    tw = Towers(n_gpus=0, towers_per_gpu=towers, train_batch_size=common.BATCH // towers)
    import numpy as np
    import tensorflow as tf

    from bert_mgpu.model.config import BertConfig
    from bert_mgpu.model.mlm_objective import MaskedLanguageModel
    from bert_mgpu.model.modeling import build_classifier, build_span_model, build_tagger
    from bert_mgpu.model.pretraining_model import build_pretrainer
    from bert_mgpu.model.span_objectives import SpanExtraction
    from bert_mgpu.model.tagging_objectives import TokenClassification
    from bert_mgpu.train import optimization
    from bert_mgpu.train.training import Trainer, classification_loss

    policy = "mixed_bfloat16" if common.precision() == "bf16" else "float32"
    config = BertConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                        intermediate_size=shape["inter"], hidden_act="gelu", max_position_embeddings=512)
    with tw.strategy.scope():
        if spec["mode"] == "mlm":
            model = build_pretrainer(config, policy, nsp=False, fused=fused)
        elif spec["mode"] == "span":
            model = build_span_model(config, policy, fused=fused)
        elif spec.get("head") == "tag":
            model = build_tagger(config, len(common.NER_TAGS), policy, fused=fused)
        else:
            model = build_classifier(config, 2, policy, fused=fused)
        optimizer = optimization.create_optimizer(5e-5, 100000, 100)
    from bert_mgpu.model.fused_encoder import set_recompute

    set_recompute(model, recompute)
    losses = {"mlm": MaskedLanguageModel().loss, "span": SpanExtraction().loss, "tag": TokenClassification().loss}
    trainer = Trainer(tw.strategy, model, optimizer,
                      loss_fn=losses.get(spec.get("head", spec["mode"]), classification_loss))

    if spec["data"] in ("rt", "ner"):
        ds = case_dataset(case)
    else:
        d = common.synthetic(8 * common.BATCH, seq=spec.get("seq", common.SEQ))
        ids = d["masked_ids"] if spec["mode"] == "mlm" else d["token_ids"]
        features = {"token_ids": ids, "segment_ids": d["segment_ids"], "padding_mask": d["padding_mask"]}
        if spec["mode"] == "mlm":
            features["mask_positions"] = d["mask_positions"]
            labels = {"masked_lm_ids": d["mask_ids"], "masked_lm_weights": np.ones_like(d["mask_ids"], np.float32)}
        elif spec["mode"] == "span":
            labels = d["spans"]
        else:
            labels = d["labels"]
        ds = tf.data.Dataset.from_tensor_slices((features, labels, np.arange(len(ids), dtype=np.int32)))
        ds = ds.repeat().batch(common.BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return tw, model, trainer, ds


def setup(case, towers=1, fused=True):
    """(trainer, iterator of distributed training batches) for a training case (profile_step.py)."""
    tw, _, trainer, ds = build(case, towers, fused)
    return trainer, iter(distribute_dataset(tw.strategy, ds.map(lambda f, y, i: (f, y))))


def main(case, towers=1, fused=True, recompute=False):
    spec = common.CASES[case]
    shape = common.SHAPES[spec["shape"]]
    import numpy as np
    import tensorflow as tf

    tw, model, trainer, ds = build(case, towers, fused, recompute)
    lengths_of = lambda f: np.asarray(f["padding_mask"]).sum(1)  # noqa: E731
    if spec["mode"] == "predict":
        if spec["data"] == "full":
            ds = ds.take(spec["warmup"] + spec["steps"])
            meter = common.Meter(spec["warmup"])
            dist = distribute_dataset(tw.strategy, ds)
            fn = None
            for batch in dist:
                fn = fn or tf.function(lambda b: tw.strategy.run(
                    lambda f: model(f, training=False), args=(b[0],)), reduce_retracing=True)  # noqa: B023
                out = fn(batch)
                tf.nest.map_structure(lambda t: t.numpy(), tw.strategy.experimental_local_results(out))
                meter.step(np.concatenate([lengths_of(f) for f in tw.strategy.experimental_local_results(batch[0])]))
        else:  # a pass reads the text: tokenizing is part of it, as in the other systems
            lengths = np.concatenate([lengths_of(f) for f, _, _ in ds.as_numpy_iterator()])
            trainer.predict_logits(case_dataset(case))  # warm-up pass: traces each batch width
            meter = common.Meter(0)
            trainer.predict_logits(case_dataset(case))
            meter.step(lengths)
    else:
        if spec["data"] in ("rt", "ner"):
            # The warm-up also runs one step of each batch width the timed steps will meet, so no shape's
            # first step is timed (measured, NOTES.md item 23: only the first few widths' cost extra).
            seen, first = set(), []
            for i, (f, y, _) in enumerate(ds.take(spec["warmup"] + spec["steps"])):
                width = int(f["token_ids"].shape[1])
                if i >= spec["warmup"] and width not in seen:
                    first.append((f, y))
                seen.add(width)
            for batch in first:
                trainer.train_step(next(iter(distribute_dataset(tw.strategy, tf.data.Dataset.from_tensors(batch)))))
        meter = common.Meter(spec["warmup"])
        dist = iter(distribute_dataset(tw.strategy, ds.map(lambda f, y, i: (f, y))))
        for _ in range(spec["warmup"] + spec["steps"]):
            batch = next(dist)
            trainer.train_step(batch)
            meter.step(np.concatenate([lengths_of(f) for f in tw.strategy.experimental_local_results(batch[0])]))
    name = "bert_mgpu" if towers == 1 else f"bert_mgpu_{towers}towers"
    name += "" if fused else "_unfused"
    common.emit(meter.result(name + ("_recompute" if recompute else ""), case, shape, spec["mode"],
                             precision=common.precision(), towers=towers, fused=fused, recompute=recompute))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0], int(args[1]) if len(args) > 1 else 1, fused="--no-fused" not in sys.argv,
         recompute="--recompute" in sys.argv)
