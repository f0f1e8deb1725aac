"""What stops a run: a signal (save, then stop), non-finite steps in a row, out of memory."""

import os
import signal
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_python, tiny_config
from test_training import batch

from bert_mgpu.core.errors import RunError
from bert_mgpu.io import run_dir
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute, guards
from bert_mgpu.train import optimization, training
from bert_mgpu.train.loop import Loop


def test_signal_is_recorded_not_fatal_and_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    with guards.StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == "SIGTERM"  # still running
        with pytest.raises(KeyboardInterrupt):  # asked twice: stop now
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_run_of_limit_skips_stops_naming_the_step_and_checkpoint():
    guard = guards.SkipGuard(3)
    guard.check(2, 5, "out/ckpt-2")  # under the limit: goes on
    guards.SkipGuard(0).check(100, 5, None)  # 0: no limit
    with pytest.raises(RunError, match=r"step 6: 3 steps in a row had non-finite gradients .* Last good "
                                       r"checkpoint: out/ckpt-2"):
        guard.check(3, 6, "out/ckpt-2")


def test_out_of_memory_names_tower_batch_length_and_a_batch_to_try():
    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[64,12,512,512] "
                                             "on /job:localhost/replica:0/task:0/device:GPU:3 by allocator GPU_3_bfc")
    assert str(guards.out_of_memory(error, 64, 512)) == (
        "out of memory on tower 3 at per-tower batch 64 x sequence length 512; try --train_batch_size=32 per "
        "tower (with 2 accumulation steps to keep the global batch), a shorter --max_seq_length, or "
        "--auto_batch_size")
    assert "even one sequence does not fit" in str(guards.out_of_memory(error, 1, 512))
    xla = ("Graph execution error:\n\nDetected at node replica_1/bert_classifier_1/fused_encoder_1/PartitionedCall "
           "defined at (most recent call last):\nOut of memory while trying to allocate 256.00MiB.")
    assert guards.tower_of(xla) == 1 and guards.tower_of(xla.replace("replica_1/", "")) == 0  # the first tower
    assert guards.tower_of("Out of memory while trying to allocate 256.00MiB.") is None  # nothing names one


def poisoned_loss(model, features, labels, training=True):
    """The classifier's loss times a per-batch factor that a test sets to NaN or Inf: a poisoned batch."""
    labels, factor = labels
    loss, stats = training_loss(model, features, labels, training)
    return loss * factor[0], stats


training_loss = training.classification_loss


def poisoned_run(tmp_path, poisoned_steps, limit, steps=10, poison=np.nan, log_every=1):
    plan = devices.plan_devices(0, 2, ())
    strategy = distribute.make_strategy(plan)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = modeling.build_classifier(tiny_config(38, hidden_dropout_prob=0.0), 2)
        opt = optimization.create_optimizer(1e-3, steps, 0)
        opt.build(model.trainable_variables)
    trainer = training.Trainer(strategy, model, opt, loss_fn=poisoned_loss)
    features, labels, _ = batch()
    factors = [np.full(8, poison if s in poisoned_steps else 1.0, np.float32) for s in range(1, steps + 1)]
    ds = tf.data.Dataset.from_tensor_slices(factors).map(lambda f: (features, (labels, f)))
    saved = run_dir.Checkpoints(tf.train.Checkpoint(model=model), str(tmp_path), model.weights)
    on_save = lambda: saved.save(int(trainer.step.numpy()))  # noqa: E731
    loop = Loop(trainer, 8, save=on_save, save_every=2, verbose=False, max_consecutive_skips=limit,
                last_checkpoint=lambda: saved.latest, log_every=log_every)
    return trainer, model, saved, lambda: loop.run(ds, until_step=steps)["loss"]


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_poisoned_batches_are_skipped_and_training_goes_on(tmp_path, poison):
    trainer, model, saved, fit = poisoned_run(tmp_path, {4, 5}, limit=3, poison=poison)
    loss = fit()
    assert trainer.skipped_steps == 2 and trainer.applied_steps == 8 and np.isfinite(loss)
    assert all(np.all(np.isfinite(w.numpy())) for w in model.weights)
    assert saved.latest.endswith("ckpt-10")


def test_too_many_poisoned_batches_in_a_row_stop_naming_the_last_good_checkpoint(tmp_path):
    trainer, model, saved, fit = poisoned_run(tmp_path, {5, 6, 7}, limit=3)
    with pytest.raises(RunError, match=r"step 7: 3 steps in a row .* Last good checkpoint: .*ckpt-6"):
        fit()
    assert trainer.applied_steps == 4  # steps 5-7 changed nothing


def test_skips_between_logging_steps_are_seen_at_the_next_one(tmp_path):
    """The device counts the runs of skips; a run of 3 that ended before the logging step still stops it."""
    trainer, model, saved, fit = poisoned_run(tmp_path, {2, 3, 4}, limit=3, log_every=5)
    with pytest.raises(RunError, match=r"step 5: 3 steps in a row .* Last good checkpoint: .*ckpt-4"):
        fit()
    assert trainer.applied_steps == 2 and trainer.host_reads == 1  # steps 1 and 5 applied; one read


