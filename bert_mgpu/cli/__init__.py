"""What the entry scripts share: tower, precision and reliability flags, defined once (--do_export's, with
the exports themselves, in exports.py); the towers made from them; and `main_wrapper`, which ends a user
mistake or a failed run in one line on stderr and exit 1, and a run a signal stopped with the exit code a
scheduler retries (`errors.Interrupted`)."""

import logging
import os
import sys

from absl import flags

from bert_mgpu.cli.exports import check_exports, define_export_flags, export_targets, run_exports  # noqa: F401
from bert_mgpu.core import quiet


def main_wrapper(run, tensorflow=True):
    """An absl `main(argv)` that runs `run()` and turns a UserError or RunError into `script: error: ...`
    and exit 1, an Interrupted into its line on stdout and its retryable exit code. `tensorflow=False`: a
    script that never loads it (predict_exported.py), so its start-up is not quieted either."""

    def main(argv):
        if len(argv) > 1:
            sys.exit(f"{argv[0]}: error: unexpected arguments {' '.join(argv[1:])}")
        from bert_mgpu.core import supervise
        from bert_mgpu.core.errors import Interrupted, RunError, UserError, disk_full

        if os.environ.pop(supervise.CHILD, None) is None:
            limit = supervise.memory_limit()
            if limit is not None:  # the parent only waits and, if the child dies of it, says so in one line
                sys.exit(supervise.run_in_child(os.path.basename(argv[0]), limit))
        else:
            import faulthandler

            faulthandler.disable()  # absl's thread dump; the parent says what happened

        logging.getLogger("bert_mgpu").setLevel(logging.INFO)
        logging.getLogger("tensorflow").setLevel(logging.WARNING)  # per-step tf.distribute INFO lines
        try:
            if tensorflow:
                quiet.start_tensorflow_quietly()
            run()
        except Interrupted as e:
            print(e, flush=True)
            sys.exit(e.exit_code)
        except (UserError, RunError) as e:
            print(f"{os.path.basename(argv[0])}: error: {e}", file=sys.stderr)
            sys.exit(1)
        except Exception as e:  # a full disk is the user's to fix: one line; anything else is a bug to show
            line = disk_full(e)
            if line is None:
                raise
            print(f"{os.path.basename(argv[0])}: error: {line}", file=sys.stderr)
            sys.exit(1)

    return main


def define_reliability_flags(auto_batch_help):
    """The flags both scripts share for crashes, bad numbers, reruns and memory (README: "When things go
    wrong"). `auto_batch_help` says what --auto_batch_size sizes in that script."""
    flags.DEFINE_bool("deterministic", False, "Deterministic ops: a resumed run ends bit-identical to an "
                      "uninterrupted one (same seed, same devices, a step budget).")
    flags.DEFINE_integer("max_consecutive_skips", 10, "Stop after this many steps in a row with non-finite "
                         "gradients (0: never).")
    flags.DEFINE_integer("save_total_limit", 2, "Checkpoints kept in --output_dir: the newest, and the ones "
                         "before it to resume from if it is damaged (best/ is kept besides).")
    flags.DEFINE_bool("overwrite_output_dir", False, "Start over in an --output_dir holding a run with other "
                      "flags (its checkpoints are removed).")
    flags.DEFINE_bool("auto_batch_size", False, auto_batch_help + " (98% of GPU memory, or --memory_limit_mb).")
    flags.DEFINE_integer("memory_limit_mb", None, "--auto_batch_size: memory a training step may take "
                         "(required on CPU: all towers together; on GPU: per tower).")


