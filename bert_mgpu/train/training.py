"""The training step (and evaluation and prediction steps), on whatever tf.distribute strategy it is given.

One step: every tower computes its loss and gradients on its slice of the global batch (in `accum_steps`
micro-batches run one after another when memory is short), the gradients are averaged over towers
explicitly (`all_reduce(MEAN)`), and the optimizer applies that mean once, to the mirrored variables of
every tower. What the loss is comes from `loss_fn(model, features, labels, training) -> (loss, stats)`,
so the same step trains the classifier and the pretraining heads. Loss scaling (mixed_float16) and the skip
of non-finite steps are the optimizer's (see optimization.py); skips are counted as attempted steps minus
applied ones.

The loop that calls the step is loop.py's; out of memory in a step becomes one line naming tower, batch
and length (guards.py).

Prediction gathers every tower's outputs with the example index each row came from, so outputs return in
input order and none is dropped, whatever the batch, bucketing and tower count.
"""

import functools

import keras
import numpy as np
import tensorflow as tf

from bert_mgpu.core import _compat
from bert_mgpu.model import fused_encoder
from bert_mgpu.model.objectives import Classification
from bert_mgpu.parallel import distribute, guards

classification_loss = Classification().loss  # the Trainer's default loss; each head kind's is its objective's


def allreduce_dtypes(model, default):
    """Per trainable variable, the dtype its gradient crosses between towers as: `default`, except float32
    for variables of layers that compute in float32 (the classifier head), LayerNorms and embeddings, whose
    gradients need float32's precision or range and which Keras keeps in float32 math anyway."""
    import keras_hub

    owner = {}
    for layer in _compat.sublayers(model):  # outer layers first: the innermost owner wins
        for v in layer.trainable_weights:
            owner[id(v)] = layer
    keep = (keras.layers.LayerNormalization, keras.layers.Embedding, keras_hub.layers.PositionEmbedding)

    def dtype(v):
        layer = owner.get(id(v))
        if default == tf.float32 or layer is None:
            return default
        return tf.float32 if isinstance(layer, keep) or layer.compute_dtype == "float32" else default

    return [dtype(v) for v in model.trainable_variables]


def _share(grad, dtype, towers):
    """A tower's share of the mean, in the dtype it crosses as: divided by the tower count first, so a
    float16 sum over N towers needs no more range than one tower's gradient (TensorFlow's MEAN sums, then
    divides, and would overflow where each part does not)."""
    return tf.cast(grad / tf.cast(towers, grad.dtype), dtype)