def test_out_of_memory_in_a_step_becomes_one_line(tmp_path):
    def out_of_memory(model, features, labels, training=True):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM ... on /job:localhost/replica:0/task:0/device:CPU:1")

    trainer, _, _, _ = poisoned_run(tmp_path, set(), limit=3)
    trainer.loss_fn = out_of_memory
    features, labels, _ = batch(8, length=12)
    dist = next(iter(trainer.strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors((features, labels)))))
    with pytest.raises(RunError, match=r"out of memory on tower 1 at per-tower batch 4 x sequence length 12; "
                                       r"try --train_batch_size=2"):
        trainer.train_step(dist)


REAL_OUT_OF_MEMORY = """
import re, resource
import pytest, tensorflow as tf
from conftest import tiny_config
from bert_mgpu.core.errors import RunError
from bert_mgpu.model import modeling
from bert_mgpu.parallel import devices, distribute
from bert_mgpu.train import memory, optimization, training

plan = devices.plan_devices(0, 2, ())
strategy = distribute.make_strategy(plan)
with strategy.scope():
    model = modeling.build_classifier(tiny_config(38), 2)
    optimizer = optimization.create_optimizer(1e-3, 10, 0)
trainer = training.Trainer(strategy, model, optimizer)
small = memory.classifier_batch(2 * 4, 64)
dist = lambda b: next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(b))))
trainer.train_step(dist(small))  # trace, compile, start the thread pools: what any step needs
big = dist(memory.classifier_batch(2 * 32768, 64))
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) for line in f if line.startswith("VmSize")) * 1024
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (size + 128 * 2**20, hard))
try:
    with pytest.raises(RunError) as caught:
        trainer.train_step(big)
finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
assert re.fullmatch(r"out of memory on tower [01] at per-tower batch 32768 x sequence length 64; try "
                    r"--train_batch_size=16384 per tower .*", str(caught.value)), caught.value
assert trainer.train_step(dist(small))[1].tolist() == [4, 4]  # the process goes on
print("named and went on")
"""


@pytest.mark.process
def test_a_real_out_of_memory_names_the_tower_batch_and_length():
    """A real allocation failure, not an injected error: the process's address space is capped just above
    what it holds, so the first activation of 2 x 32768 sequences of 64 tokens (256 MiB a tower) cannot be
    allocated. (A cap that lets the step start fails later inside kernels that do not check malloc: on
    CPU, running out of memory part-way is a crash, as it is under the kernel's OOM killer.) In a process
    of its own: in a test worker, what earlier tests left (threads, arenas, modules) moved the first
    allocation that fails to one that aborts."""
    proc = run_python(REAL_OUT_OF_MEMORY)
    assert "named and went on" in proc.stdout


@pytest.mark.parametrize("message, who", [
    ("Graph execution error:\n\nAdditional GRPC error information from remote target "
     "/job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf", "worker 1"),
    ("Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy "
     "(stopped sending heartbeats):\n/job:worker/replica:0/task:1", "worker 1"),
    ("The following tasks are unhealthy (stopped sending heartbeats):\n/job:chief/replica:0/task:0\n", "chief 0"),
    ("Graph execution error:", "another worker"),
])
def test_a_lost_worker_is_named_when_tensorflow_names_it(message, who):
    """The messages TensorFlow 2.21 gave when a peer was killed (tests/test_multi_worker.py kills one)."""
    error = guards.worker_lost(tf.errors.UnavailableError(None, None, message), "/out/ckpt-20")
    assert str(error) == (f"{who} stopped or cannot be reached (UnavailableError in a collective); rerun the same "
                          "command on every worker: the job resumes from /out/ckpt-20")


def test_a_worker_told_of_another_workers_signal_stops_right_after_its_save():
    """The worker that got no signal: its handler's watcher thread waits on this worker's signal, and the
    handler joins it after the agreed save. The save wakes it, so the stop does not wait out the watcher's
    60 s (it did: the multi-worker SIGTERM test's workers sat idle 45 s). The handler runs in local mode;
    the agreed step is set as its cluster watcher thread sets it when another worker was signalled."""
    saves = []
    preemption = guards.Preemption(tf.distribute.MirroredStrategy(["/cpu:0"]), lambda: saves.append(1), workers=2)
    with preemption:
        handler = preemption._handler
        assert handler._poll_termination_signal_thread.is_alive()
        assert preemption.after_step() is None and saves == []
        handler._step_to_checkpoint = str(handler._run_counter)  # the next call, as _watch_step_to_save_key sets it
        handler._received_checkpoint_step.set()
        start = time.monotonic()
        assert preemption.after_step() == "a signal to another worker"
        took = time.monotonic() - start
    assert saves == [1] and preemption.requested is None
    assert took < 30, f"the stop waited {took:.0f} s for the signal watcher"
