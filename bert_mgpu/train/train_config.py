"""What a training run is told, built once and saved with the run: `TrainConfig` for fine-tuning,
`PretrainConfig` for pretraining (whose stop and schedule are its `Budget`).

The scripts build one from their flags (`cli.train_config`); notebooks pass one, or `fit`'s keywords of
the same names, which make one. The run directory's `bert_mgpu.json` keeps it under "train_config". The
resume check compares `settings()`, whose keys are those runs have always recorded, so run directories
written before this class existed still resume.

Example:
    config = TrainConfig(epochs=2, learning_rate=3e-5, train_batch_size=16, eval_every_steps=100)
    clf.fit(train, "out", config=config, dev=dev)
    clf.fit(train, "out", epochs=2, learning_rate=3e-5)        # the same, as keywords
"""

import dataclasses
import math

from bert_mgpu.core.errors import UserError
from bert_mgpu.train import reporting  # without TensorFlow, as this module


@dataclasses.dataclass
class LoopConfig:
    """What every training run has: the peak learning rate and how the loop saves, logs and guards.

    Args:
        learning_rate: peak learning rate.
        use_xla: XLA-compile each tower's step.
        recompute: recompute each encoder layer in the backward pass instead of keeping its activations
            (less memory, about one more forward pass a step; the same gradients).
        save_checkpoints_steps: a checkpoint every this many steps (and at the end).
        save_total_limit: checkpoints kept (the newest); the best model's directory apart.
        log_every: a logged record every this many steps.
        max_consecutive_skips: steps with a non-finite loss skipped in a row before the run stops (0: no limit).
        overwrite: start over in an output_dir holding a run with other settings.
        verbose: log the records (and draw Keras' progress bar on a terminal).
        report_to: loggers besides TensorBoard's scalars: "tensorboard" (its HParams dashboard), "wandb",
            "mlflow" (reporting.py); offline by default.
    """

    learning_rate: float = 5e-5
    use_xla: bool = False
    recompute: bool = False
    save_checkpoints_steps: int = 1000
    save_total_limit: int = 2
    log_every: int = 50
    max_consecutive_skips: int = 10
    overwrite: bool = False
    verbose: bool = True
    report_to: tuple = ()

    @classmethod
    def make(cls, config=None, **keywords):
        """`config` (default: the defaults) with `keywords` in place of its fields: `fit`'s keyword form.
        A keyword that is no field is a TypeError, as for any call."""
        unknown = sorted(set(keywords) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{cls.__name__} has no {', '.join(unknown)}")
        return dataclasses.replace(config or cls(), **keywords)

    def check(self):
        """UserError naming the flag of the first setting no run can use."""
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise UserError(f"--learning_rate={self.learning_rate}: must be a finite number above 0")
        if int(self.max_consecutive_skips) < 0:
            raise UserError(f"--max_consecutive_skips={self.max_consecutive_skips}: must be 0 (no limit) or more")
        for flag, value in (("save_checkpoints_steps", self.save_checkpoints_steps),
                            ("save_total_limit", self.save_total_limit), ("log_every_steps", self.log_every)):
            if int(value) < 1:
                raise UserError(f"--{flag}={value}: must be 1 or more")
        self.report_to = reporting.parse_report_to(self.report_to)

    def as_dict(self):
        """The config as bert_mgpu.json keeps it."""
        return dataclasses.asdict(self)


def check_class_weights(value):
    """--class_weights as "auto", None or a tuple of positive floats (from a comma-separated string or a
    sequence), or UserError."""
    if value is None or value == "auto":
        return value
    try:
        weights = tuple(float(w) for w in (value.split(",") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise UserError(f"--class_weights={value}: 'auto' or one number a label, comma-separated") from None
    if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
        raise UserError(f"--class_weights={value}: each weight must be a finite number above 0")
    return weights


def _recorded(weights):
    """Class weights as a run records them, however given ("1,2" or (1, 2)): "auto" or a list of floats."""
    return weights if weights == "auto" else list(weights)


LR_SCHEDULES = ("linear", "google-bert")
STEP_COUNTS = ("ceil", "google-bert")
# bert_mgpu's fine-tuning defaults before benchmarks/NOTES.md items 83 and 95, google-bert's.
GOOGLE_BERT_RECIPE = {"length_buckets": True, "adam_epsilon": 1e-6, "lr_schedule": "google-bert",
                      "step_count": "google-bert"}


def _ceil(x):
    """ceil of a product of floats without its rounding error: 10 x 0.3 is 3 steps, not 4."""
    return math.ceil(round(x, 9))


def check_layerwise_lr_decay(value):
    """--layerwise_lr_decay as a float, or UserError: a rate above the layer's own would grow downwards."""
    if not 0 < value <= 1:
        raise UserError(f"--layerwise_lr_decay={value}: must be above 0 and at most 1")
    return float(value)


def check_adversarial(epsilon, steps=1, alpha=None):
    """Adversarial training's numbers (model/adversarial.py): (epsilon, steps, alpha) checked, or UserError."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UserError(f"--adv_epsilon={epsilon}: must be a finite number above 0")
    if int(steps) != steps or steps < 1:
        raise UserError(f"--pgd_steps={steps}: must be a whole number, 1 or more")
    alpha = epsilon if alpha is None else alpha
    if not (math.isfinite(alpha) and alpha > 0):
        raise UserError(f"--pgd_alpha={alpha}: must be a finite number above 0")
    return float(epsilon), int(steps), float(alpha)


def check_ema_decay(value):
    """--ema_decay as a float, or UserError: 0 keeps no average, 1 would keep the first step's weights."""
    if not 0 <= value < 1:
        raise UserError(f"--ema_decay={value}: must be 0 (no average) or more, and below 1")
    return float(value)


@dataclasses.dataclass
class TrainConfig(LoopConfig):
    """A fine-tuning run (google-bert's run_classifier flags, Hugging Face's for evaluation while training).

    Args:
        epochs: passes over the training data (how they make steps: step_count).
        warmup_proportion: share of the steps with linear warmup.
        num_warmup_steps: warmup steps as given (wins over warmup_proportion).
        train_batch_size: per tower; None: the model's (its towers', or what `auto_batch_size` found).
        gradient_accumulation_steps: batches each tower runs per step, their gradients averaged.
        seed: shuffling and dropout masks (a resumed run keeps its own).
        evaluation_strategy: "no", "steps" (every eval_every_steps, which alone implies it) or "epoch".
        eval_every_steps, eval_batch_size: evaluation while training (per-tower batch).
        metric_for_best_model, greater_is_better: what picks the model kept in best/ (default the task's).
        load_best_model_at_end: leave the best model in the classifier.
        early_stopping_patience, early_stopping_threshold: evaluations without an improvement above the
            threshold before the run stops.
        layerwise_lr_decay: each encoder layer learns at the rate of the one above it times this, the
            embeddings lowest, the head at learning_rate (optimization.layerwise_rates); 1: one rate.
        class_weights: each label's weight in the training loss, for skewed labels: "auto" (examples /
            (labels x the label's count), scikit-learn's "balanced"), one number a label, or None (all 1).
        focal_gamma: the focal loss's gamma (Lin et al. 2017): each example's (or token's) cross-entropy times
            (1 - p)^gamma, p its label's probability; 0: plain cross-entropy.
        rdrop_alpha: R-Drop (Liang et al. 2021; model/rdrop.py): each batch through the model twice, the
            two passes' losses averaged plus alpha / 4 x their symmetric KL divergence; 0: one pass.
        adversarial: "fgm" or "pgd": adversarial training on the word embeddings (model/adversarial.py), each
            batch a second time with every example's embeddings moved uphill along its loss gradient (FGM: one
            step of `adv_epsilon`; PGD: `pgd_steps` steps of `pgd_alpha` kept within `adv_epsilon`), both
            losses summed; None: off.
        adv_epsilon: the largest move (L2 norm over an example's tokens); FGM's step.
        pgd_steps, pgd_alpha: PGD's steps and each step's size.
        length_buckets: batch rows of similar lengths together (faster; less accurate where length goes with
            the label); False: batches in shuffled order, as transformers' Trainer.
        adam_epsilon: AdamW's epsilon (transformers' 1e-8; google-bert's is 1e-6).
        lr_schedule: "linear": after warmup, linear decay from the peak to 0 (transformers'); "google-bert":
            google-bert's line from step 0, which starts at peak x (1 - warmup share) after warmup.
        step_count: "ceil": an epoch is ceil(examples / global batch) steps, as if its last partial batch
            were a step (transformers' Trainer, Keras' fit), and warmup ceil(warmup share x steps) (batches
            stay full: the last one of a pass goes on into the next); "google-bert": int(examples / global
            batch x epochs) steps and int(share x steps) of warmup, google-bert's run_classifier.
        ema_decay: keep an exponential moving average of the weights, each step average = decay x average
            + (1 - decay) x weights (Keras' `use_ema`, bert4keras' ExponentialMovingAverage); 0: none.
        ema_for_eval: with ema_decay, evaluate and keep in best/ the averaged weights, and end the run with
            them (its last checkpoint, predictions and exports); False: the average is only kept.
        lora_rank, lora_alpha, lora_targets: LoRA (Hu et al. 2021, as PEFT; model/lora.py): the encoder frozen,
            adapters of this rank on these of its dense layers (query, key, value, attention_output,
            intermediate, output) scaled by alpha / rank (alpha: default the rank), trained with the head;
            the run ends with them added into the encoder. 0: no adapters.

    The last four defaults are transformers', not google-bert's: with google-bert's, the same MiniLM
    fine-tuned on news titles scored 6 points below transformers (benchmarks/NOTES.md items 82 and 83), and
    google-bert's step count alone cost 1.1 points on debate statements (item 95).
    """

    epochs: float = 3.0
    warmup_proportion: float = 0.1
    num_warmup_steps: int | None = None
    train_batch_size: int | None = None
    gradient_accumulation_steps: int = 1
    seed: int = 12345
    evaluation_strategy: str = "no"
    eval_every_steps: int | None = None
    eval_batch_size: int = 8
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    load_best_model_at_end: bool = False
    early_stopping_patience: int | None = None
    early_stopping_threshold: float = 0.0
    layerwise_lr_decay: float = 1.0
    class_weights: str | tuple | None = None
    focal_gamma: float = 0.0
    rdrop_alpha: float = 0.0
    adversarial: str | None = None
    adv_epsilon: float = 0.05
    pgd_steps: int = 3
    pgd_alpha: float = 0.02
    length_buckets: bool = False
    adam_epsilon: float = 1e-8
    lr_schedule: str = "linear"
    step_count: str = "ceil"
    ema_decay: float = 0.0
    ema_for_eval: bool = True
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_targets: tuple | str = ("query", "value")

    @property
    def lora(self):
        """The LoraSpec of lora_rank/alpha/targets, or None (UserError for bad values)."""
        if not self.lora_rank:
            return None
        from bert_mgpu.model import lora  # Keras layers: this module stays without TensorFlow until LoRA is asked

        return lora.check_lora(self.lora_rank, self.lora_alpha, self.lora_targets)

    @property
    def adversarial_steps(self):
        """(epsilon, steps, alpha) of `adversarial.with_adversarial`, or None without adversarial training."""
        if self.adversarial == "fgm":
            return self.adv_epsilon, 1, self.adv_epsilon
        if self.adversarial == "pgd":
            return self.adv_epsilon, self.pgd_steps, self.pgd_alpha
        return None

    def check(self):
        super().check()
        check_ema_decay(self.ema_decay)
        self.lora  # noqa: B018 (checked)
        if self.lr_schedule not in LR_SCHEDULES:
            raise UserError(f"--lr_schedule={self.lr_schedule}: expected one of {', '.join(LR_SCHEDULES)}")
        if self.step_count not in STEP_COUNTS:
            raise UserError(f"--step_count={self.step_count}: expected one of {', '.join(STEP_COUNTS)}")
        if not (math.isfinite(self.adam_epsilon) and self.adam_epsilon > 0):
            raise UserError(f"--adam_eps={self.adam_epsilon}: must be a finite number above 0")
        check_layerwise_lr_decay(self.layerwise_lr_decay)
        check_class_weights(self.class_weights)
        if not (math.isfinite(self.focal_gamma) and self.focal_gamma >= 0):
            raise UserError(f"--focal_gamma={self.focal_gamma}: must be a finite number, 0 or more")
        if not (math.isfinite(self.rdrop_alpha) and self.rdrop_alpha >= 0):
            raise UserError(f"--rdrop_alpha={self.rdrop_alpha}: must be a finite number, 0 or more")
        if self.adversarial not in (None, "none", "fgm", "pgd"):
            raise UserError(f"--adversarial={self.adversarial}: expected fgm, pgd or none")
        if self.adversarial_steps:
            check_adversarial(*self.adversarial_steps)
        if int(self.gradient_accumulation_steps) < 1:
            raise UserError(f"--gradient_accumulation_steps={self.gradient_accumulation_steps}: expected 1 or more")
        if not (math.isfinite(self.epochs) and self.epochs > 0):
            raise UserError(f"--num_train_epochs={self.epochs}: must be a finite number above 0")
        if self.train_batch_size is not None and int(self.train_batch_size) < 1:
            raise UserError(f"--train_batch_size={self.train_batch_size}: must be 1 or more")
        if self.num_warmup_steps is not None and int(self.num_warmup_steps) < 0:
            raise UserError(f"--num_warmup_steps={self.num_warmup_steps}: must be 0 or more")
        if (self.load_best_model_at_end or self.early_stopping_patience) and not (
                self.evaluation_strategy != "no" or self.eval_every_steps):
            raise UserError("--load_best_model_at_end and --early_stopping_patience need evaluation during "
                            "training: --evaluation_strategy=epoch|steps or --eval_every_steps")

    def resuming(self, recorded):
        """The config to resume a run whose bert_mgpu.json recorded `recorded` (its settings, or None for no
        run) with: one written before length_buckets, adam_eps and lr_schedule were settings was trained with
        google-bert's recipe, one written before step_count with google-bert's count, and each keeps it to its
        end (tests/test_golden.py resumes such a run)."""
        if recorded is None:
            return self
        if "length_buckets" not in recorded:
            return dataclasses.replace(self, **GOOGLE_BERT_RECIPE)
        if "step_count" not in recorded:
            return dataclasses.replace(self, step_count="google-bert")
        return self

    @property
    def evaluates(self):
        """Whether the run evaluates on dev while it trains."""
        return self.evaluation_strategy != "no" or bool(self.eval_every_steps)

    def steps(self, examples, global_batch):
        """(steps an epoch, steps of the run) for this many training examples at this global batch, as
        step_count counts them; google-bert's epoch is a fraction of steps."""
        if self.step_count == "google-bert":
            return examples / global_batch, int(examples / global_batch * self.epochs)
        per_epoch = math.ceil(examples / global_batch)
        return per_epoch, _ceil(per_epoch * self.epochs)

    def warmup_steps(self, num_steps):
        """num_warmup_steps as given, else warmup_proportion of the steps, rounded up (or down, google-bert's
        int, with step_count="google-bert")."""
        if self.num_warmup_steps is not None:
            return int(self.num_warmup_steps)
        if self.step_count == "google-bert":
            return int(num_steps * self.warmup_proportion)
        return _ceil(num_steps * self.warmup_proportion)

    def settings(self, per_tower_batch):
        """What a resumed run must share with the first, under the keys run directories have recorded."""
        return {"num_train_epochs": self.epochs, "learning_rate": self.learning_rate,
                "warmup_proportion": self.warmup_proportion,
                **({"num_warmup_steps": self.num_warmup_steps} if self.num_warmup_steps is not None else {}),
                "per_tower_batch": per_tower_batch, "seed": self.seed,
                **({"gradient_accumulation_steps": self.gradient_accumulation_steps}
                   if self.gradient_accumulation_steps > 1 else {}),
                **({"layerwise_lr_decay": self.layerwise_lr_decay} if self.layerwise_lr_decay != 1.0 else {}),
                **({"class_weights": _recorded(check_class_weights(self.class_weights))}
                   if self.class_weights is not None else {}),
                **({"focal_gamma": self.focal_gamma} if self.focal_gamma else {}),
                **({"rdrop_alpha": self.rdrop_alpha} if self.rdrop_alpha else {}),
                **({"adversarial": self.adversarial, "adv_epsilon": self.adv_epsilon} if self.adversarial_steps
                   else {}),
                **({"pgd_steps": self.pgd_steps, "pgd_alpha": self.pgd_alpha} if self.adversarial == "pgd" else {}),
                **({"ema_decay": self.ema_decay, "ema_for_eval": bool(self.ema_for_eval)} if self.ema_decay else {}),
                **(self.lora.settings() if self.lora else {}),
                "length_buckets": bool(self.length_buckets), "adam_eps": self.adam_epsilon,
                "lr_schedule": self.lr_schedule, "step_count": self.step_count}


@dataclasses.dataclass
class PretrainConfig(LoopConfig):
    """A pretraining run's optimizer and batch; when it stops and how its rate moves is its `Budget`.

    Args:
        train_batch_size: the global batch, reached with the towers' micro-batch and gradient accumulation
            (None: one micro-batch per tower).
        optimizer: "adamw" or "lamb" (optimization.OPTIMIZERS).
        beta_1, beta_2, epsilon, weight_decay: the optimizer's.
        clipnorm: the global gradient norm is clipped to this (None: no clipping).
    """

    learning_rate: float = 1e-4
    train_batch_size: int | None = None
    optimizer: str = "adamw"
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    weight_decay: float = 0.01
    clipnorm: float | None = 1.0

    def settings(self, global_batch):
        """What a resumed run must share with the first, under the keys run directories have recorded."""
        return {"global_batch": global_batch, "learning_rate": self.learning_rate, "optimizer": self.optimizer,
                "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "weight_decay": self.weight_decay, "clipnorm": self.clipnorm}
