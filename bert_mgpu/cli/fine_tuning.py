"""The flags every fine-tuning script shares (run_classifier_mgpu.py, run_ner_mgpu.py): google-bert's
run_classifier flags, the towers', reliability and export flags, and evaluation while training under
Hugging Face's names. Each script adds only its task's own flags; `cli.train_config(flag_values)` reads these."""

import logging

from absl import flags

from bert_mgpu.cli import define_export_flags, define_reliability_flags, define_tower_flags, train_config
from bert_mgpu.core.errors import Interrupted


def define_fine_tuning_flags(data_help, max_seq_length_help, predict_help, best_help, auto_batch_help):
    """Define the shared flags; the `*_help` strings say what the flag means in that script. A script then
    calls `flags.adopt_module_key_flags(fine_tuning)` so its --help lists them as its own."""
    # google-research/bert's flags
    flags.DEFINE_string("data_dir", None, data_help)
    flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: beside the checkpoint).")
    flags.DEFINE_string("vocab_file", None, "vocab.txt (default: beside the checkpoint).")
    flags.DEFINE_string("output_dir", None, "Checkpoints, logs and results go here; rerun to resume.")
    flags.DEFINE_string("init_checkpoint", None, "Google bert_model.ckpt, Hugging Face or keras-hub directory, "
                        "or a bert_mgpu output directory (default for eval/predict: --output_dir).")
    flags.DEFINE_bool("do_lower_case", None, "Lower-case and strip accents (default: what the checkpoint says, "
                      "else true, as google-bert).")
    flags.DEFINE_integer("max_seq_length", 128, max_seq_length_help)
    flags.DEFINE_bool("do_train", False, "Fine-tune.")
    flags.DEFINE_bool("do_eval", False, "Evaluate on dev; writes eval_results.txt.")
    flags.DEFINE_bool("do_predict", False, predict_help)
    flags.DEFINE_integer("train_batch_size", 32, "Per tower; the global batch is this x towers x "
                         "--gradient_accumulation_steps.")
    flags.DEFINE_integer("gradient_accumulation_steps", 1, "Batches each tower runs per step, their gradients "
                         "averaged: a larger global batch in the same memory.")
    flags.DEFINE_integer("eval_batch_size", 8, "Per tower.")
    flags.DEFINE_integer("predict_batch_size", 8, "Per tower.")
    for kind in ("train", "eval", "predict"):  # the same flags, named for what they are
        flags.DEFINE_alias(f"per_tower_{kind}_batch_size", f"{kind}_batch_size")
    flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate of AdamW.")
    flags.DEFINE_float("num_train_epochs", 3.0, "Epochs; each ceil(examples / global batch) steps "
                       "(--step_count).")
    flags.DEFINE_float("warmup_proportion", 0.1, "Share of the steps with linear warmup.")
    flags.DEFINE_float("layerwise_lr_decay", 1.0, "Layer-wise learning-rate decay (Sun et al. 2019): each encoder "
                       "layer learns at the rate of the one above it times this, the embeddings lowest, the head at "
                       "--learning_rate; e.g. 0.95. 1: one rate for all.")
    flags.DEFINE_string("class_weights", None, "Each label's weight in the training loss, for skewed labels: "
                        "'auto' (examples / (labels x the label's count)) or one number a label in --labels' order, "
                        "comma-separated. Classification, and a tagger without --crf (a weight a tag; 'auto' there "
                        "can weigh a rare tag thousands of times O: docs/tricks.md).")
    flags.DEFINE_float("focal_gamma", 0.0, "Focal loss (Lin et al. 2017): each example's (a tagger: each token's) "
                       "cross-entropy times (1 - p)^gamma, p its label's probability; e.g. 2. 0: cross-entropy.")
    flags.DEFINE_float("rdrop_alpha", 0.0, "R-Drop (Liang et al. 2021): each batch through the model twice, their "
                       "losses averaged plus alpha / 4 x the two passes' symmetric KL divergence, as bert4keras; "
                       "e.g. 4. Classification, and a tagger without --crf. 0: one pass.")
    flags.DEFINE_enum("adversarial", "none", ["none", "fgm", "pgd"], "Adversarial training on the word embeddings: "
                      "each batch again with every example's word embeddings moved uphill along its loss gradient, "
                      "that loss added. fgm (Miyato et al. 2017): one step of --adv_epsilon (about 2.5x a step's "
                      "time); pgd (Madry et al. 2018): --pgd_steps steps of --pgd_alpha within --adv_epsilon.")
    flags.DEFINE_float("adv_epsilon", 0.05, "The largest move, an L2 norm over each example's word embeddings "
                       "(FGM's step). A word embedding's own norm is about 1 (MiniLM, BERT-base).")
    flags.DEFINE_integer("pgd_steps", 3, "PGD's steps (each one more forward and backward pass).")
    flags.DEFINE_float("pgd_alpha", 0.02, "Each PGD step's size.")
    flags.DEFINE_float("ema_decay", 0.0, "Keep an exponential moving average of the weights (as bert4keras' "
                       "ExponentialMovingAverage, Keras' use_ema): each step average = decay x average + (1 - decay) "
                       "x weights; e.g. 0.999 for a long run, 0.99 for a few hundred steps. 0: none.")
    flags.DEFINE_bool("ema_for_eval", True, "With --ema_decay: evaluate and keep in best/ the averaged weights, and "
                      "end the run with them (its last checkpoint, predictions, exports). False: only keep them.")
    flags.DEFINE_integer("lora_rank", 0, "LoRA (Hu et al. 2021, as PEFT's LoraConfig r): freeze the encoder and "
                         "train low-rank adapters of this rank on --lora_targets, with the head; the run ends with "
                         "them added into the encoder (best/ and exports are one ordinary BERT). e.g. 8. 0: none.")
    flags.DEFINE_float("lora_alpha", None, "The adapters' scale is alpha / rank (PEFT's lora_alpha); default: the "
                       "rank (a scale of 1).")
    flags.DEFINE_list("lora_targets", ["query", "value"], "The dense layers of every encoder layer that get "
                      "adapters: query, key, value, attention_output, intermediate, output.")
    flags.DEFINE_integer("num_warmup_steps", None, "Warmup steps as given (wins over --warmup_proportion).")
    flags.DEFINE_enum("lr_schedule", "linear", ["linear", "google-bert"], "After warmup: linear decay from the peak "
                      "to 0 (linear, transformers'), or google-bert's line from step 0, which starts below the peak.")
    flags.DEFINE_enum("step_count", "ceil", ["ceil", "google-bert"], "Steps an epoch: ceil(examples / global batch), "
                      "as if the last partial batch were a step, warmup rounded up (ceil, transformers'), or "
                      "google-bert's int(examples / batch x epochs) steps, warmup rounded down.")
    flags.DEFINE_bool("length_buckets", False, "Batch training rows of similar lengths together: faster steps, "
                      "but each batch leans to the labels of its lengths (3.7 points lost on news titles, "
                      "benchmarks/NOTES.md). Default: batches in shuffled order.")
    flags.DEFINE_float("adam_eps", 1e-8, "AdamW's epsilon (google-bert's: 1e-6).")
    flags.DEFINE_integer("save_checkpoints_steps", 1000, "Checkpoint every this many steps.")
    flags.DEFINE_integer("iterations_per_loop", 1000, "Accepted for google-bert compatibility; unused.")
    flags.DEFINE_bool("use_tpu", False, "Accepted for compatibility; must be false.")
    flags.DEFINE_integer("seed", 12345, "Random seed (initialization, shuffling, dropout).")
    define_tower_flags()
    # evaluation while training (Hugging Face's names)
    flags.DEFINE_enum("evaluation_strategy", "no", ["no", "steps", "epoch"], "Evaluate on dev while training: "
                      "every --eval_every_steps (steps) or every epoch; writes eval_history.tsv and best/.")
    flags.DEFINE_integer("eval_every_steps", None, "Evaluate on dev every this many steps (implies "
                         "--evaluation_strategy=steps).")
    flags.DEFINE_string("metric_for_best_model", None, best_help)
    flags.DEFINE_bool("greater_is_better", None, "Whether a larger --metric_for_best_model is better (default: "
                      "true but for a loss).")
    flags.DEFINE_bool("load_best_model_at_end", False, "Evaluate and predict with best/ rather than the last step.")
    flags.DEFINE_integer("early_stopping_patience", None, "Stop after this many evaluations without improvement.")
    flags.DEFINE_float("early_stopping_threshold", 0.0, "An improvement must exceed this to count.")
    flags.DEFINE_alias("eval_strategy", "evaluation_strategy")  # Hugging Face's newer names for the two
    flags.DEFINE_alias("eval_steps", "eval_every_steps")
    define_reliability_flags(auto_batch_help)
    define_export_flags()
    flags.DEFINE_enum("invalid_utf8", "error", ["error", "replace"], "Invalid UTF-8 in the data: stop naming the "
                      "line, or replace it by U+FFFD and count the lines.")


