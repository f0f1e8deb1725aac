"""What the workers of a job agree on before they act: the same plan, the same start, the chief's values.

Workers that disagree would run different collectives and wait on each other forever, or train different
things in one step; each check here ends every worker with the same one line instead. On one machine each
returns at once.
"""

from bert_mgpu.core import _compat
from bert_mgpu.core.errors import RunError
from bert_mgpu.parallel.distribute import worker_of


def check_same_start(strategy, step, output_dir):
    """RunError unless every worker resumed from the same step: workers that see different checkpoints
    (each its own local --output_dir) would run different steps and wait on each other forever."""
    every = [int(s) for s in ChiefDecides(strategy).every(step)]
    if len(set(every)) > 1:
        raise RunError(f"the workers found different checkpoints in {output_dir} (steps "
                       f"{', '.join(f'worker {i}: {s}' for i, s in enumerate(every))}); --output_dir must be "
                       "storage every worker reads, a shared file system or gs://")


def check_same_plan(strategy, facts, timeout_seconds=3600):
    """RunError unless every worker has the same `facts` ({name: value}, e.g. towers, per-tower batch,
    precision, the model's weights): workers that differ would wait on each other's collectives forever, or
    train different things in one step. Exchanged through the coordination service, not a collective, so a
    worker with other towers cannot hang it. Every worker raises the same one line; nothing on one machine."""
    import json

    index, workers = worker_of(strategy)
    if workers == 1:
        return
    _PLANS.append(None)
    every = _compat.exchange_with_workers(f"bert_mgpu_plan/{len(_PLANS)}", json.dumps(facts, sort_keys=True),
                                          workers, index, timeout_seconds)
    if every is None:
        return
    plans = [json.loads(p) for p in every]
    differ = [name for name in sorted(set().union(*plans)) if len({json.dumps(p.get(name)) for p in plans}) > 1]
    if differ:
        said = "; ".join(f"{name}: " + ", ".join(f"worker {i}: {p.get(name)}" for i, p in enumerate(plans))
                         for name in differ)
        raise RunError(f"the workers' plans differ ({said}); every worker must run the same plan: the same "
                       "count of GPUs and --towers_per_gpu, batch size, --precision and model")


_PLANS = []  # one key of the coordination service per check in this process, the same on every worker


def same_model_loaded(strategy, read_dir, step, directory):
    """Read the model in `directory` (`read_dir(directory) -> the step it holds`, -1 none) once the chief has put
    it there, and check every worker read `step`'s: on slow shared storage (NFS, gs://) a worker that
    reads before the chief's rename lands would hold an older model, and the towers would mix two.
    RunError naming who read what otherwise."""
    _BARRIERS.append(None)
    _compat.wait_for_workers(f"bert_mgpu_model/{len(_BARRIERS)}", 3600)  # the chief writes it before this
    every = [int(s) for s in ChiefDecides(strategy).every(read_dir(directory))]
    if any(s != step for s in every):
        read = ", ".join(f"worker {i}: {'none' if s < 0 else f'step {s}'}" for i, s in enumerate(every))
        raise RunError(f"the workers read different models from {directory} ({read}; the best is step {step}); "
                       "--output_dir must be storage every worker reads, a shared file system or gs://")


_BARRIERS = []


class ChiefDecides:
    """The chief's values, on every worker: what workers must agree on before they act (the clock, a
    stop), so that no two ever run different collectives or apply different learning rates.

    One collective between the workers' hosts per call; it waits for the other workers' hosts, never
    for a GPU. On one machine it returns the values as they are.

    Example:
        decide = ChiefDecides(strategy)
        elapsed, = decide([time.monotonic() - start])      # the chief's clock, on every worker
    """

    def __init__(self, strategy):
        self.strategy = strategy
        self.index, self.workers = worker_of(strategy)
        self._sum = None

    def __call__(self, values, any_of=()):
        """`values` (floats) as the chief has them; positions in `any_of` are instead the sum over workers
        (a flag any worker may raise; `every` builds on it)."""
        if self.workers == 1:
            return [float(v) for v in values]
        import numpy as np
        import tensorflow as tf

        values = np.asarray(values, np.float64)
        mine = np.where([i in any_of for i in range(len(values))], values, values * (self.index == 0))
        if self._sum is None:  # traced: an eager reduce costs ~6x more (benchmarks/NOTES.md)
            ops = _compat.host_cross_device_ops(self.strategy)
            self._sum = tf.function(lambda x: ops.reduce(tf.distribute.ReduceOp.SUM, x, destinations="/cpu:0"),
                                    autograph=False)
        with tf.device("/cpu:0"):
            total = self._sum(tf.constant(mine))
        return [float(v) for v in np.asarray(total)]

    def every(self, value):
        """[each worker's `value`], in worker order, on every worker (e.g. to take the smallest)."""
        if self.workers == 1:
            return [float(value)]
        mine = [0.0] * self.workers
        mine[self.index] = float(value)
        return self(mine, any_of=range(self.workers))
