"""google-research/bert's run_pretraining.py on every GPU, with the academic-budget recipe on top.

    # continue pretraining a released BERT on your domain text (TFRecords from create_pretraining_data.py)
    python run_pretraining_mgpu.py --input_file=data/pretrain.tfrecord-* --init_checkpoint=uncased_L-12_H-768_A-12 \
        --output_dir=out --do_train=true --do_eval=true --train_batch_size=256 \
        --train_micro_batch_size_per_gpu=32 --num_train_steps=10000 --n_gpus=8

    # from scratch under a 24-hour budget, raw text with dynamic masking, time-based learning rate
    python run_pretraining_mgpu.py --input_format=text --input_file=corpus/*.txt --nsp=false \
        --bert_config_file=bert_config.json --vocab_file=vocab.txt --encoder_ln_mode=pre-ln --optimizer=lamb \
        --total_training_time=24 --lr_schedule=time --finetune_time_markers=0.5,1.0 --do_validation=true ...

A thin wrapper over `bert_mgpu.BertPretrainer`; rerun the same command to resume.
"""

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from bert_mgpu.cli import define_reliability_flags  # noqa: E402

FLAGS = flags.FLAGS
# google-research/bert's flags
flags.DEFINE_string("bert_config_file", None, "Model shape (from scratch; default: beside --init_checkpoint).")
flags.DEFINE_list("input_file", None, "Training input, comma-separated globs (TFRecords or text).")
flags.DEFINE_string("output_dir", None, "Checkpoints, logs, eval_results.txt and fine-tune checkpoints.")
flags.DEFINE_string("init_checkpoint", None, "Continue from this checkpoint (any format the classifier reads).")
flags.DEFINE_integer("max_seq_length", 128, "Sequence length (must match the TFRecords).")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Masked-LM predictions per sequence (must match).")
flags.DEFINE_bool("do_train", False, "Pretrain.")
flags.DEFINE_bool("do_eval", False, "Evaluate at the end; writes eval_results.txt.")
flags.DEFINE_integer("train_batch_size", 32, "Global batch (towers x micro-batch x accumulation steps).")
flags.DEFINE_integer("eval_batch_size", 8, "Per tower.")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_integer("num_train_steps", None, "Optimizer steps (global batches).")
flags.DEFINE_integer("num_warmup_steps", None, "Warmup steps (else --warmup_proportion).")
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Training checkpoint every this many steps.")
flags.DEFINE_integer("max_eval_steps", 100, "Batches per evaluation and validation.")
flags.DEFINE_integer("iterations_per_loop", 1000, "Accepted for google-bert compatibility; unused.")
flags.DEFINE_bool("use_tpu", False, "Accepted for compatibility; must be false.")
# input and model
flags.DEFINE_enum("input_format", "records", ["records", "text"], "records: create_pretraining_data "
                  "TFRecords (MLM + NSP); text: raw text, packed and dynamically masked (MLM only).")
flags.DEFINE_string("vocab_file", None, "vocab.txt (from scratch; default: beside --init_checkpoint).")
flags.DEFINE_bool("do_lower_case", None, "text input: lower-case (default: the checkpoint's, else true).")
flags.DEFINE_float("masked_lm_prob", 0.15, "text input: share of tokens masked.")
flags.DEFINE_bool("nsp", True, "Train the next-sentence head (records input only).")
flags.DEFINE_enum("encoder_ln_mode", None, ["post-ln", "pre-ln"], "From scratch: where LayerNorm goes.")
flags.DEFINE_list("validation_input_file", None, "Held-out data (default: the last --input_file shard).")
# towers and precision
flags.DEFINE_integer("n_gpus", -1, "GPUs to use, in CUDA_VISIBLE_DEVICES order; -1 = every visible GPU (the "
                     "CPU when none is visible); 0 = the CPU, GPUs hidden from TensorFlow.")
flags.DEFINE_integer("towers_per_gpu", 1, "Towers per GPU, or logical CPU towers with --n_gpus=0.")
flags.DEFINE_integer("gpu_memory_per_tower_mb", None, "Memory of each tower when --towers_per_gpu > 1.")
flags.DEFINE_bool("multi_worker", False, "Several machines: MultiWorkerMirroredStrategy from TF_CONFIG.")
flags.DEFINE_enum("precision", "auto", ["auto", "mixed_float16", "mixed_bfloat16", "float32"], "As the classifier.")
flags.DEFINE_bool("use_xla", False, "XLA-compile each tower's forward and backward pass.")
flags.DEFINE_bool("fused_encoder", True, "Run the encoder as bert_mgpu's fused layer; false: keras-hub's "
                  "BertBackbone as it is (the reference, slower; same variables and checkpoints).")