def define_tower_flags():
    """Where the towers run and in what precision: the same flags in both scripts (README: "Flags")."""
    flags.DEFINE_integer("n_gpus", -1, "GPUs to use, in CUDA_VISIBLE_DEVICES order; -1 = every visible GPU (the "
                         "CPU when none is visible); 0 = the CPU, GPUs hidden from TensorFlow.")
    flags.DEFINE_integer("towers_per_gpu", 1, "Towers (model replicas) per GPU, or logical CPU towers with "
                         "--n_gpus=0.")
    flags.DEFINE_integer("gpu_memory_per_tower_mb", None, "Memory of each tower when --towers_per_gpu > 1 "
                         "(default: what TensorFlow's allocator may take of the GPU with the least free "
                         "memory, its free memory less TensorFlow's reserve, divided by the towers).")
    flags.DEFINE_string("worker_hosts", None, "Several machines: every worker's host:port, comma-separated, the "
                        "same list on each (TensorFlow's MultiWorkerMirroredStrategy).")
    flags.DEFINE_integer("task_index", None, "With --worker_hosts: this machine's place in it (0 = the chief).")
    flags.DEFINE_bool("multi_worker", False, "Several machines, the cluster from TF_CONFIG or SLURM's srun.")
    flags.DEFINE_integer("slurm_port", None, "Under SLURM: the first port of each node's workers (default: the "
                         "step's reserved ports, srun --resv-ports, else 8888).")
    flags.DEFINE_enum("precision", "auto", ["auto", "mixed_float16", "mixed_bfloat16", "float32"],
                      "auto: mixed_float16 on tensor-core GPUs, mixed_bfloat16 on AMX/AVX512-BF16 CPUs, else "
                      "float32.")
    flags.DEFINE_float("collective_timeout_seconds", 0, "For debugging a hang: a collective between towers or "
                       "workers that waits longer than this ends the run with an error (0: no limit). TensorFlow "
                       "keeps a thread for each collective that long, so a run holds this many seconds times its "
                       "collectives a second in threads.")
    flags.DEFINE_bool("use_xla", False, "XLA-compile each tower's forward and backward pass.")
    flags.DEFINE_bool("recompute", False, "Recompute each encoder layer in the backward pass instead of keeping "
                      "its activations: less memory (a larger batch, or length 512), about one more forward "
                      "pass a step, the same gradients.")
    flags.DEFINE_bool("fused_encoder", True, "Run the encoder as bert_mgpu's fused layer; false: keras-hub's "
                      "BertBackbone as it is (the reference, slower; same variables and checkpoints).")
    flags.DEFINE_bool("dry_run", False, "Print the device plan and precision, then exit.")
    flags.DEFINE_integer("log_every_steps", 50, "Log (console, TensorBoard) every this many steps; only then "
                         "does the host wait for the GPUs, which otherwise always have the next step queued.")
    flags.DEFINE_list("report_to", [], "Also report the run to: tensorboard (its HParams dashboard: settings and "
                      "final metrics), wandb (offline unless WANDB_MODE says otherwise), mlflow (a file store in "
                      "OUTPUT_DIR/mlruns unless MLFLOW_TRACKING_URI names another); all; none.")


def report_final(f, results, step):
    """--report_to, on the chief: the dev results after training to the loggers training reported to."""
    from bert_mgpu.train import reporting

    reporting.report_results(f.report_to, f.output_dir, results, step)


def check_output_file(path, flag, inputs=()):
    """A file a script will write, checked before any work: not a directory, in a directory that exists
    and can be written, and none of the files the script reads (`inputs`: (flag, value) pairs) or a link to
    one, which writing would replace. One line naming `flag` otherwise."""
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError

    if storage.is_remote(path):
        return path
    check_not_an_input(path, flag, inputs)
    if os.path.isdir(path):
        raise UserError(f"{flag}={path} is a directory; give a file name in it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{flag}={path}: the directory {parent} does not exist")
    try:
        storage.probe_writable(parent)
    except OSError as e:
        raise UserError(f"{flag}={path}: {parent} is not writable ({e.strerror})") from None
    return path


def check_numbers(f, at_least=None, positive=(), fraction=()):
    """Numeric flags out of range end in one line before anything is read or written: `at_least` maps a
    flag to its smallest value; `positive` floats must be finite and above 0; `fraction` in [0, 1]. A flag
    left unset (None) is not checked."""
    import math

    from bert_mgpu.core.errors import UserError

    for name, low in (at_least or {}).items():
        if getattr(f, name) is not None and getattr(f, name) < low:
            raise UserError(f"--{name}={getattr(f, name)}: must be at least {low}")
    for name in positive:
        value = getattr(f, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"--{name}={value}: must be a finite number above 0")
    for name in fraction:
        value = getattr(f, name)
        if value is not None and not 0 <= value <= 1:
            raise UserError(f"--{name}={value}: must be between 0 and 1")


