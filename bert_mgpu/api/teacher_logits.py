"""A teacher's outputs on the training rows, predicted once and kept in a file (`--teacher_logits=FILE`): each
training batch then carries its rows' outputs, looked up by the rows' `index`, and the distillation step runs
the student alone. The teacher predicts without dropout, so its outputs are the same every epoch: a run of
E epochs saves E teacher forward passes a row (most of a step when the teacher is the larger model).

The file is safetensors (no code runs when it is read): the logits, and in its metadata what they were made
from: the training rows (the run's `train_data_sha256`, unlabelled rows included), the teacher's weights,
vocabulary, precision and maximum sequence length. Another run of the same data and teacher reads it; any
other is refused in one line, so a stale cache never teaches. With several workers every worker predicts the
rows (the prediction's collectives need them all) unless the file exists when they start, and the chief
writes it; workers that see it differently stop in one line (`agree.check_same_plan`).

Example:
    bert_mgpu.Distiller(teacher, student, teacher_logits="out/teacher_logits.safetensors").fit(train, "out/student")
"""

import hashlib
import logging
import os

import numpy as np
import tensorflow as tf

from bert_mgpu.core.errors import UserError
from bert_mgpu.model.distillation import CACHED
from bert_mgpu.parallel import agree

log = logging.getLogger("bert_mgpu")


def vocab_digest(tokenizer):
    """sha256 of a tokenizer's WordPieces in order and its casing: how the teacher read the texts."""
    h = hashlib.sha256("\n".join(tokenizer.vocab).encode())
    h.update(b"lower" if tokenizer.do_lower_case else b"cased")
    return h.hexdigest()


class TeacherLogits:
    """`batches(head, data, digest, dataset)`: the training `dataset` of `head` (the student) with each row's
    cached teacher outputs as the feature `teacher_logits`, read from `path` or predicted there first.
    `teacher`: the teacher (a FineTuned of the student's head); `teacher_sha256`: its weights' digest."""

    def __init__(self, path, teacher, teacher_sha256, own_words=False):
        self.path, self.teacher, self.teacher_sha256 = str(path), teacher, teacher_sha256
        self.own_words = own_words  # a student of another vocabulary: the teacher tokenizes each text itself
        self.source = None  # after `batches`: "read" or "predicted", for the run's messages

    def facts(self, digest):
        """What the file must have been made from."""
        t = self.teacher
        return {"train_data_sha256": digest, "teacher_sha256": self.teacher_sha256, "precision": t.policy,
                "max_seq_length": int(t.max_seq_length), "teacher_vocab_sha256": vocab_digest(t.tokenizer)}

    def read(self, digest):
        """The cached outputs for `digest`'s rows, or None without a file; UserError for another run's file."""
        import safetensors

        if not os.path.exists(self.path):
            return None
        wanted = {k: str(v) for k, v in self.facts(digest).items()}
        try:
            with safetensors.safe_open(self.path, framework="numpy") as f:
                stored = f.metadata() or {}
                made = {k: stored[k] for k in wanted}
                logits = f.get_tensor("logits")
        except (OSError, KeyError, safetensors.SafetensorError) as e:
            raise UserError(f"--teacher_logits={self.path}: not a teacher-logits file of bert_mgpu "
                            f"({type(e).__name__}: {e}); delete it to predict it anew") from None
        other = [k for k in wanted if made[k] != wanted[k]]
        if other:
            raise UserError(f"--teacher_logits={self.path}: made for another "
                            f"{', '.join(f'{k} ({made[k]}, this run {wanted[k]})' for k in other)}; delete it or "
                            "name a new file")
        return logits

    def predict(self, head, data, rows_multiple=8):
        """The teacher's outputs on `data` (the student's training rows), in index order, float32."""
        towers, size = self.teacher.towers, max(int(head.train_batch_size), 8)
        if self.own_words:  # a classifier's rows, each text read by the teacher's tokenizer (Distiller checks)
            return self.teacher._logits(data[0], size, "train", verbose=False)[0].astype(np.float32)
        dataset = head._rows_dataset(data, towers.batch(size), towers.batch(rows_multiple))
        logits, _ = self.teacher._predictor.predict_logits(dataset)
        return logits.astype(np.float32)

    def write(self, logits, digest):
        from safetensors.numpy import save_file

        part = self.path + ".part"
        save_file({"logits": np.ascontiguousarray(logits)}, part,
                  metadata={k: str(v) for k, v in self.facts(digest).items()})
        os.replace(part, self.path)

    def outputs(self, head, data, digest):
        """The outputs for the rows of `data`: the file's, or predicted and (by the chief) written. Workers
        that differ on whether the file is there (no shared storage) end in one line: those without it would
        wait forever in the prediction's collectives."""
        agree.check_same_plan(self.teacher.towers.strategy, {"--teacher_logits file": os.path.exists(self.path)})
        logits = self.read(digest)
        if logits is not None:
            self.source = "read"
            log.info("teacher logits: read %d rows from %s", len(logits), self.path)
            return logits
        logits, self.source = self.predict(head, data), "predicted"
        if self.teacher.towers.is_chief:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self.write(logits, digest)
        log.info("teacher logits: predicted %d rows, kept in %s", len(logits), self.path)
        return logits

    def batches(self, head, data, digest, dataset):
        logits = self.outputs(head, data, digest)
        table = tf.constant(logits)
        per_token = logits.ndim == 3

        def add(features, labels, index):
            rows = tf.gather(table, index)
            if per_token:  # the batch's width: the table is as wide as the widest prediction batch
                width = tf.shape(features["token_ids"])[1]
                rows = tf.pad(rows, [[0, 0], [0, tf.maximum(width - tf.shape(rows)[1], 0)], [0, 0]])[:, :width]
            return {**features, CACHED: rows}, labels, index

        return dataset.map(tf.autograph.experimental.do_not_convert(add), num_parallel_calls=tf.data.AUTOTUNE)