flags.DEFINE_bool("dry_run", False, "Print the device plan, precision and accumulation, then exit.")
flags.DEFINE_integer("train_micro_batch_size_per_gpu", None, "Per-tower micro-batch (default: global / towers).")
# optimizer and schedule
flags.DEFINE_enum("optimizer", "adamw", ["adamw", "lamb"], "AdamW (google-bert) or LAMB.")
flags.DEFINE_float("adam_beta1", 0.9, "beta_1.")
flags.DEFINE_float("adam_beta2", 0.999, "beta_2 (academic-budget-bert uses 0.98).")
flags.DEFINE_float("adam_eps", 1e-6, "epsilon.")
flags.DEFINE_float("weight_decay", 0.01, "Decoupled weight decay (none on LayerNorm and biases).")
flags.DEFINE_float("max_grad_norm", 1.0, "Clip the global gradient norm to this.")
flags.DEFINE_enum("lr_schedule", "step", ["step", "time"], "Decay over steps, or over the time budget.")
flags.DEFINE_enum("curve", "linear", ["linear", "exp"], "Shape of the time-based decay.")
flags.DEFINE_float("decay_power", 1.0, "Step schedule: polynomial decay power (1 = linear).")
flags.DEFINE_float("warmup_proportion", 0.01, "Share of the steps (or of the time budget) spent warming up.")
flags.DEFINE_float("total_training_time", None, "Time budget in hours.")
flags.DEFINE_float("early_exit_time_marker", None, "Stop after this many hours even if the budget is longer.")
flags.DEFINE_list("finetune_time_markers", [], "Shares of the budget at which to write fine-tune checkpoints.")
# validation and early stopping
flags.DEFINE_bool("do_validation", False, "Score the held-out data during training.")
flags.DEFINE_float("validation_epochs", 1.0, "Validate every this many epochs ...")
flags.DEFINE_integer("validation_steps", None, "... or every this many steps.")
flags.DEFINE_float("validation_begin_proportion", 0.0, "Share of the budget at the start validated densely.")
flags.DEFINE_float("validation_end_proportion", 0.0, "Share of the budget at the end validated densely.")
flags.DEFINE_float("validation_epochs_begin", None, "Validation interval (epochs) at the start.")
flags.DEFINE_float("validation_epochs_end", None, "Validation interval (epochs) at the end.")
flags.DEFINE_float("early_stop_time", None, "Minutes after which a validation loss above ...")
flags.DEFINE_float("early_stop_eval_loss", None, "... this stops the run.")
flags.DEFINE_integer("log_every", 10, "Log every this many steps.")
flags.DEFINE_integer("seed", 12345, "Random seed (initialization, shuffling, masks, dropout).")
# reliability (shared with the other script)
define_reliability_flags("Micro-batch: the largest per tower that fits and divides --train_batch_size")


def _data(files, tokenizer):
    from bert_mgpu.pretraining_input import PretrainingData

    return PretrainingData(FLAGS.input_format, files, tokenizer, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                           FLAGS.masked_lm_prob, FLAGS.seed)