def check_not_an_input(path, flag, inputs):
    """UserError when `path` is (or links to) a file one of `inputs` ((flag, comma list, glob or list of
    them) pairs) names: a script writing there would replace the text it reads."""
    import glob

    from bert_mgpu.core.errors import UserError

    if not os.path.exists(path):
        return
    for name, value in inputs:
        values = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
        for given in (v.strip() for v in values if v and v.strip()):
            for found in glob.glob(given) or [given]:
                if os.path.exists(found) and os.path.samefile(path, found):
                    raise UserError(f"{flag}={path} is the file {name}={found} names: writing it would replace "
                                    "the input; give another output name")


def plan_from_flags(f):
    """(device plan, cluster or None) the tower flags ask for, the cluster resolved once; listing GPUs does not
    start TensorFlow's runtime."""
    from bert_mgpu.parallel import devices
    from bert_mgpu.parallel.cluster import find_cluster

    job = find_cluster(f.worker_hosts, f.task_index, f.multi_worker, slurm_port=f.slurm_port)
    visible = devices.discover_visible_gpus() if f.n_gpus else ()
    return devices.plan_devices(f.n_gpus, f.towers_per_gpu, visible, job.workers if job else 1), job


def towers_from_flags(f, plan, cluster, train_batch_size):
    """`Towers` for the plan and cluster from `plan_from_flags`: devices configured, strategy made."""
    from bert_mgpu.parallel.devices import Towers

    return Towers.from_plan(plan, f.gpu_memory_per_tower_mb, cluster, f.collective_timeout_seconds or None,
                            train_batch_size)


def _loop_flags(f):
    """The LoopConfig fields both scripts' flags give, under the flags' names."""
    return dict(learning_rate=f.learning_rate, use_xla=f.use_xla, recompute=f.recompute,
                save_checkpoints_steps=f.save_checkpoints_steps,
                save_total_limit=f.save_total_limit, log_every=f.log_every_steps,
                max_consecutive_skips=f.max_consecutive_skips, overwrite=f.overwrite_output_dir,
                report_to=tuple(f.report_to))


def train_config(f):
    """run_classifier_mgpu.py's flags as a TrainConfig. The per-tower batch is the model's (the towers' from
    --train_batch_size, or what --auto_batch_size found), so it is left to `fit`."""
    from bert_mgpu.train.train_config import TrainConfig

    return TrainConfig(
        epochs=f.num_train_epochs, warmup_proportion=f.warmup_proportion, num_warmup_steps=f.num_warmup_steps,
        gradient_accumulation_steps=f.gradient_accumulation_steps, seed=f.seed,
        evaluation_strategy=f.evaluation_strategy, eval_every_steps=f.eval_every_steps,
        eval_batch_size=f.eval_batch_size, metric_for_best_model=f.metric_for_best_model,
        greater_is_better=f.greater_is_better, load_best_model_at_end=f.load_best_model_at_end,
        early_stopping_patience=f.early_stopping_patience, early_stopping_threshold=f.early_stopping_threshold,
        layerwise_lr_decay=f.layerwise_lr_decay, class_weights=f.class_weights, focal_gamma=f.focal_gamma,
        rdrop_alpha=f.rdrop_alpha, adversarial=f.adversarial, adv_epsilon=f.adv_epsilon,
        pgd_steps=f.pgd_steps, pgd_alpha=f.pgd_alpha,
        length_buckets=f.length_buckets, adam_epsilon=f.adam_eps, lr_schedule=f.lr_schedule, step_count=f.step_count,
        ema_decay=f.ema_decay, ema_for_eval=f.ema_for_eval, lora_rank=f.lora_rank, lora_alpha=f.lora_alpha,
        lora_targets=tuple(f.lora_targets), **_loop_flags(f))


