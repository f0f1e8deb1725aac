"""One training session, the same for fine-tuning and pretraining: optimizer, step, restore, same start on
every worker, loop, close.

What differs between them comes in as arguments: the loss (an objective's, or pretraining's), what else the
checkpoint holds (pretraining's heads and clock), the hooks, and the dataset from the step it resumes at.
`BertClassifier.fit` and `BertPretrainer.fit` are each a `Session` and the checks of their own settings.

Example:
    session = Session(towers, model, run, lambda: create_optimizer(5e-5, 1000, 100), objective.loss)
    loop = session.loop(global_batch=32, config=TrainConfig(save_checkpoints_steps=500))
    session.train(loop, dataset.skip(session.start), until_step=1000)
"""

import contextlib
import logging

from bert_mgpu.core import _compat
from bert_mgpu.io import run_checkpoint, run_dir
from bert_mgpu.model.fused_encoder import set_recompute
from bert_mgpu.parallel import agree
from bert_mgpu.train import reporting
from bert_mgpu.train.loop import Loop
from bert_mgpu.train.system_metrics import SystemMetrics
from bert_mgpu.train.train_config import TrainConfig
from bert_mgpu.train.training import Trainer

log = logging.getLogger("bert_mgpu")


class Session:
    """A model trained on `towers` into the run directory `run` (run_dir.Run), resumed from its newest
    checkpoint.

    Args:
        towers: the devices (devices.Towers).
        model: the Keras model, built in the towers' strategy scope.
        run: the run directory; closed when `train` ends, however it ends.
        make_optimizer: called once in the strategy's scope -> the optimizer (optimization.create_optimizer).
        loss_fn: `loss_fn(model, features, labels, training) -> (loss, stats)`; what it owns to checkpoint
            (`loss_fn.checkpointed`, {name: trackable}: distillation's projection) joins `state`.
        accum_steps: micro-batches a tower runs per step (gradient accumulation).
        use_xla: XLA-compile each tower's step.
        recompute: the encoder's layers recomputed in the backward pass (`fused_encoder.set_recompute`).
        state: more objects the checkpoint holds ({name: trackable}), e.g. pretraining's heads and clock.
        seed: the run's seed (`TrainConfig.seed`), which also sets the dropout masks of a new run
            (`seed_dropout`); a resumed run takes them from its checkpoint.
    """

    def __init__(self, towers, model, run, make_optimizer, loss_fn, accum_steps=1, use_xla=False, state=None,
                 recompute=False, seed=None):
        self.towers, self.model, self.run = towers, model, run
        set_recompute(model, recompute)  # before the step is traced
        if seed is not None:
            seed_dropout(model, seed)  # before restore, which puts a resumed run's own state back
        agree.check_same_plan(towers.strategy, model_plan(model, accum_steps, use_xla, recompute))
        with towers.strategy.scope():
            self.optimizer = make_optimizer()
        self.trainer = Trainer(towers.strategy, model, self.optimizer, use_xla, loss_fn, accum_steps)
        self.restored = run.restore(run_checkpoint.training_checkpoint(
            model, self.optimizer, self.trainer.step, rng=run_dir.rng_states(model),
            **getattr(loss_fn, "checkpointed", {}), **(state or {})), model.weights)
        self.start = int(self.trainer.step.numpy())
        self.reporters = None  # the loggers of config.report_to, opened with the loop
        agree.check_same_start(towers.strategy, self.start, run.directory)

    def loop(self, global_batch, config, hooks=(), callbacks=None, clock=None, elapsed_before=0.0, before_save=None):
        """The loop over this session's steps as `config` (train_config.LoopConfig) says; it saves through the
        run (`before_save(loop)` first), and its records carry the machine's `system/` metrics."""

        def save():
            if before_save is not None:
                before_save(loop)
            self.run.save(int(self.trainer.step.numpy()))

        agree.check_same_plan(self.towers.strategy, {"global batch": global_batch})
        plan = self.towers.plan
        watch = SystemMetrics(plan.visible_names if plan.device_type == "GPU" else ())
        if config.report_to and self.run.chief and self.reporters is None:
            self.reporters = reporting.Reporters(config.report_to, self.run.directory,
                                                 {**self.run.settings, **config.as_dict()})
        loop = Loop(self.trainer, global_batch, [*hooks, watch], callbacks=callbacks, writer=self.run.writer,
                    log_every=config.log_every, save=save, save_every=config.save_checkpoints_steps,
                    last_checkpoint=lambda: self.run.latest, max_consecutive_skips=config.max_consecutive_skips,
                    clock=clock, elapsed_before=elapsed_before, verbose=config.verbose, reporters=self.reporters)
        return loop

    def train(self, loop, dataset, until_step=None, worker_part=False, reading=None):
        """Run `loop` on `dataset` (inside the `reading` context: input files held open) and close the run
        directory whatever happens. Returns the loop."""
        try:
            with reading or contextlib.nullcontext():
                loop.run(dataset, until_step=until_step, worker_part=worker_part)
        finally:
            self.close()
        return loop

    def close(self):
        self.run.close()
        if self.reporters is not None:
            self.reporters.close()


def model_plan(model, accum_steps, use_xla, recompute):
    """What every worker's session must share, for `agree.check_same_plan`: the precision, the
    model's weights (count, parameters, a checksum of their shapes) and how a step runs."""
    import zlib

    shapes = [tuple(w.shape) for w in model.weights]
    policies = sorted({layer.dtype_policy.name for layer in _compat.sublayers(model)})
    return {"precision": "+".join(policies),
            "model": f"{len(shapes)} weights, {sum(int(_size(s)) for s in shapes)} parameters, shapes "
                     f"{zlib.crc32(repr(shapes).encode()):08x}",
            "accumulation steps": accum_steps, "XLA": bool(use_xla), "recompute": bool(recompute)}


def _size(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


DEFAULT_SEED = TrainConfig.seed  # the scripts' --seed too


def seed_dropout(model, seed):
    """Start `model`'s dropout seed generators from `seed`, so runs with other seeds draw other masks.

    Each generator's first seed word becomes the one it was built with XOR (seed XOR DEFAULT_SEED): runs
    with the default seed draw what they always did, and the counter word Keras steps is left as it is.
    The fused encoder's generator is built with a fixed seed (1234): only this gives it the run's seed.
    """
    for generator in _compat.seed_generators(model):
        state = generator.state.numpy()
        built = getattr(generator, "_bert_mgpu_built_seed", None)
        if built is None:  # the first word as built: Keras steps only the second
            built = generator._bert_mgpu_built_seed = int(state[0])
        generator.state.assign([built ^ (int(seed) ^ DEFAULT_SEED), int(state[1])])