class Trainer:
    """One training step, evaluation and prediction of a model on every tower of a strategy.

    The optimizer it needs: `scale_loss(loss)`, `apply(grads, variables)` called inside a replica with
    gradients already averaged over towers (it must not all-reduce them again), `inner_optimizer` with
    `iterations` (applied steps) and `learning_rate`, and `dynamic_scale`; `optimization.create_optimizer`
    makes one.

    Args:
        strategy: a tf.distribute strategy (`Towers.strategy`).
        model: a Keras model built under `strategy.scope()`.
        optimizer: as above; None for evaluation and prediction only.
        use_xla: XLA-compile each tower's forward and backward pass.
        loss_fn: `loss_fn(model, features, labels, training) -> (loss, stats)`. A loss that owns weights of its
            own (distillation's projection) lists them as `loss_fn.trainable_variables`: trained beside the
            model's, made under the same strategy.
        accum_steps: micro-batches per tower per step, their gradients accumulated.
        allreduce_dtype: what gradients cross between towers as; by default float16 when the model
            computes in float16 (half the bytes on NVLink/PCIe), else float32. LayerNorms, embeddings and
            float32 layers always cross in float32 (`allreduce_dtypes`).
        bytes_per_pack: gradients go in packs of about this size, last layers first, so a pack's
            all-reduce can start while backprop computes earlier layers (docs/gpu_scaling.md).

    Example:
        with towers.strategy.scope():
            model = build_classifier(config, num_labels=2)
            opt = optimization.create_optimizer(5e-5, num_train_steps=1000, num_warmup_steps=100)
        trainer = Trainer(towers.strategy, model, opt)
        Loop(trainer, global_batch=32).run(dataset, until_step=1000)
    """

    def __init__(self, strategy, model, optimizer=None, use_xla=False, loss_fn=classification_loss,
                 accum_steps=1, allreduce_dtype=None, bytes_per_pack=32 * 2**20):
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        own = list(getattr(loss_fn, "trainable_variables", ()))
        self.trained_variables = [*model.trainable_variables, *own]  # what a step trains
        distribute.per_tower_seeds(model)  # else every tower draws the same dropout masks
        if optimizer is not None and not optimizer.built:
            with strategy.scope():  # here, not in the first traced step, whose graph its variables would keep
                optimizer.build(self.trained_variables)
        if allreduce_dtype is None:
            computes = getattr(getattr(model, "backbone", model), "compute_dtype", None)
            allreduce_dtype = "float16" if computes == "float16" else "float32"
        self.allreduce_dtype = tf.as_dtype(allreduce_dtype)
        self._allreduce_dtypes = allreduce_dtypes(model, self.allreduce_dtype) + [tf.float32] * len(own)
        self.bytes_per_pack = bytes_per_pack
        self.loss_fn, self.accum_steps = loss_fn, int(accum_steps)
        self.stats = {}  # the last step's statistics (mean over towers), e.g. masked-LM accuracy
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")  # attempted steps
        # Non-finite steps in a row, and the longest such run since the host last looked (`read`): the
        # skip guard needs no host read per step.
        self._skips = tf.Variable(0, dtype=tf.int64, trainable=False, name="skips_in_a_row")
        self._longest_skips = tf.Variable(0, dtype=tf.int64, trainable=False, name="longest_skips")
        self.host_reads = 0  # how often `read` waited for the device (tests count them)
        self._unread = []  # (loss, stats) of each step since the last read, as device tensors
        # XLA compiles each tower's forward+backward; the all-reduce and update stay outside it.
        # Every tf.function here is traced as written: AutoGraph's rewrite cost ~2 s a process (NOTES item 43).
        self._grads_fn = (traced(self._loss_and_grads, jit_compile=True, autograph=False) if use_xla
                          else self._loss_and_grads)
        self._train_fn = self._predict_fn = self._eval_fn = None
        self._probe_fn = None
        # The distributed dataset's element_spec (dynamic batch and length), set by `training_batches`:
        # every step runs one trace, so a resumed run computes exactly what an uninterrupted one did
        # (shape-specialized traces would round differently from the generic one they relax into).
        self.input_spec = None

    def training_batches(self, dataset: tf.data.Dataset, worker_part: bool = False):
        """The towers' batches of a global-batch dataset (`worker_part`: this worker's rows of each), for
        `train_step`; every step of them then runs the one trace of the dataset's element_spec."""
        dist = distribute.distribute_dataset(self.strategy, dataset, worker_part)
        self.input_spec = dist.element_spec
        return iter(dist)

    # ------------------------------------------------------------------ one step
    def _loss_and_grads(self, features, labels):
        with tf.GradientTape() as tape:
            loss, stats = self.loss_fn(self.model, features, labels, training=True)
            scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, self.trained_variables)
        return loss, stats, [None if g is None else tf.convert_to_tensor(g) for g in grads]

    def _accumulated(self, features, labels):
        """Mean loss, statistics and gradients over `accum_steps` micro-batches of this tower's slice."""
        k = self.accum_steps
        micro = tf.nest.map_structure(lambda t: tf.reshape(t, tf.concat([[k, -1], tf.shape(t)[1:]], 0)),
                                      (features, labels))
        loss, stats, grads = self._grads_fn(*tf.nest.map_structure(lambda t: t[0], micro))
        present = [i for i, g in enumerate(grads) if g is not None]  # loop variables cannot be None

        def add_next(i, loss, stats, acc):  # a loop in the graph: the traced step holds one micro-batch
            l_i, s_i, g_i = self._grads_fn(*tf.nest.map_structure(lambda t: t[i], micro))
            return (i + 1, loss + l_i, tf.nest.map_structure(tf.add, stats, s_i),
                    [a + g_i[j] for a, j in zip(acc, present)])

        _, loss, stats, acc = tf.while_loop(lambda i, *_: i < k, add_next,
                                            (tf.constant(1), loss, stats, [grads[i] for i in present]))
        grads = [None] * len(grads)
        for j, a in zip(present, acc):
            grads[j] = a / k
        return loss / k, tf.nest.map_structure(lambda t: t / k, stats), grads

    def _train_replica(self, features, labels):
        if self.accum_steps > 1:
            loss, stats, grads = self._accumulated(features, labels)
        else:
            loss, stats, grads = self._grads_fn(features, labels)
        # Variables the loss does not reach (the pooler when pretraining without NSP) are left alone.
        used = [(g, v, d) for g, v, d in zip(grads, self.trained_variables, self._allreduce_dtypes)
                if g is not None]
        grads = distribute.all_reduce(tf.distribute.ReduceOp.SUM, [_share(g, d, self.strategy.num_replicas_in_sync)
                                                                for g, _, d in used],
                                   bytes_per_pack=self.bytes_per_pack)
        used = [(g, v) for g, (_, v, _) in zip(grads, used)]
        grads = [tf.cast(g, v.dtype) for g, v in used]
        self.optimizer.apply(grads, [v for _, v in used])
        return loss, stats, tf.shape(tf.nest.flatten(labels)[0])[:1]

    def _train_function(self):
        if self._train_fn is None:
            def step(batch):
                features, labels = batch[0], batch[1]
                before = tf.identity(self.optimizer.iterations)
                loss, stats, seen = self.strategy.run(self._train_replica, args=(features, labels))
                skips = tf.where(self.optimizer.iterations > before, tf.constant(0, tf.int64), self._skips + 1)
                self._skips.assign(skips)
                self._longest_skips.assign(tf.maximum(self._longest_skips, skips))
                mean = lambda t: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, t, axis=None)  # noqa: E731
                return mean(loss), tf.nest.map_structure(mean, stats), self.strategy.gather(seen, axis=0)

            signature = {"input_signature": [self.input_spec]} if self.input_spec is not None else {
                "reduce_retracing": True}
            self._train_fn = traced(step, autograph=False, **signature)
        return self._train_fn

    def step_graph(self, element_spec):
        """The training step traced, never run, for a distributed dataset's `element_spec`: the graph every
        tower would execute (tests read its all-reduces on devices this machine lacks)."""
        self.input_spec = element_spec
        return self._train_function().get_concrete_function(element_spec).graph

    def run_step(self, batch):
        """One optimizer step on a distributed batch, queued, not waited for -> the step's outputs as
        device tensors (mean loss, statistics, examples seen per tower); `read` turns them into numbers."""
        self._train_function()
        try:
            outputs = self._train_fn(batch)
        except tf.errors.ResourceExhaustedError as e:
            raise self._out_of_memory(e, batch) from None
        self.step.assign_add(1)
        self._unread.append(outputs[:2])
        return outputs

    def read(self, outputs):
        """Wait for a step's outputs -> (loss, examples seen per tower of that step, longest run of
        non-finite steps since the last read). The loss, and `self.stats` it sets, are means over towers
        and over the steps run since the last read (as Keras' progress bar and the HF Trainer log them),
        non-finite losses left out as the HF Trainer does; the mean is taken on the device, in one read."""
        unread, self._unread = self._unread or [outputs[:2]], []
        keys = list(unread[-1][1])
        columns = [[loss for loss, _ in unread]] + [[stats[k] for _, stats in unread] for k in keys]
        rows = tf.stack([tf.cast(tf.stack(c), tf.float32) for c in columns], axis=1)  # a few ops a read
        means = _finite_mean(rows).numpy()
        self.host_reads += 1
        self.stats = {k: float(v) for k, v in zip(keys, means[1:])}
        longest = int(self._longest_skips.numpy())
        self._longest_skips.assign(int(self._skips.numpy()))
        return float(means[0]), outputs[2].numpy(), longest

    def train_step(self, batch) -> tuple[float, np.ndarray]:
        """`run_step` and `read`: one step -> (mean loss over towers, examples seen per tower)."""
        loss, seen, _ = self.read(self.run_step(batch))
        return loss, seen

    def _out_of_memory(self, error, batch):
        first = lambda t: self.strategy.experimental_local_results(t)[0]  # noqa: E731
        ids = first(tf.nest.flatten(batch[0])[0])
        per_tower = int(ids.shape[0]) // max(1, self.accum_steps) if ids.shape[0] is not None else 0
        length = int(ids.shape[1]) if len(ids.shape) > 1 else 1
        return guards.out_of_memory(error, per_tower, length, self.accum_steps)

    def probe_step(self, batch):
        """Forward and backward of one distributed batch on each tower, every gradient held at once in one
        buffer in the all-reduce dtype (as a collective's pack holds them), then the optimizer's update on the
        first tower's device alone, and no collective: the memory of one GPU tower's step, measured without
        the towers waiting on each other (see memory.py). Give it a throwaway optimizer with learning rate 0.
        Raises ResourceExhaustedError."""
        def replica(features, labels):
            loss, _, grads = self._grads_fn(features, labels)
            flat = tf.concat([tf.reshape(tf.cast(g, self.allreduce_dtype), [-1]) for g in grads if g is not None], 0)
            used = [(g, v) for g, v in zip(grads, self.trained_variables) if g is not None]
            with tf.control_dependencies([flat]):  # after the pack: every gradient is alive as the update starts
                self.optimizer.apply_on_first_device([tf.cast(g, v.dtype) for g, v in used], [v for _, v in used])
            return loss + tf.cast(tf.reduce_sum(flat), loss.dtype)

        if self._probe_fn is None:
            self._probe_fn = traced(lambda b: self.strategy.run(replica, args=(b[0], b[1])),
                                         reduce_retracing=True, autograph=False)
        return self._probe_fn(batch)

    @property
    def applied_steps(self):
        return int(self.optimizer.inner_optimizer.iterations.numpy())

    @property
    def skipped_steps(self):
        return int(self.step.numpy()) - int(self.optimizer.inner_optimizer.iterations.numpy())

    @property
    def loss_scale(self):
        return float(self.optimizer.dynamic_scale.numpy())

    @property
    def learning_rate(self):
        inner = self.optimizer.inner_optimizer
        return float(inner.learning_rate(inner.iterations)) if callable(inner.learning_rate) else float(
            inner.learning_rate)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, dataset: tf.data.Dataset, max_steps: int | None = None) -> dict:
        """Mean loss and statistics of `loss_fn` (inference mode) per example, over a dataset or its first
        `max_steps` batches. A tower left without examples by the last, partial batch counts for nothing."""
        if self._eval_fn is None:
            def replica(features, labels):
                features, labels = tf.nest.map_structure(_rows_unknown, (features, labels))
                n = tf.cast(tf.shape(tf.nest.flatten(labels)[0])[0], tf.float32)
                features, labels = _at_least_one_row((features, labels))  # an empty tower: a filler row, weighed 0
                loss, stats = self.loss_fn(self.model, features, labels, training=False)
                weigh = lambda v: tf.where(n > 0, tf.cast(v, tf.float32) * n, 0.0)  # noqa: E731
                return tf.nest.map_structure(weigh, {"loss": loss, **stats}), n

            def step(batch):
                sums, n = self.strategy.run(replica, args=(batch[0], batch[1]))
                total = lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None)  # noqa: E731
                return tf.nest.map_structure(total, sums), total(n)

            self._eval_fn = traced(step, reduce_retracing=True, autograph=False)
        totals, count, batches = {}, 0.0, 0
        with self.strategy.scope(), fused_encoder.frozen_weights(self.model):  # weights cast once
            for batch in distribute.distribute_dataset(self.strategy, dataset):
                if max_steps is not None and batches >= max_steps:
                    break
                sums, n = self._eval_fn(batch)
                for k, v in sums.items():
                    totals[k] = totals.get(k, 0.0) + float(v)
                count, batches = count + float(n), batches + 1
        if not count:
            raise RuntimeError("evaluation data gave no example")
        return {k: v / count for k, v in totals.items()}

    # ------------------------------------------------------------------ prediction
    def predict_logits(self, dataset: tf.data.Dataset, progress=None) -> tuple[np.ndarray, np.ndarray]:
        """(logits [N, C], labels [N]) for a dataset of (features, label, index), in input order; rows
        whose index is negative are filler and dropped. A token head's [N, width, C] are padded to the
        widest batch. `progress(n)` hears of each batch's n rows."""
        dist = distribute.distribute_dataset(self.strategy, dataset)
        if self._predict_fn is None:
            def step(batch):
                features, labels, index = batch
                # An empty tower (a last batch of fewer rows than towers) predicts a filler row of index -1.
                features, labels = self.strategy.run(_at_least_one_row, args=((features, labels),))
                index = self.strategy.run(lambda i: _at_least_one_row(i, fill=-1), args=(index,))
                logits = self.strategy.run(lambda f: self.model(f, training=False), args=(features,))
                gather = lambda v: self.strategy.gather(v, axis=0)  # noqa: E731
                return gather(logits), gather(labels), gather(index)

            self._predict_fn = traced(step, reduce_retracing=True, autograph=False)
        with self.strategy.scope(), fused_encoder.frozen_weights(self.model):  # weights cast once a pass
            parts = []
            for batch in dist:
                parts.append(tuple(t.numpy() for t in self._predict_fn(batch)))
                if progress is not None:
                    progress(int(np.sum(parts[-1][2] >= 0)))
        logits, labels, index = (_concatenate(p) for p in zip(*parts))
        real = index >= 0  # rows of index -1 only fill a batch (input_pipeline's rows_multiple)
        logits, labels, index = logits[real], labels[real], index[real]
        order = np.argsort(index, kind="stable")
        if not np.array_equal(index[order], np.arange(len(index))):
            raise RuntimeError(f"prediction lost or duplicated examples ({len(index)} rows)")
        return logits[order], labels[order]