def pretrain_config(f):
    """run_pretraining_mgpu.py's flags as a PretrainConfig (its Budget apart)."""
    from bert_mgpu.train.train_config import PretrainConfig

    return PretrainConfig(train_batch_size=f.train_batch_size, optimizer=f.optimizer, beta_1=f.adam_beta1,
                          beta_2=f.adam_beta2, epsilon=f.adam_eps, weight_decay=f.weight_decay,
                          clipnorm=f.max_grad_norm, **_loop_flags(f))


def prelude(f, actions, required, batch, dry_run_note, accumulation=None):
    """What every training script does before its work, in this order: refuse --use_tpu, plan the devices
    (the cluster resolved once), answer --dry_run (the plan, then `dry_run_note(plan)`), refuse a run with
    nothing to do, export alone when that is all it does, require `required` flags, seed, make the towers,
    and lock --output_dir on the chief.

    actions: the script's --do_* flags besides --do_export. batch(plan): the per-tower training batch;
    accumulation(plan): the batches each tower accumulates a step (default --gradient_accumulation_steps).
    Returns (towers, export targets), or None when the script has nothing more to do (a dry run, an export
    alone).
    """
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.io.output_dir import check_output_dir, lock_output_dir

    if f.use_tpu:
        raise UserError("--use_tpu is not supported; use --n_gpus")
    plan, cluster = plan_from_flags(f)
    per_tower_batch = batch(plan)
    steps = accumulation(plan) if accumulation else getattr(f, "gradient_accumulation_steps", 1)
    if f.dry_run:
        print(plan.describe(per_tower_batch, steps))
        print(dry_run_note(plan))
        return None
    if not any(getattr(f, a) for a in (*actions, "do_export")):
        names = [f"--{a}" for a in (*actions, "do_export")]
        raise UserError(f"at least one of {', '.join(names[:-1])} or {names[-1]} must be true")
    exports = export_targets(f, f.output_dir)
    if not any(getattr(f, a) for a in actions):  # export alone: the model in --init_checkpoint or --output_dir
        source = f.init_checkpoint or f.output_dir
        if not source:
            raise UserError("--do_export alone needs the model: --output_dir or --init_checkpoint")
        run_exports(f, source, exports)
        return None
    for name in required:
        if not getattr(f, name):
            raise UserError(f"--{name} is required")
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(f.seed)
    if f.deterministic:
        tf.config.experimental.enable_op_determinism()
    # Before any data is read: a tfds task builds tf.data, which would start TensorFlow with its defaults.
    towers = towers_from_flags(f, plan, cluster, per_tower_batch)
    logging.getLogger("bert_mgpu").info("%s", plan.describe(per_tower_batch, steps))
    if towers.cluster:
        logging.getLogger("bert_mgpu").info("%s", towers.cluster.describe())
    if towers.is_chief:
        check_output_dir(f.output_dir)
        lock_output_dir(f.output_dir)  # for all this command writes there
    return towers, exports


def rate_fact(history, key="examples_per_second"):
    """The summary's rate: over the records after the first, whose steps traced and compiled the step, with
    the first record's rate beside it; with one record, its rate, saying it includes compiling."""
    records = [r for r in history if key in r]
    if not records:
        return None
    first = records[0]
    if len(records) == 1:
        return f"{first[key]:.4g} (up to step {first['step']}, compiling included)"
    steps = [b["step"] - a["step"] for a, b in zip(records, records[1:])]
    seconds = sum(n / r[key] for n, r in zip(steps, records[1:]) if r[key] > 0)
    steady = sum(steps) / seconds if seconds > 0 else records[-1][key]
    return f"{steady:.4g} (from step {first['step']} on; {first[key]:.4g} up to it, compiling included)"


def summary(f, script, towers, model, facts, started):
    """The block a script ends with (outputs.summary): where it ran, its precision, `facts`, the wall time."""
    import time

    from bert_mgpu.io import outputs

    where = f"{towers.count} on {towers.plan.device_type}" + (
        f", {towers.cluster.workers} workers" if towers.cluster else "")
    from bert_mgpu.train.system_metrics import describe_peaks

    facts = {"towers": where, "precision": model.policy, **facts,
             "system peak": describe_peaks(getattr(model, "history", None) or []),
             "wall time": f"{time.monotonic() - started:.0f} s"}
    return outputs.summary(script, facts, f.output_dir)
