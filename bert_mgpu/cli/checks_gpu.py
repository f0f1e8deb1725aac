"""The checks `make gpu-check` runs (gpu_check.py), one per function; each takes the process's `Setup` and
returns a dict with `ok`, a one-line `summary` and its numbers. Each runs in a process of its own."""

import dataclasses
import os
import re
import time

import numpy as np

from bert_mgpu.cli.check_models import SEQ, TOLERANCE, bert_config, classifier_trainer, random_batches, towers_differ


def devices(setup):
    """CUDA numbers GPUs as nvidia-smi does (PCI bus order), so that GPU i is `nvidia-smi -i i`: each GPU's
    name as TensorFlow reports it against nvidia-smi's for the same CUDA_VISIBLE_DEVICES entry."""
    import tensorflow as tf

    from bert_mgpu.parallel import devices as devs

    order = os.environ.get("CUDA_DEVICE_ORDER")
    if not setup.gpu:
        return {"ok": order == "PCI_BUS_ID", "cuda_device_order": order,
                "summary": f"no GPU to number; CUDA_DEVICE_ORDER={order} before CUDA started"}
    smi = {key: (index, uuid, name) for index, uuid, name, _ in devs.nvidia_smi_gpus() for key in (index, uuid)}
    rows = []
    for gpu, visible in zip(tf.config.list_physical_devices("GPU"), setup.plan.visible_names):
        tf_name = tf.config.experimental.get_device_details(gpu).get("device_name", "?")
        index, uuid, smi_name = smi.get(visible, ("?", "?", "?"))
        rows.append({"tensorflow": gpu.name, "tf_name": tf_name, "cuda_visible": visible, "nvidia_smi_index": index,
                     "uuid": uuid, "smi_name": smi_name, "same": smi_name == tf_name})
    # The system/ metrics training logs: NVML must answer for every GPU the towers use.
    from bert_mgpu.train.system_metrics import SystemMetrics

    metrics = SystemMetrics(setup.plan.visible_names).read()
    unread = [i for i in range(len(rows)) if f"system/gpu{i}_memory_used_gib" not in metrics]
    ok = order == "PCI_BUS_ID" and all(r["same"] for r in rows) and not unread
    nvml = (f"NVML gave nothing for GPU(s) {unread} (nvidia-ml-py installed? the gpu extra has it)" if unread
            else "NVML: " + ", ".join(f"{k[7:]} {v:.3g}" for k, v in metrics.items() if k.startswith("system/gpu")))
    return {"ok": ok, "gpus": rows, "cuda_device_order": order, "system_metrics": metrics,
            "summary": "; ".join(f"{r['tensorflow']} = CUDA {r['cuda_visible']} = nvidia-smi {r['nvidia_smi_index']} "
                                 f"{r['uuid']} ({r['smi_name']})" for r in rows) + f"; {nvml}"}


def libraries(setup):
    """Which CUDA, cuDNN and NCCL TensorFlow loaded (after a training step), and no CUDA 13 wheel installed
    beside TensorFlow's CUDA 12 ones (they write the same files)."""
    from importlib import metadata

    import tensorflow as tf

    build = {k: v for k, v in tf.sysconfig.get_build_info().items() if "version" in k or k == "is_cuda_build"}
    if setup.gpu:
        trainer = classifier_trainer(setup.strategy(), "tiny", "float32")
        trainer.train_step(next(trainer.training_batches(random_batches(setup.per_tower * setup.plan.towers, 32, 1))))
    with open("/proc/self/maps") as f:
        loaded = sorted({line.split()[-1] for line in f
                         if re.search(r"lib(nccl|cudnn|cudart|cublas)\b[^/]*\.so", line)})
    wheels = {d.metadata["Name"]: d.version for d in metadata.distributions()
              if (d.metadata["Name"] or "").startswith("nvidia-")}
    cu13 = sorted(n for n in wheels if n.endswith("-cu13"))
    found = {lib: next((os.path.basename(p) for p in loaded if f"lib{lib}" in p), None) for lib in ("nccl", "cudnn")}
    nccl = next((nccl_version(p) for p in loaded if "libnccl" in os.path.basename(p)), None)
    ok = not cu13 and (not setup.gpu or all(found.values()))
    summary = (f"TensorFlow built for CUDA {build.get('cuda_version', '-')}, cuDNN {build.get('cudnn_version', '-')}; "
               f"loaded {', '.join(loaded) or 'no CUDA library (no GPU)'}{f' (NCCL {nccl})' if nccl else ''}"
               f"{'; CUDA 13 wheels installed: ' + ', '.join(cu13) if cu13 else ''}")
    return {"ok": ok, "build": build, "loaded": loaded, "nccl_version": nccl, "nvidia_wheels": wheels,
            "cuda13_wheels": cu13, "summary": summary}


