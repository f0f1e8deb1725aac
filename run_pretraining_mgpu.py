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

import dataclasses
import os

from absl import app, flags

from bert_mgpu.cli import define_export_flags, define_reliability_flags, define_tower_flags, masking

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
flags.DEFINE_enum("input_sharding", "auto", ["auto", "files", "examples"],
                  "Several workers: each reads its own files (files; auto when there is a file per worker) "
                  "or its rows of one stream (examples).")
flags.DEFINE_string("vocab_file", None, "vocab.txt (from scratch; default: beside --init_checkpoint).")
flags.DEFINE_bool("do_lower_case", None, "text input: lower-case (default: the checkpoint's, else true).")
flags.DEFINE_float("masked_lm_prob", 0.15, "text input: share of tokens masked.")
flags.DEFINE_bool("nsp", True, "Train the next-sentence head (records input only).")
flags.DEFINE_enum("encoder_ln_mode", None, ["post-ln", "pre-ln"], "From scratch: where LayerNorm goes.")
flags.DEFINE_list("validation_input_file", None, "Held-out data (default: the last --input_file shard).")
# towers and precision
define_tower_flags()
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
flags.DEFINE_alias("log_every", "log_every_steps")  # the name this script had first
flags.DEFINE_integer("seed", 12345, "Random seed (initialization, shuffling, masks, dropout).")
# reliability (shared with the other script)
define_reliability_flags("Micro-batch: the largest per tower that fits and divides --train_batch_size")
define_export_flags()
masking.define_masking_flags(text_input_only=True)


def _data(files, tokenizer, refs=()):
    from bert_mgpu.data.pretraining_input import PretrainingData

    return PretrainingData(FLAGS.input_format, files, tokenizer, max_seq_length=FLAGS.max_seq_length,
                           max_predictions_per_seq=FLAGS.max_predictions_per_seq,
                           masked_lm_prob=FLAGS.masked_lm_prob, seed=FLAGS.seed, sharding=FLAGS.input_sharding,
                           plan=masking.mask_plan(FLAGS), word_segmenter=FLAGS.word_segmenter, ref_files=refs)


def _pretrainer(towers):
    import bert_mgpu
    from bert_mgpu.core import storage
    from bert_mgpu.core.errors import UserError

    resume = storage.exists(os.path.join(FLAGS.output_dir, "checkpoint"))
    init = FLAGS.init_checkpoint or (FLAGS.output_dir if resume or not FLAGS.do_train else None)
    common = dict(towers=towers, precision=FLAGS.precision, nsp=FLAGS.nsp, fused_encoder=FLAGS.fused_encoder)
    if init:
        pre = bert_mgpu.BertPretrainer.from_pretrained(
            init, do_lower_case=FLAGS.do_lower_case, bert_config_file=FLAGS.bert_config_file,
            vocab_file=FLAGS.vocab_file, **common)
        if FLAGS.encoder_ln_mode and FLAGS.encoder_ln_mode != pre.config.encoder_ln_mode:
            raise UserError(f"--encoder_ln_mode={FLAGS.encoder_ln_mode} but {init} is "
                            f"{pre.config.encoder_ln_mode}; the layer-norm placement is part of the checkpoint")
        return pre
    if not (FLAGS.bert_config_file and FLAGS.vocab_file):
        raise UserError("from scratch needs --bert_config_file and --vocab_file (or give --init_checkpoint)")
    config = bert_mgpu.BertConfig.from_json_file(FLAGS.bert_config_file)
    if FLAGS.encoder_ln_mode:
        config = dataclasses.replace(config, encoder_ln_mode=FLAGS.encoder_ln_mode)
    lower = True if FLAGS.do_lower_case is None else FLAGS.do_lower_case
    return bert_mgpu.BertPretrainer.from_config(config, FLAGS.vocab_file, do_lower_case=lower, **common)