def run():
    import bert_mgpu
    from bert_mgpu import devices, precision
    from bert_mgpu.pretraining import Budget, Validation
    from bert_mgpu.errors import UserError
    from bert_mgpu.pretraining_input import expand_files
    from bert_mgpu.run_dir import check_output_dir

    if FLAGS.use_tpu:
        raise UserError("--use_tpu is not supported; use --n_gpus")
    micro = FLAGS.train_micro_batch_size_per_gpu
    if FLAGS.dry_run:
        plan = devices.plan_devices(FLAGS.n_gpus, FLAGS.towers_per_gpu, micro or 1,
                                    devices.discover_visible_gpus() if FLAGS.n_gpus else ())
        micro = micro or max(1, FLAGS.train_batch_size // plan.towers)
        plan = devices.plan_devices(FLAGS.n_gpus, FLAGS.towers_per_gpu, micro, plan.visible_names)
        print(plan.describe())
        print(f"precision: {precision.resolve_precision(FLAGS.precision, plan)[0]}; global batch "
              f"{FLAGS.train_batch_size} = {plan.towers} towers x {micro} x "
              f"{FLAGS.train_batch_size / (plan.towers * micro):g} accumulation steps")
        return
    if not (FLAGS.do_train or FLAGS.do_eval):
        raise UserError("at least one of --do_train or --do_eval must be true")
    for name in ("input_file", "output_dir"):
        if not getattr(FLAGS, name):
            raise UserError(f"--{name} is required")
    check_output_dir(FLAGS.output_dir)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(FLAGS.seed)
    if FLAGS.deterministic:
        tf.config.experimental.enable_op_determinism()
    if micro is None:  # one micro-batch per tower: the global batch split evenly over this machine's towers
        plan = devices.plan_devices(FLAGS.n_gpus, FLAGS.towers_per_gpu, 1,
                                    devices.discover_visible_gpus() if FLAGS.n_gpus else ())
        micro = max(1, FLAGS.train_batch_size // plan.towers)
    towers = bert_mgpu.Towers(FLAGS.n_gpus, FLAGS.towers_per_gpu, micro, FLAGS.gpu_memory_per_tower_mb,
                              FLAGS.multi_worker)
    logging.info("%s", towers.plan.describe())
    resume = os.path.exists(os.path.join(FLAGS.output_dir, "checkpoint"))
    init = FLAGS.init_checkpoint or (FLAGS.output_dir if resume or not FLAGS.do_train else None)
    if init:
        pre = bert_mgpu.BertPretrainer.from_pretrained(init, towers, FLAGS.precision, FLAGS.nsp, FLAGS.do_lower_case,
                                                       FLAGS.bert_config_file, FLAGS.vocab_file, FLAGS.fused_encoder)
        if FLAGS.encoder_ln_mode and FLAGS.encoder_ln_mode != pre.config.encoder_ln_mode:
            raise UserError(f"--encoder_ln_mode={FLAGS.encoder_ln_mode} but {init} is "
                            f"{pre.config.encoder_ln_mode}; the layer-norm placement is part of the checkpoint")
    else:
        if not (FLAGS.bert_config_file and FLAGS.vocab_file):
            raise UserError("from scratch needs --bert_config_file and --vocab_file (or give --init_checkpoint)")
        config = bert_mgpu.BertConfig.from_json_file(FLAGS.bert_config_file)
        if FLAGS.encoder_ln_mode:
            import dataclasses

            config = dataclasses.replace(config, encoder_ln_mode=FLAGS.encoder_ln_mode)
        pre = bert_mgpu.BertPretrainer.from_config(config, FLAGS.vocab_file, True if FLAGS.do_lower_case is None
                                                   else FLAGS.do_lower_case, towers, FLAGS.precision, FLAGS.nsp,
                                                   FLAGS.fused_encoder)
    pre.config.check_seq_length(FLAGS.max_seq_length)
    if FLAGS.auto_batch_size and FLAGS.do_train:
        pre.auto_batch_size(FLAGS.train_batch_size, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                            memory_limit_mb=FLAGS.memory_limit_mb,
                            memory_per_tower_mb=FLAGS.gpu_memory_per_tower_mb, use_xla=FLAGS.use_xla)
    files = expand_files(FLAGS.input_file)
    held_out = FLAGS.validation_input_file
    if (FLAGS.do_validation or FLAGS.do_eval) and not held_out:
        if len(files) < 2:
            raise UserError("validation needs --validation_input_file or at least two --input_file shards "
                            "(the last one is held out)")
        files, held_out = files[:-1], files[-1:]
    step = 0
    if FLAGS.do_train:
        warmup = FLAGS.warmup_proportion
        if FLAGS.num_warmup_steps is not None and FLAGS.num_train_steps:
            warmup = FLAGS.num_warmup_steps / FLAGS.num_train_steps
        budget = Budget(FLAGS.num_train_steps, FLAGS.total_training_time, FLAGS.lr_schedule, FLAGS.curve,
                        FLAGS.decay_power, warmup, FLAGS.early_exit_time_marker,
                        tuple(float(m) for m in FLAGS.finetune_time_markers), FLAGS.early_stop_time,
                        FLAGS.early_stop_eval_loss)
        validation = Validation(
            _data(held_out, pre.tokenizer), FLAGS.validation_epochs, FLAGS.validation_steps,
            FLAGS.validation_begin_proportion, FLAGS.validation_epochs_begin, FLAGS.validation_end_proportion,
            FLAGS.validation_epochs_end, towers.batch(FLAGS.eval_batch_size), FLAGS.max_eval_steps,
        ) if FLAGS.do_validation else None
        pre.fit(_data(files, pre.tokenizer), FLAGS.output_dir, budget, FLAGS.train_batch_size, FLAGS.learning_rate,
                FLAGS.optimizer, FLAGS.adam_beta1, FLAGS.adam_beta2, FLAGS.adam_eps, FLAGS.weight_decay,
                FLAGS.max_grad_norm, validation, FLAGS.save_checkpoints_steps, FLAGS.log_every, FLAGS.use_xla,
                max_consecutive_skips=FLAGS.max_consecutive_skips, overwrite=FLAGS.overwrite_output_dir,
                settings={name: getattr(FLAGS, name) for name in (
                    "input_file", "input_format", "max_seq_length", "max_predictions_per_seq", "masked_lm_prob",
                    "nsp", "seed", "deterministic", "validation_input_file")})
        step = int(pre.trainer.step.numpy())
        print(f"pretraining stopped at step {step}: {pre.stop}")
        if pre.stop.startswith("interrupted"):
            return
    if FLAGS.do_eval:
        results = pre.evaluate(_data(held_out, pre.tokenizer), towers.batch(FLAGS.eval_batch_size),
                               FLAGS.max_eval_steps)
        path = pre.write_eval_results(FLAGS.output_dir, results, step)
        print(f"eval: masked_lm_accuracy {results['masked_lm_accuracy']:.4f} -> {path}")


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