def nccl_version(path):
    """The version the NCCL library at `path` (one this process loaded) says it is, through its own
    ncclGetVersion: "2.19.3". A file name or a wheel's version can differ from what was loaded. None where
    the library gives none."""
    import ctypes

    try:
        get = ctypes.CDLL(path).ncclGetVersion
    except (OSError, AttributeError):
        return None
    code = ctypes.c_int(0)
    if get(ctypes.byref(code)) != 0:  # ncclSuccess
        return None
    code = code.value  # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def step(setup, policy, steps=4):
    """Training steps of a BERT-base-sized classifier (its gradients go in several packs of 32 MB) in
    `policy` on every tower: finite losses, at least one step applied (float16's first loss scales may
    skip some), towers bit-equal after, and each pack one dtype."""
    strategy = setup.strategy()
    quick = getattr(setup, "quick", False)
    trainer = classifier_trainer(strategy, "tiny" if quick else "base", policy,
                                 bytes_per_pack=4096 if quick else 32 * 2**20)
    per_tower, seq = (16, SEQ) if setup.gpu else (1, 16)
    batches = trainer.training_batches(random_batches(per_tower * setup.plan.towers, seq, steps))
    graph = trainer.step_graph(trainer.input_spec)
    packs = [(op.get_attr("T").name, op.inputs[0].shape.num_elements()) for op in graph.get_operations()
             if op.type == "CollectiveReduceV2" and op.inputs[0].shape.num_elements() not in (None, 1)
             and re.search(r"device:(CPU|GPU):0$", op.device)]  # the first tower's op of each pack
    losses = [trainer.train_step(b)[0] for b in batches]
    differ = towers_differ(strategy, trainer.model)
    hints = sorted({op.get_attr("communication_hint").decode() for op in graph.get_operations()
                    if op.type == "CollectiveReduceV2"})
    ok = bool(np.all(np.isfinite(losses))) and trainer.applied_steps >= 1 and not differ and len(packs) >= 2
    return {"ok": ok, "losses": losses, "applied": trainer.applied_steps, "differ": differ, "packs": packs,
            "collectives": hints,
            "summary": f"{steps} steps on {setup.plan.towers} towers ({'/'.join(hints)} collectives), "
                       f"{len(packs)} gradient packs ({', '.join(sorted({d for d, _ in packs}))}), "
                       f"{trainer.applied_steps} applied, losses {', '.join(f'{x:.3f}' for x in losses)}; "
                       f"{len(differ)} variable(s) differ between towers"}


def heads_mixed_float16(setup, steps=3):
    """Every head kind and every trick that changes the tower step, trained in mixed_float16 on every tower:
    finite losses, towers bit-equal after, and each one's own sign of life (checks_gpu_heads.run lists them)."""
    from bert_mgpu.cli import checks_gpu_heads  # its imports are every head's: only this check's child loads them

    return checks_gpu_heads.run(setup, steps)


