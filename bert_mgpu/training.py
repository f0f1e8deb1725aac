"""Training step and loop, evaluation and prediction, on whatever tf.distribute strategy it is given.

One step: every tower computes its loss and gradients on its slice of the global batch, the gradients are
averaged over towers explicitly (`all_reduce(MEAN)`), and the optimizer applies that mean once, to the
mirrored variables of every tower. Loss scaling (mixed_float16) and the skip of non-finite steps are the
optimizer's (see optimization.py); skips are counted as attempted steps minus applied ones.

Prediction gathers every tower's outputs with the example index each row came from, so outputs return in
input order and none is dropped, whatever the batch, bucketing and tower count.
"""

import time

import keras
import numpy as np
import tensorflow as tf


class Trainer:
    def __init__(self, strategy, model, optimizer=None, use_xla=False):
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")  # attempted steps
        # XLA compiles each tower's forward+backward; the all-reduce and update stay outside it.
        self._grads_fn = tf.function(self._loss_and_grads, jit_compile=True) if use_xla else self._loss_and_grads
        self._train_fn = self._predict_fn = None

    # ------------------------------------------------------------------ one step
    def _loss_and_grads(self, features, labels):
        with tf.GradientTape() as tape:
            logits = self.model(features, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
            scaled = self.optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def _train_replica(self, features, labels):
        loss, grads = self._grads_fn(features, labels)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        self.optimizer.apply(grads, self.model.trainable_variables)
        return loss, tf.shape(labels)[:1]

    def train_step(self, batch):
        """One optimizer step on a distributed batch -> (mean loss over towers, examples seen per tower)."""
        if self._train_fn is None:
            def step(batch):
                features, labels, _ = batch
                loss, seen = self.strategy.run(self._train_replica, args=(features, labels))
                mean = self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
                return mean, self.strategy.gather(seen, axis=0)

            self._train_fn = tf.function(step, reduce_retracing=True)
        loss, seen = self._train_fn(batch)
        self.step.assign_add(1)
        return float(loss), seen.numpy()

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

    # ------------------------------------------------------------------ loop
    def fit(self, dataset, num_steps, global_batch, on_save=None, save_every=1000, writer=None,
            log_every=10, verbose=True):
        """Run steps until `self.step == num_steps`; `on_save()` is called every `save_every` steps."""
        it = iter(self.strategy.experimental_distribute_dataset(dataset))
        start = int(self.step.numpy())
        bar = keras.utils.Progbar(num_steps, stateful_metrics=["loss", "lr", "ex/s"]) if verbose else None
        tic, done_since, loss = time.perf_counter(), 0, float("nan")
        for step in range(start + 1, num_steps + 1):
            loss, _ = self.train_step(next(it))
            done_since += 1
            if step % log_every == 0 or step == num_steps:
                rate = done_since * global_batch / (time.perf_counter() - tic)
                tic, done_since, lr = time.perf_counter(), 0, self.learning_rate
                if writer is not None:
                    with writer.as_default(step=step):
                        tf.summary.scalar("loss", loss)
                        tf.summary.scalar("learning_rate", lr)
                        tf.summary.scalar("loss_scale", self.loss_scale)
                        tf.summary.scalar("examples_per_second", rate)
                        tf.summary.scalar("skipped_steps", self.skipped_steps)
                if bar is not None:
                    bar.update(step, [("loss", loss), ("lr", lr), ("ex/s", rate)])
            if on_save is not None and (step % save_every == 0 or step == num_steps):
                on_save()
        return loss

    # ------------------------------------------------------------------ prediction
    def predict_logits(self, dataset):
        """(logits [N, C], labels [N]) for a dataset of (features, label, index), in input order."""
        dist = self.strategy.experimental_distribute_dataset(dataset)
        if self._predict_fn is None:
            def step(batch):
                features, labels, index = batch
                logits = self.strategy.run(lambda f: self.model(f, training=False), args=(features,))
                gather = lambda v: self.strategy.gather(v, axis=0)  # noqa: E731
                return gather(logits), gather(labels), gather(index)

            self._predict_fn = tf.function(step, reduce_retracing=True)
        parts = [tuple(t.numpy() for t in self._predict_fn(batch)) for batch in dist]
        logits, labels, index = (np.concatenate(p) for p in zip(*parts))
        order = np.argsort(index, kind="stable")
        if not np.array_equal(index[order], np.arange(len(index))):
            raise RuntimeError(f"prediction lost or duplicated examples ({len(index)} rows)")
        return logits[order], labels[order]
