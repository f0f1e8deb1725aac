"""A pretraining run's budget, after "How to Train BERT with an Academic Budget": when to stop (steps, hours,
an early-exit marker), what share of it is spent (what a time-based learning rate follows), when to
validate (denser near both ends), when a still-high validation loss ends the run early, and at which
shares to write fine-tune checkpoints. The hooks carry these into the training loop.

Example:
    budget = Budget(total_training_time=0.1, lr_schedule="time", finetune_time_markers=(0.5, 1.0))
    budget.check()
    budget.progress(step=100, elapsed=180.0)  # 0.5: half of the 6 minutes spent
"""

import dataclasses

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import run_dir
from bert_mgpu.train.loop import Hook


@dataclasses.dataclass
class Budget:
    """When to stop and how the learning rate moves. Give num_train_steps, total_training_time, or both."""

    num_train_steps: int = None
    total_training_time: float = None  # hours
    lr_schedule: str = "step"  # "step": warmup + (polynomial) decay over steps; "time": over the time budget
    curve: str = "linear"  # time schedule: linear or exp
    decay_power: float = 1.0  # step schedule: 1 = linear
    warmup_proportion: float = 0.01  # share of the steps, or of the time budget
    num_warmup_steps: int = None  # step schedule: warmup steps as given (else warmup_proportion of the steps)
    early_exit_time_marker: float = None  # hours: stop here even if the schedule runs longer
    finetune_time_markers: tuple = ()  # shares of the budget at which to write fine-tune checkpoints
    early_stop_time: float = None  # minutes after which ...
    early_stop_eval_loss: float = None  # ... a validation loss above this stops the run

    def warmup_steps(self):
        """The step schedule's warmup: num_warmup_steps as given, else google-bert's int(steps x proportion)."""
        if self.num_warmup_steps is not None:
            return int(self.num_warmup_steps)
        return int(self.num_train_steps * self.warmup_proportion)

    def check(self):
        if not self.num_train_steps and not self.total_training_time:
            raise UserError("give --num_train_steps or --total_training_time (hours), or both")
        if self.lr_schedule not in ("step", "time"):
            raise UserError(f"--lr_schedule={self.lr_schedule!r}: expected step or time")
        if self.lr_schedule == "time" and not self.total_training_time:
            raise UserError("--lr_schedule=time needs --total_training_time (hours)")
        if self.lr_schedule == "step" and not self.num_train_steps:
            raise UserError("--lr_schedule=step needs --num_train_steps")
        if any(not 0 < m <= 1 for m in self.finetune_time_markers):
            raise UserError(f"--finetune_time_markers={list(self.finetune_time_markers)}: shares in (0, 1]")

    def progress(self, step, elapsed):
        """Share of the budget spent: of the time budget when there is one, else of the steps."""
        if self.total_training_time:
            return elapsed / (self.total_training_time * 3600.0)
        return step / self.num_train_steps

    def stop_reason(self, step, elapsed):
        if self.num_train_steps and step >= self.num_train_steps:
            return f"reached {self.num_train_steps} steps"
        if self.total_training_time and elapsed >= self.total_training_time * 3600.0:
            return f"time budget of {self.total_training_time} h spent"
        if self.early_exit_time_marker and elapsed >= self.early_exit_time_marker * 3600.0:
            return f"early exit time marker of {self.early_exit_time_marker} h"
        return None


@dataclasses.dataclass
class Validation:
    """Held-out data and how often to score it: every `epochs` (or `steps`), denser at both ends."""

    data: object  # a PretrainingData
    epochs: float = 1.0
    steps: int = None  # overrides `epochs` between the dense regions
    begin_proportion: float = 0.0  # share of the budget at the start ...
    epochs_begin: float = None  # ... validated every this many epochs
    end_proportion: float = 0.0
    epochs_end: float = None
    batch_size: int = 32  # global
    max_steps: int = 100  # batches per validation

    def interval(self, progress, steps_per_epoch):
        """Steps between validations at this point of the budget."""
        if self.epochs_begin and progress < self.begin_proportion:
            epochs = self.epochs_begin
        elif self.epochs_end and progress >= 1.0 - self.end_proportion:
            epochs = self.epochs_end
        elif self.steps:
            return self.steps
        else:
            epochs = self.epochs
        return max(1, round(epochs * steps_per_epoch()))


class TimeBudget(Hook):
    """Stops the run when the budget says so, and sets `progress` (what a time-based learning rate
    follows) before every step."""

    def __init__(self, budget, progress):
        self.budget, self.progress, self.value = budget, progress, 0.0

    def should_stop(self, loop):
        return self.budget.stop_reason(loop.step, loop.elapsed())

    def before_step(self, loop):
        self.value = self.budget.progress(loop.step, loop.elapsed())
        self.progress.assign(self.value)

    def on_log(self, loop, record):
        record["progress"] = self.value


class StepLimit(Hook):
    """Stops this call after `steps` steps (a notebook trains in chunks; the next call resumes)."""

    def __init__(self, steps):
        self.steps = steps

    def should_stop(self, loop):
        return f"ran the {self.steps} steps asked for" if loop.step - loop.first_step >= self.steps else None


class EarlyStop(Hook):
    """Academic-budget early stop: a validation loss still above `early_stop_eval_loss` after
    `early_stop_time` minutes ends the run (placed after the `Evaluation` hook)."""

    def __init__(self, budget):
        self.budget, self.seen = budget, None

    def after_step(self, loop, record):
        b, last = self.budget, loop.history[-1] if loop.history else {}
        if b.early_stop_time is None or b.early_stop_eval_loss is None or "eval_loss" not in last or \
                last is self.seen:
            return
        self.seen = last
        if loop.elapsed() >= b.early_stop_time * 60 and last["eval_loss"] > b.early_stop_eval_loss:
            loop.stop = (f"early stop: validation loss {last['eval_loss']:.4f} > {b.early_stop_eval_loss} "
                         f"after {b.early_stop_time} min")


class FinetuneMarkers(Hook):
    """Writes a fine-tune checkpoint (`write(directory, step)`) when the budget spent reaches each marker;
    the end marker (1.0) is reached only as the run stops. Markers already written are not redone."""

    def __init__(self, budget, directory, write):
        self.budget, self.directory, self.write = budget, directory, write
        self.markers = sorted(m for m in budget.finetune_time_markers if not run_dir.is_whole_model_dir(directory(m)))

    def after_step(self, loop, record):
        while self.markers and self.budget.progress(loop.step, loop.elapsed()) >= self.markers[0]:
            self.write(self.directory(self.markers.pop(0)), loop.step)

    def end(self, loop):
        final = self.budget.progress(loop.step, loop.elapsed())
        for m in self.markers:
            if final >= m - 1e-9 or (loop.stop or "").startswith("reached"):
                self.write(self.directory(m), loop.step)
        self.markers = []