# The numeric flags `define_fine_tuning_flags` makes and their smallest values (cli.check_numbers).
AT_LEAST = {"max_seq_length": 3, "train_batch_size": 1, "eval_batch_size": 1, "predict_batch_size": 1,
            "gradient_accumulation_steps": 1, "save_checkpoints_steps": 1, "log_every_steps": 1,
            "num_warmup_steps": 0, "eval_every_steps": 1, "early_stopping_patience": 1,
            "max_consecutive_skips": 0, "seed": 0, "save_total_limit": 1}
POSITIVE = ("num_train_epochs", "learning_rate")


def train(f, model, train_rows, dev, settings=()):
    """--do_train for a `FineTuned` head: the automatic batch size if asked, then `fit` with the flags' config
    (`settings`: more flags a resumed run must share). Interrupted when a signal stopped it."""
    if f.auto_batch_size:
        model.auto_batch_size(memory_limit_mb=f.memory_limit_mb, output_dir=f.output_dir,
                              memory_per_tower_mb=f.gpu_memory_per_tower_mb, use_xla=f.use_xla,
                              recompute=f.recompute)
    names = (*settings, "data_dir", "init_checkpoint", "do_lower_case", "auto_batch_size", "deterministic")
    model.fit(train_rows, f.output_dir, train_config(f), dev=dev,
              settings={name: getattr(f, name) for name in names})
    if model.interrupted:
        raise Interrupted(f"interrupted by {model.interrupted} at step {model.global_step}; checkpoint saved in "
                          f"{f.output_dir}. Rerun the same command to resume", model.interrupted)