def traced(fn, **options):
    """tf.function(fn, **options), its traces counted on their own. TensorFlow counts traces by Python code
    object, so the steps of several models in one process (a GLUE suite's tasks, a notebook's second model),
    each traced once or twice, add up to its "excessive retracing" warning; a partial has no code object."""
    own = functools.partial(fn)
    own.__name__ = getattr(fn, "__name__", "step")  # the traced graph's name; __wrapped__ would share the count
    return tf.function(own, **options)


def _rows_unknown(t):
    """`t`, its row count hidden from the graph. The first trace of an evaluation set smaller than the towers
    knows a tower's share is 0 rows; Grappler then prunes that tower's loss (weighed 0) and the step fails
    with "Function NoOp is not defined" (the fused pretrainer's, seen on CPU towers)."""
    return tf.compat.v1.placeholder_with_default(t, [None, *t.shape[1:]])


def _at_least_one_row(structure, fill=0):
    """Each tensor with one row of `fill` where it has none, else as it is. A tower's share of a last, partial
    batch can be empty, and the encoder's reshapes then make a width-1 tensor that a head's gather or the
    all-gather refuses; the caller weighs the filler 0 (evaluation) or drops it (prediction: index -1)."""
    def pad(t):
        extra = tf.maximum(1 - tf.shape(t)[0], 0)
        paddings = tf.concat([[[0, extra]], tf.zeros([len(t.shape) - 1, 2], tf.int32)], axis=0)
        return tf.pad(t, paddings, constant_values=tf.cast(fill, t.dtype))

    return tf.nest.map_structure(pad, structure)


def _finite_mean(rows):
    """Column means of [steps, 1 + statistics] over the steps whose loss (column 0) is finite; over all
    steps when none is (the record then shows what went wrong)."""
    finite = tf.math.is_finite(rows[:, 0])
    keep = tf.cond(tf.reduce_any(finite), lambda: finite, lambda: tf.ones_like(finite))
    return tf.reduce_mean(tf.boolean_mask(rows, keep), axis=0)


def _concatenate(parts, pad=-1):
    """Batches end to end; a token head's batches have their own widths, padded to the widest (logits with 0,
    labels with -1, which nothing reads)."""
    widest = [max(p.shape[d] for p in parts) for d in range(1, parts[0].ndim)]
    if all(list(p.shape[1:]) == widest for p in parts):
        return np.concatenate(parts)
    value = 0 if np.issubdtype(parts[0].dtype, np.floating) else pad
    return np.concatenate([np.pad(p, [(0, 0)] + [(0, w - n) for w, n in zip(widest, p.shape[1:])],
                                  constant_values=value) for p in parts])
