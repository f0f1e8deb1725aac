"""Is a change to the optimizer step faster? Two versions of optimization.py, interleaved in one process.

Both build `create_optimizer` (AdamW, global-norm clipping, the loss-scale wrapper) over the variables of
a MiniLM-L6 backbone (22.7 M parameters) and apply the same dense float32 gradients, traced, as the
training step does (benchmarks/NOTES.md, item 15). With `--case a|b|c`, whole training steps of that
benchmark case instead: two trainers over one model, one per optimizer, `--steps` steps a call.

Usage:
    git show HEAD:bert_mgpu/train/optimization.py > /tmp/before.py
    python benchmarks/ab_optimizer.py /tmp/before.py [--reps 30] [--optimizer lamb] [--case b --steps 20]
"""

import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", help="another version of bert_mgpu/train/optimization.py")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--case", choices=["a", "b", "c"], help="time training steps of this case instead")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--optimizer", choices=["adamw", "lamb"], default="adamw")
    args = ap.parse_args()
    import numpy as np
    import tensorflow as tf

    from bert_mgpu.model.config import BertConfig
    from bert_mgpu.model.modeling import build_backbone
    from bert_mgpu.train import optimization

    spec = importlib.util.spec_from_file_location("other_optimization", args.other)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    if args.case:
        if args.optimizer != "adamw":
            ap.error("--case trains with the benchmark's AdamW; compare LAMB without --case")
        return compare_steps(other, args)
    shape = common.SHAPES["minilm"]
    config = BertConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                        intermediate_size=shape["inter"], hidden_act="gelu", max_position_embeddings=512)
    rng = np.random.default_rng(0)

    def step_of(opt, variables):
        return tf.function(lambda g: opt.apply(g, variables))

    steps = {}
    for name, module in (("other", other), ("this", optimization)):
        variables = build_backbone(config, "mixed_bfloat16").trainable_variables
        grads = [tf.constant(rng.normal(scale=1e-3, size=v.shape).astype("float32")) for v in variables]
        opt = module.create_optimizer(1e-4, 1000, 100, optimizer=args.optimizer)
        opt.build(variables)
        steps[name] = (step_of(opt, variables), grads)
    print(f"{sum(int(np.prod(g.shape)) for g in steps['this'][1]) / 1e6:.1f} M parameters")
    common.ab_compare({name: (lambda f=f, g=g: f(g)) for name, (f, g) in steps.items()}, args.reps)


def compare_steps(other, args):
    """Training steps of a benchmark case, the other optimizer's trainer against this one's."""
    import bench_bert_mgpu

    from bert_mgpu.parallel.distribute import distribute_dataset
    from bert_mgpu.train.training import Trainer

    tw, model, this_trainer, ds = bench_bert_mgpu.build(args.case)
    with tw.strategy.scope():
        other_opt = other.create_optimizer(5e-5, 100000, 100)
    trainers = {"other": Trainer(tw.strategy, model, other_opt, loss_fn=this_trainer.loss_fn),
                "this": this_trainer}
    it = iter(distribute_dataset(tw.strategy, ds.map(lambda f, y, i: (f, y))))
    batches = [next(it) for _ in range(args.steps)]  # both see the same batches

    def steps_of(trainer):
        def run():
            for batch in batches:
                loss = trainer.train_step(batch)[0]
            float(loss)
        return run

    common.ab_compare({name: steps_of(t) for name, t in trainers.items()}, args.reps, warmup=2)

if __name__ == "__main__":
    main()