def two_towers_per_gpu(setup, steps=3):
    """--towers_per_gpu=2: logical devices on each GPU, RING collectives between all towers."""
    strategy = setup.strategy()
    trainer = classifier_trainer(strategy, "tiny", "mixed_float16")
    batches = trainer.training_batches(random_batches(4 * setup.plan.towers, 32, steps))
    losses = [trainer.train_step(b)[0] for b in batches]
    differ = towers_differ(strategy, trainer.model)
    ok = bool(np.all(np.isfinite(losses))) and not differ
    return {"ok": ok, "towers": setup.plan.towers, "all_reduce": setup.plan.all_reduce, "losses": losses,
            "summary": f"{setup.plan.towers} towers, {setup.plan.all_reduce} collectives: losses "
                       f"{', '.join(f'{x:.3f}' for x in losses)}; {len(differ)} variable(s) differ"}


def run_out_of_memory(tower, from_step):
    """Make `tower` of every Trainer made after this ask for 4 TiB from step `from_step` on, before it joins
    the step's collectives: a real ResourceExhaustedError from TensorFlow's allocator (a reduction of zeros
    that size is folded away by Grappler; random numbers are not)."""
    import tensorflow as tf

    from bert_mgpu.train import training

    original = training.Trainer._loss_and_grads

    def loss_and_grads(self, features, labels):
        here = tf.distribute.get_replica_context().replica_id_in_sync_group
        size = tf.where(tf.logical_and(self.step >= from_step, here == tower), tf.constant(2**40, tf.int64), 1)
        with tf.control_dependencies([tf.reduce_max(tf.random.uniform(tf.reshape(size, [1])))]):
            return original(self, tf.nest.map_structure(tf.identity, features), labels)

    training.Trainer._loss_and_grads = loss_and_grads


def failing_tower(setup, timeout_seconds=120):
    """Tower 1 asks for 4 TiB in its second step, before it joins the step's collectives: every tower must
    stop at once with the one-line out-of-memory message, well inside the collective timeout."""
    from bert_mgpu.core.errors import RunError

    run_out_of_memory(tower=1, from_step=1)
    trainer = classifier_trainer(setup.strategy(timeout_seconds=timeout_seconds), "tiny", "float32")
    batches = trainer.training_batches(random_batches(4 * setup.plan.towers, 32, 3))
    trainer.train_step(next(batches))
    start = time.monotonic()
    try:
        trainer.train_step(next(batches))
        message = "the step went through"
    except RunError as e:
        message = str(e)
    took = time.monotonic() - start
    ok = message.startswith("out of memory on tower 1 at per-tower batch 4") and took < timeout_seconds
    return {"ok": ok, "message": message, "seconds": took,
            "summary": f"ended in {took:.1f} s (collective timeout {timeout_seconds} s): {message[:90]}"}


def auto_batch_size(setup):
    """--auto_batch_size: the largest per-tower batch whose step fits (GPUs: TensorFlow's cap of the GPU with
    the least free memory; without GPUs a 1 GiB limit, 256 MiB with --quick), found by real trials."""
    import types

    from bert_mgpu.model import modeling
    from bert_mgpu.train import memory

    strategy = setup.strategy()
    plan = setup.plan if setup.gpu else dataclasses.replace(setup.plan, device_type="CPU", physical_ids=(),
                                                           towers_per_device=setup.plan.towers)
    towers = types.SimpleNamespace(plan=plan, strategy=strategy, gpus=setup.gpus)
    with strategy.scope():
        model = modeling.build_classifier(bert_config("base" if setup.gpu else "tiny"), 2,
                                          "mixed_float16" if setup.gpu else "float32")
    best = memory.find_for_model(towers, model, "mixed_float16" if setup.gpu else "float32",
                                 lambda n: memory.classifier_batch(n, SEQ),
                                 memory_limit_mb=None if setup.gpu else 256 if getattr(setup, "quick", False)
                                 else 1024, cap=256)
    how = "BERT-base, first tower alone" if setup.gpu else "tiny, CPU trials of every tower's real step"
    return {"ok": best >= 1, "per_tower_batch": best, "summary": f"{best} sequences of {SEQ} tokens per tower fit "
                                                                  f"({how})"}