def begin(f, script, kind, required=("data_dir", "output_dir")):
    """What a head's script does first, after checking its own flags: each --export_format asked checked
    against the head's (`io/heads.py`; before any training), then `cli.prelude` -> (towers, export targets), or
    None when there is nothing more to do (a dry run, an export alone)."""
    from bert_mgpu.cli import prelude
    from bert_mgpu.core.errors import UserError
    from bert_mgpu.io.heads import head_for
    from bert_mgpu.parallel import precision

    head = head_for(kind)
    for fmt in f.export_format if f.do_export else ():
        if fmt not in head.formats:
            raise UserError(f"--export_format={fmt}: {script} exports {', '.join(head.formats)}{head.why_not}")
    return prelude(f, ("do_train", "do_eval", "do_predict"), required, lambda plan: f.train_batch_size,
                   lambda plan: "precision: %s (%s)" % precision.resolve_precision(f.precision, plan))


def watching(f):
    """Whether the training evaluates on dev as it goes (--evaluation_strategy, --eval_every_steps)."""
    return bool(f.do_train and (f.evaluation_strategy != "no" or f.eval_every_steps))


def wanted(f):
    """The splits the actions read, in order: train to train, dev to evaluate or to watch the training, test
    to predict."""
    return tuple(split for split, asked in (("train", f.do_train), ("dev", f.do_eval or watching(f)),
                                            ("test", f.do_predict)) if asked)


def tag_map(f):
    """--tag_map (the NER scripts' flag: segmented corpora's parts of speech that are entities) -> {pos: TYPE}."""
    from bert_mgpu.core.errors import UserError

    mapping = {}
    for item in f.tag_map or ():
        pos, equals, kind = item.partition("=")
        if not (equals and pos and kind):
            raise UserError(f"--tag_map: {item!r} is not pos=TYPE (as nr=PER)")
        mapping[pos.strip()] = kind.strip()
    return mapping


def evaluate_entities(f, model, dev, chief):
    """--do_eval of an entity head (a tagger, a GlobalPointer): `evaluate`, its entity scores printed -> results."""
    results, path = evaluate(f, model, dev, chief)
    if chief:
        print(f"eval: entity f1 {results['eval_f1']:.4f} (precision {results['eval_precision']:.4f}, recall "
              f"{results['eval_recall']:.4f}) on {len(dev)} sentences -> {path}")
    return results


def write_entity_predictions(f, written, sentences):
    """--do_predict's files of an entity head (a tagger, a GlobalPointer) written to --output_dir and named;
    a test file with its entities also gets its scores printed (from test_results.txt)."""
    from bert_mgpu.core import storage

    paths = storage.write_set(f.output_dir, written)
    print(f"predict: {sentences} sentences -> {', '.join(paths)}")
    if "test_results.txt" in written:
        scores = {k: float(v) for k, v in (line.split(" = ") for line in written["test_results.txt"].splitlines())}
        print(f"test: entity f1 {scores['test_f1']:.4f} (precision {scores['test_precision']:.4f}, recall "
              f"{scores['test_recall']:.4f}) on {sentences} sentences")


def evaluate(f, model, dev, chief):
    """--do_eval: the results logged and, on the chief, written to eval_results.txt -> (results, its path)."""
    from bert_mgpu.io import outputs

    results = model.evaluate(dev, batch_size=f.eval_batch_size)
    for key in sorted(results):
        logging.info("  %s = %s", key, results[key])
    path = outputs.write_eval_results(f.output_dir, results, model.report) if chief else None
    if chief:
        from bert_mgpu.cli import report_final

        report_final(f, results, results.get("global_step", model.global_step))
    return results, path


def summary(f, script, towers, model, facts, results, started, rate="examples/s"):
    """The closing block of a fine-tuning script: `facts` (the task's own) first, then the steps trained and
    why it stopped, the best model's step, the steady rate (cli.rate_fact) and the dev results."""
    from bert_mgpu.cli import rate_fact
    from bert_mgpu.cli import summary as closing

    return closing(f, script, towers, model, {
        **facts,
        "trained": f"{model.trained_steps} steps ({model.stop})" if f.do_train and model.stop else None,
        "best model": f"step {model.best_step}" if model.best_step is not None else None,
        "trained parameters": _trained_parameters(model),
        rate: rate_fact(model.history),
        **{k: v for k, v in sorted(results.items()) if k.startswith("eval_")}}, started)


def _trained_parameters(model):
    """'N of M (p%), LoRA rank r' for a run that trained adapters, else None."""
    counts = getattr(model, "trained_parameters", None)
    if not counts:
        return None
    trained, total = counts
    return f"{trained:,} of {total:,} ({100 * trained / total:.2f}%): LoRA adapters and the head"
