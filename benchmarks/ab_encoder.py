"""Is a change to the fused encoder faster? Forward+backward of two versions, interleaved in one process.

Separate processes differ by up to 2x on these machines (NOTES.md item 6: some runs sit idle on thread
wake-ups), so a change is measured against the version before it in the same process, call after call,
on the same backbone and batch: the ratio of medians is what the change is worth.

Usage:
    git show HEAD:bert_mgpu/model/fused_encoder.py > /tmp/before.py
    python benchmarks/ab_encoder.py /tmp/before.py [--shape minilm] [--length 128] [--reps 12] [--inference]
                                                   [--dev-set]

--inference times the forward pass alone (training=False), as prediction runs it. --dev-set times a pass
over the Rotten Tomatoes dev set's batches as case (eb) makes them (every batch width, in one traced
function) instead of one batch of --length.

One process holds both versions' kernels, so it misses what acts on a whole process: item 26 of NOTES.md
read neutral here and 10% slower in alternated whole (eb) processes (item 28). Confirm a change that
passes here with alternated `bench_bert_mgpu.py` processes.
"""

import argparse
import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import common  # noqa: E402


def load_other(path):
    """The other fused_encoder.py as a module; its gradient names renamed so both can be registered."""
    source = open(path).read().replace('"BertMgpu', '"BertMgpuOther')
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("other_fused_encoder", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", help="another version of bert_mgpu/model/fused_encoder.py")
    ap.add_argument("--shape", default="minilm", choices=sorted(common.SHAPES))
    ap.add_argument("--length", type=int, default=common.SEQ)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--inference", action="store_true", help="forward only, training=False")
    ap.add_argument("--dev-set", action="store_true", help="a pass over (eb)'s dev-set batches a call")
    args = ap.parse_args()
    import tensorflow as tf

    from bert_mgpu.model import fused_encoder
    from bert_mgpu.model.config import BertConfig
    from bert_mgpu.model.modeling import build_backbone

    shape = common.SHAPES[args.shape]
    config = BertConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                        intermediate_size=shape["inter"], hidden_act="gelu", max_position_embeddings=512)
    backbone = build_backbone(config, "mixed_bfloat16")
    keys = ("token_ids", "segment_ids", "padding_mask")
    if args.dev_set:
        import bench_bert_mgpu

        batches = [{k: tf.constant(f[k]) for k in keys}
                   for f, _, _ in bench_bert_mgpu.rt_dataset("eb").as_numpy_iterator()]
    else:
        d = common.synthetic(common.BATCH, seq=args.length)
        batches = [{k: tf.constant(d[k]) for k in keys}]

    def step_of(module):
        encoder = module.FusedBertEncoder(backbone, pooled_only=True)

        @tf.function(reduce_retracing=True)
        def one(features):
            if args.inference:
                return [encoder(features, training=False)["pooled_output"]]
            with tf.GradientTape() as tape:
                pooled = encoder(features, training=True)["pooled_output"]
                loss = tf.reduce_sum(tf.cast(pooled, tf.float32) ** 2)
            return tape.gradient(loss, backbone.trainable_variables)  # all of them, none pruned

        def step():
            return [one(features)[-1] for features in batches]

        return step

    steps = {"other": step_of(load_other(args.other)), "this": step_of(fused_encoder)}
    common.ab_compare({name: (lambda step=step: step()[-1].numpy()) for name, step in steps.items()}, args.reps)

if __name__ == "__main__":
    main()
