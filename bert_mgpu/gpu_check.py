"""`make gpu-check`: what the first person with GPUs runs to check bert_mgpu on them, in one command.

Lists the GPUs TensorFlow sees and prints the device plan; trains a few steps on every tower and checks
that all towers hold bit-equal weights afterwards (the all-reduce, NCCL between GPUs); compares the
fused encoder with keras-hub's BertBackbone in the run's precision (mixed_float16 on GPUs with fp16
tensor cores), forward and gradients, against stated tolerances; runs one XLA-compiled step; times
training on 1, 2, ... N towers and prints the scaling table, and JSON with every number. On a machine
without GPUs it runs the same checks on logical CPU devices and says so.

Usage: python -m bert_mgpu.gpu_check [--shapes demo,base] [--steps 10] [--out gpu_check.json]
"""

import argparse
import json
import sys
import time

import numpy as np

SHAPES = {  # (hidden, layers, heads, intermediate): the test model, make demo's MiniLM-L6, BERT-base
    "tiny": (64, 2, 4, 256), "demo": (384, 6, 12, 1536), "base": (768, 12, 12, 3072)}
TOLERANCE = {"mixed_float16": (0.05, 0.02), "mixed_bfloat16": (0.1, 0.05), "float32": (1e-4, 1e-4)}
SEQ, PER_TOWER = 128, 16


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", help=f"model shapes to time, of {','.join(SHAPES)} (GPUs: demo,base; CPU: tiny)")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per tower count")
    ap.add_argument("--cpu_towers", type=int, default=2, help="logical CPU devices where there is no GPU")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args(argv)

    import tensorflow as tf

    from bert_mgpu import devices, precision

    gpus = tf.config.list_physical_devices("GPU")
    report = {"gpus": [dict(tf.config.experimental.get_device_details(g), name=g.name) for g in gpus]}
    if gpus:
        print(f"TensorFlow sees {len(gpus)} GPU(s):")
        for g in report["gpus"]:
            print(f"  {g['name']}: {g.get('device_name', '?')}, compute capability {g.get('compute_capability')}")
        plan = devices.plan_devices(len(gpus), 1, PER_TOWER, devices.discover_visible_gpus())
    else:
        print(f"no GPU visible to TensorFlow: the same checks on {args.cpu_towers} logical CPU devices")
        plan = devices.plan_devices(0, args.cpu_towers, PER_TOWER, ())
    devices.configure_devices(plan)
    print(plan.describe())
    policy, why = precision.resolve_precision("auto", plan)
    if not gpus:
        policy, why = "mixed_float16", "what GPUs with tensor cores use; here on the CPU, for the checks only"
    print(f"precision: {policy} ({why})")
    report.update(device_type=plan.device_type, towers=plan.towers, policy=policy, checks={})
    checks = report["checks"]
    checks["towers_bit_equal"] = towers_stay_equal(plan, policy)
    checks["fused_matches_keras_hub"] = fused_matches_keras_hub(policy)
    checks["xla_step"] = xla_step(plan, policy)
    shapes = (args.shapes or ("demo,base" if gpus else "tiny")).split(",")
    report["scaling"] = scaling(plan, policy, shapes, args.steps)
    print_scaling(report["scaling"])
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    failed = [name for name, c in checks.items() if not c["ok"]]
    print(f"\n{len(checks) - len(failed)} of {len(checks)} checks passed on {plan.towers} {plan.device_type} "
          f"tower(s){': FAILED ' + ', '.join(failed) if failed else ''}; JSON: {args.out}")
    return 1 if failed else 0


def _model(strategy, shape, policy, fused=True, dropout=None):
    from bert_mgpu import modeling, optimization
    from bert_mgpu.config import BertConfig

    hidden, layers, heads, inter = SHAPES[shape]
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=inter, max_position_embeddings=512)
    with strategy.scope():
        model = modeling.build_classifier(config, 2, policy, dropout=dropout, fused=fused)
        opt = optimization.create_optimizer(1e-4, 1000, 0, float16=policy == "mixed_float16")
    return model, opt


def _batches(strategy, global_batch, steps, seed=0):
    import tensorflow as tf

    from bert_mgpu import distribute

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (steps * global_batch, SEQ)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices(
        ({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)},
         rng.integers(0, 2, steps * global_batch).astype("int32"))).batch(global_batch)
    return list(distribute.distribute_dataset(strategy, data))