def run():
    import time

    from bert_mgpu import cli
    from bert_mgpu.core.errors import Interrupted, UserError
    from bert_mgpu.data.pretraining_input import expand_files
    from bert_mgpu.io import outputs
    from bert_mgpu.parallel import precision
    from bert_mgpu.train.budget import Budget, Validation

    started = time.monotonic()
    cli.check_numbers(
        FLAGS,
        at_least={"max_seq_length": 3, "max_predictions_per_seq": 1, "train_batch_size": 1, "eval_batch_size": 1,
                  "num_train_steps": 1, "num_warmup_steps": 0, "save_checkpoints_steps": 1, "max_eval_steps": 1,
                  "train_micro_batch_size_per_gpu": 1, "validation_steps": 1, "log_every_steps": 1,
                  "max_consecutive_skips": 0, "seed": 0, "save_total_limit": 1},
        positive=("learning_rate", "total_training_time", "early_exit_time_marker", "validation_epochs",
                  "validation_epochs_begin", "validation_epochs_end", "adam_eps", "max_grad_norm"),
        fraction=("masked_lm_prob", "warmup_proportion", "adam_beta1", "adam_beta2", "validation_begin_proportion",
                  "validation_end_proportion"))

    def micro(plan):  # one micro-batch per tower unless told: the global batch split over every worker's towers
        return FLAGS.train_micro_batch_size_per_gpu or max(1, FLAGS.train_batch_size // plan.job_towers)

    if FLAGS.input_format == "records" and masking.settings(FLAGS):
        raise UserError("--do_whole_word_mask, --word_segmenter, --ref_file, --max_ngram_size and --span_masking mask "
                        "raw text (--input_format=text); records were masked when create_pretraining_data.py wrote "
                        "them")
    def accumulation(plan):  # micro-batches a tower runs a step to make the global batch
        return FLAGS.train_batch_size / (plan.job_towers * micro(plan))

    begun = cli.prelude(FLAGS, ("do_train", "do_eval"), ("input_file", "output_dir"), micro, lambda plan: (
        f"precision: {precision.resolve_precision(FLAGS.precision, plan)[0]}; global batch {FLAGS.train_batch_size}"
        f" = {plan.job_towers} towers x {micro(plan)} x {accumulation(plan):g} accumulation steps"), accumulation)
    if begun is None:
        return
    towers, exports = begun
    pre = _pretrainer(towers)
    pre.config.check_seq_length(FLAGS.max_seq_length)
    if exports:  # the formats the model itself rules out, before any training
        cli.check_exports(pre.trained(FLAGS.max_seq_length), exports)
    if FLAGS.auto_batch_size and FLAGS.do_train:
        pre.auto_batch_size(FLAGS.train_batch_size, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq,
                            memory_limit_mb=FLAGS.memory_limit_mb,
                            memory_per_tower_mb=FLAGS.gpu_memory_per_tower_mb, use_xla=FLAGS.use_xla,
                            recompute=FLAGS.recompute)
    files = expand_files(FLAGS.input_file)
    refs, held_out_refs = list(FLAGS.ref_file or ()), ()
    if refs and len(refs) != len(files):
        raise UserError(f"--ref_file: {len(refs)} reference file(s) for {len(files)} input file(s); give one an "
                        "input file, in the order of the input files")
    held_out = FLAGS.validation_input_file
    if (FLAGS.do_validation or FLAGS.do_eval) and not held_out:
        if len(files) < 2:
            raise UserError("validation needs --validation_input_file or at least two --input_file shards "
                            "(the last one is held out)")
        files, held_out = files[:-1], files[-1:]
        refs, held_out_refs = refs[:-1], refs[-1:]
    step = pre.global_step  # evaluating a run directory: its checkpoint's step
    if FLAGS.do_train:
        warmup = FLAGS.warmup_proportion
        if FLAGS.num_warmup_steps is not None and FLAGS.num_train_steps:
            warmup = FLAGS.num_warmup_steps / FLAGS.num_train_steps
        budget = Budget(
            num_train_steps=FLAGS.num_train_steps, total_training_time=FLAGS.total_training_time,
            lr_schedule=FLAGS.lr_schedule, curve=FLAGS.curve, decay_power=FLAGS.decay_power,
            warmup_proportion=warmup, num_warmup_steps=FLAGS.num_warmup_steps if FLAGS.num_train_steps else None,
            early_exit_time_marker=FLAGS.early_exit_time_marker,
            finetune_time_markers=tuple(float(m) for m in FLAGS.finetune_time_markers),
            early_stop_time=FLAGS.early_stop_time, early_stop_eval_loss=FLAGS.early_stop_eval_loss)
        validation = Validation(
            _data(held_out, pre.tokenizer, held_out_refs), epochs=FLAGS.validation_epochs, steps=FLAGS.validation_steps,
            begin_proportion=FLAGS.validation_begin_proportion, epochs_begin=FLAGS.validation_epochs_begin,
            end_proportion=FLAGS.validation_end_proportion, epochs_end=FLAGS.validation_epochs_end,
            batch_size=towers.batch(FLAGS.eval_batch_size), max_steps=FLAGS.max_eval_steps,
        ) if FLAGS.do_validation else None
        settings = {name: getattr(FLAGS, name) for name in (
            "input_file", "input_format", "max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "nsp",
            "seed", "deterministic", "validation_input_file")} | masking.settings(FLAGS)
        pre.fit(_data(files, pre.tokenizer, refs), FLAGS.output_dir, budget, cli.pretrain_config(FLAGS),
                validation=validation, settings=settings)
        step = int(pre.trainer.step.numpy())
        if pre.interrupted:
            raise Interrupted(f"pretraining stopped at step {step}: {pre.stop}", pre.interrupted)
        print(f"pretraining stopped at step {step}: {pre.stop}")
    results = {}
    if FLAGS.do_eval:
        results = pre.evaluate(_data(held_out, pre.tokenizer, held_out_refs),
                               batch_size=towers.batch(FLAGS.eval_batch_size), max_steps=FLAGS.max_eval_steps)
        if towers.is_chief:
            path = pre.write_eval_results(FLAGS.output_dir, results, step)
            cli.report_final(FLAGS, results, step)
            print(f"eval: masked_lm_accuracy {results['masked_lm_accuracy']:.4f} -> {path}")
    if towers.is_chief:
        if exports:
            cli.run_exports(FLAGS, pre.trained(FLAGS.max_seq_length), exports)
        if FLAGS.do_train:
            outputs.draw("learning_curves", FLAGS.output_dir)
        print(cli.summary(FLAGS, "run_pretraining_mgpu.py", towers, pre, {
            "trained": f"{step} steps ({pre.stop})" if FLAGS.do_train else None,
            "sequences/s": cli.rate_fact(pre.history), "tokens/s": cli.rate_fact(pre.history, "tokens_per_second"),
            **dict(sorted(results.items()))},
            started))


def _console():
    from bert_mgpu.cli import main_wrapper

    app.run(main_wrapper(run))


if __name__ == "__main__":
    _console()