def fused_matches_keras_hub(setup):
    """The fused encoder against keras-hub's BertBackbone on the same variables, forward and gradients, in
    each mixed precision (largest output error; relative error of all gradients together)."""
    import tensorflow as tf

    from bert_mgpu.model.fused_encoder import FusedBertEncoder
    from bert_mgpu.model.modeling import build_backbone

    results, ok = {}, True
    for policy in ("mixed_float16", "mixed_bfloat16"):
        config = dataclasses.replace(bert_config("tiny", vocab=1000), hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
        backbone = build_backbone(config, policy)
        fused = FusedBertEncoder(backbone)
        rng = np.random.default_rng(0)
        ids = rng.integers(1, 1000, (4, 32)).astype("int32")
        x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids, bool)}
        weights = rng.normal(size=(4, 32, config.hidden_size)).astype("float32")

        def run(fn, x=x, weights=weights, backbone=backbone):
            with tf.GradientTape() as tape:
                out = fn(x, training=True)
                y = tf.cast(out["sequence_output"], tf.float32)
                loss = tf.reduce_sum(y * weights) + tf.reduce_sum(tf.cast(out["pooled_output"], tf.float32))
            grads = tape.gradient(loss, backbone.trainable_variables)
            return y.numpy(), np.concatenate([tf.convert_to_tensor(g).numpy().ravel() for g in grads])

        (a, ga), (b, gb) = run(fused), run(backbone)
        out_err, grad_err = float(np.abs(a - b).max()), float(np.linalg.norm(ga - gb) / np.linalg.norm(gb))
        out_tol, grad_tol = TOLERANCE[policy]
        ok = ok and out_err <= out_tol and grad_err <= grad_tol
        results[policy] = {"output_error": out_err, "gradient_error": grad_err, "tolerance": [out_tol, grad_tol]}
    return {"ok": ok, **results, "summary": "; ".join(
        f"{p}: output {r['output_error']:.2g} (tolerance {r['tolerance'][0]}), gradients {r['gradient_error']:.2g} "
        f"({r['tolerance'][1]})" for p, r in results.items())}


def xla_step(setup):
    """One training step with each tower's forward and backward XLA-compiled (--use_xla), then the same step
    from the same weights with --recompute: the same loss, and updates that differ by float rounding only
    (mean |difference| over mean |update|)."""
    import keras

    from bert_mgpu.model.fused_encoder import set_recompute

    runs = {}
    for recompute in (False, True):
        keras.utils.set_random_seed(0)  # the same weights and dropout masks
        policy = "mixed_float16" if setup.gpu else "float32"
        trainer = classifier_trainer(setup.strategy(), "tiny", policy, use_xla=True)
        set_recompute(trainer.model, recompute)
        before = [v.numpy() for v in trainer.model.trainable_variables]
        loss, _ = trainer.train_step(next(trainer.training_batches(random_batches(4 * setup.plan.towers, 32, 1))))
        runs[recompute] = loss, before, [v.numpy() for v in trainer.model.trainable_variables]
    (loss, before, plain), (again, _, recomputed) = runs[False], runs[True]
    update = np.mean(np.concatenate([np.abs(a - b).ravel() for a, b in zip(plain, before)]))
    differ = np.mean(np.concatenate([np.abs(a - b).ravel() for a, b in zip(plain, recomputed)])) / update
    ok = bool(np.isfinite(loss) and np.isfinite(again) and abs(loss - again) <= 1e-3 and differ <= 0.05)
    return {"ok": ok, "loss": loss, "recompute_loss": again, "recompute_update_difference": float(differ),
            "summary": f"one --use_xla step: loss {loss:.4f}; with --recompute {again:.4f}, updates differing by "
                       f"{differ:.2%} of their size (at most 5%)"}