def towers_stay_equal(plan, policy, steps=3):
    """A few training steps on every tower; then every variable's copies must be bit-equal across towers."""
    from bert_mgpu import distribute, training

    strategy = distribute.make_strategy(plan)
    model, opt = _model(strategy, "tiny", policy)
    trainer = training.Trainer(strategy, model, opt)
    losses = [trainer.train_step(b)[0] for b in _batches(strategy, plan.global_batch, steps)]
    differ = [v.path for v in model.weights
              if any(not np.array_equal(c.numpy(), strategy.experimental_local_results(v)[0].numpy())
                     for c in strategy.experimental_local_results(v))]
    ok = not differ and all(np.isfinite(losses)) and trainer.applied_steps > 0
    print(f"[{'ok' if ok else 'FAIL'}] {steps} steps on {plan.towers} towers ({plan.all_reduce}): losses "
          f"{', '.join(f'{x:.3f}' for x in losses)}, {trainer.applied_steps} applied; "
          f"{len(differ)} variable(s) differ between towers")
    return {"ok": ok, "losses": losses, "applied": trainer.applied_steps, "differ": differ}


def fused_matches_keras_hub(policy):
    """The fused encoder against keras-hub's BertBackbone on the same variables, in `policy`: outputs
    (largest absolute error) and gradients (relative error of all gradients together: the key bias's
    gradient is zero in exact arithmetic, so its own relative error is rounding over rounding)."""
    import tensorflow as tf

    from bert_mgpu.config import BertConfig
    from bert_mgpu.fused_encoder import FusedBertEncoder
    from bert_mgpu.modeling import build_backbone

    out_tol, grad_tol = TOLERANCE[policy]
    hidden, layers, heads, inter = SHAPES["tiny"]
    backbone = build_backbone(BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=heads, intermediate_size=inter,
                                         max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0), policy)
    fused = FusedBertEncoder(backbone)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 1000, (4, 32)).astype("int32")
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}
    weights = rng.normal(size=(4, 32, hidden)).astype("float32")

    def run(fn):
        with tf.GradientTape() as tape:
            out = fn(x, training=True)
            y = tf.cast(out["sequence_output"], tf.float32)
            loss = tf.reduce_sum(y * weights) + tf.reduce_sum(tf.cast(out["pooled_output"], tf.float32))
        return y.numpy(), [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, backbone.trainable_variables)]

    (a, ga), (b, gb) = run(fused), run(backbone)
    out_err = float(np.abs(a - b).max())
    flat_a, flat_b = (np.concatenate([g.ravel() for g in gs]) for gs in (ga, gb))
    grad_err = float(np.linalg.norm(flat_a - flat_b) / np.linalg.norm(flat_b))
    ok = out_err <= out_tol and grad_err <= grad_tol
    print(f"[{'ok' if ok else 'FAIL'}] fused encoder vs keras-hub BertBackbone in {policy}: output error "
          f"{out_err:.2g} (tolerance {out_tol}), gradient relative error {grad_err:.2g} (tolerance {grad_tol})")
    return {"ok": ok, "output_error": out_err, "gradient_error": grad_err, "tolerance": [out_tol, grad_tol]}


def xla_step(plan, policy):
    """One training step with each tower's forward and backward XLA-compiled (--use_xla)."""
    from bert_mgpu import distribute, training

    strategy = distribute.make_strategy(plan)
    model, opt = _model(strategy, "tiny", policy)
    loss, _ = training.Trainer(strategy, model, opt, use_xla=True).train_step(
        _batches(strategy, plan.global_batch, 1)[0])
    ok = bool(np.isfinite(loss))
    print(f"[{'ok' if ok else 'FAIL'}] one --use_xla step: loss {loss:.4f}")
    return {"ok": ok, "loss": loss}


def scaling(plan, policy, shapes, steps):
    """Training examples per second on 1, 2, ... N towers (PER_TOWER sequences of SEQ tokens each)."""
    import dataclasses

    from bert_mgpu import distribute, training

    rows = []
    for shape in shapes:
        for n in range(1, plan.towers + 1):
            sub = dataclasses.replace(plan, physical_ids=plan.physical_ids[:n] if plan.physical_ids else (),
                                      towers_per_device=1 if plan.physical_ids else n)
            strategy = distribute.make_strategy(sub)
            model, opt = _model(strategy, shape, policy)
            trainer = training.Trainer(strategy, model, opt)
            batches = _batches(strategy, sub.global_batch, steps + 2)
            for b in batches[:2]:  # trace, compile, warm
                trainer.train_step(b)
            start = time.perf_counter()
            for b in batches[2:]:
                trainer.train_step(b)
            rate = steps * sub.global_batch / (time.perf_counter() - start)
            rows.append({"shape": shape, "towers": n, "examples_per_s": rate,
                         "per_tower": PER_TOWER, "seq": SEQ})
    for row in rows:
        one = next(r for r in rows if r["shape"] == row["shape"] and r["towers"] == 1)
        row["speedup"] = row["examples_per_s"] / one["examples_per_s"]
        row["efficiency"] = row["speedup"] / row["towers"]
    return rows


def print_scaling(rows):
    print("\n| shape | towers | ex/s | speed-up | efficiency |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['towers']} | {r['examples_per_s']:.1f} | {r['speedup']:.2f}x | "
              f"{100 * r['efficiency']:.0f}% |")


if __name__ == "__main__":
    sys.exit(main())