def worker(task_index, worker_hosts):
    """One of two worker processes (gpu_check.two_workers): train, evaluate (the evaluation's frozen weight
    copies are new variables, broadcast between workers), report a checksum of the weights."""
    import tensorflow as tf

    from bert_mgpu.parallel import devices as devs
    from bert_mgpu.parallel import precision

    gpus = bool(tf.config.list_physical_devices("GPU"))
    towers = devs.Towers(n_gpus=-1 if gpus else 0, train_batch_size=4, worker_hosts=worker_hosts,
                         task_index=task_index, collective_timeout_seconds=300)
    policy = precision.resolve_precision("auto", towers.plan)[0] if gpus else "mixed_bfloat16"
    trainer = classifier_trainer(towers.strategy, "tiny", policy)
    losses = [trainer.train_step(b)[0] for b in trainer.training_batches(random_batches(towers.global_batch, 32, 3))]
    eval_loss = trainer.evaluate(random_batches(towers.global_batch, 32, 2))["loss"]
    checksum = float(sum(np.abs(v.numpy()).sum() for v in trainer.model.trainable_variables))
    ok = bool(np.all(np.isfinite(losses))) and np.isfinite(eval_loss)
    return {"ok": ok, "policy": policy, "losses": [round(x, 4) for x in losses], "eval_loss": round(eval_loss, 4),
            "checksum": checksum, "device_type": "GPU" if gpus else "CPU"}


def _text_pipeline(global_batch, seq, directory):
    """The fine-tuning input pipeline (input_pipeline.make_dataset: tokenizing in tf.data, batches in
    shuffled order) over made-up texts of 130 to 200 words, so every batch is `seq` tokens wide, as
    docs/gpu_scaling.md's model assumes (and no step compiles kernels for a new width)."""
    from bert_mgpu.data import input_pipeline, tokenization
    from bert_mgpu.data.examples import Example

    words = [f"w{i}" for i in range(2000)]
    vocab = os.path.join(directory, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    rng = np.random.default_rng(0)
    examples = [Example(str(i), " ".join(rng.choice(words, rng.integers(130, 201))), None, str(i % 2))
                for i in range(max(512, 8 * global_batch))]
    tokenizer = tokenization.FullTokenizer(vocab)
    return input_pipeline.make_dataset(examples, tokenizer, ["0", "1"], seq, global_batch, training=True, seed=0)


def scaling(setup, steps=None):
    """The training loop's throughput on 1, 2, ... N towers: the fine-tuning input pipeline, its record of
    examples/s over the last `steps` of 2 x `steps` steps (the first ones trace and compile); BERT-base at
    16 sequences of 128 tokens per GPU, the tiny model without GPUs."""
    import tempfile

    from bert_mgpu.parallel import distribute
    from bert_mgpu.train.loop import Loop

    shape, per_tower = ("base", 16) if setup.gpu else ("tiny", 8)
    steps = steps or (10 if getattr(setup, "quick", False) else 50)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for n in range(1, setup.plan.towers + 1):
            plan = dataclasses.replace(setup.plan, physical_ids=setup.plan.physical_ids[:n],
                                       visible_names=setup.plan.visible_names[:n])
            strategy = distribute.make_strategy(plan, devices=None if setup.gpu else setup.devices[:n])
            trainer = classifier_trainer(strategy, shape, "mixed_float16" if setup.gpu else "float32")
            data = _text_pipeline(per_tower * n, SEQ, directory)
            rate = Loop(trainer, per_tower * n, log_every=steps, verbose=False).run(
                data, until_step=2 * steps)["examples_per_second"]
            rows.append({"shape": shape, "towers": n, "examples_per_s": rate, "per_tower": per_tower,
                         "max_seq_length": SEQ})
    for row in rows:
        row["speedup"] = row["examples_per_s"] / rows[0]["examples_per_s"]
        row["efficiency"] = row["speedup"] / row["towers"]
    return {"ok": all(r["examples_per_s"] > 0 for r in rows), "rows": rows,
            "summary": ", ".join(f"{r['towers']}: {r['examples_per_s']:.1f} ex/s ({100 * r['efficiency']:.0f}%)"
                                 for r in rows)}
