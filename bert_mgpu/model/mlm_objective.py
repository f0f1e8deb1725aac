"""The pretraining head's objective (`BertPretrainer`, run_pretraining_mgpu.py), beside the fine-tuning heads'
in objectives.py: its loss, its eval_results names and the Hugging Face architecture its export names."""

import keras
import tensorflow as tf

from bert_mgpu.model.kernels import sparse_xent
from bert_mgpu.model.objective import Evaluation, Objective


class MaskedLanguageModel(Objective):
    """Pretraining as google-bert's run_pretraining.py: masked-LM cross-entropy over the real predictions,
    plus next-sentence cross-entropy when the model has that head; evaluated under google-bert's names."""

    name = "pretrainer"  # its head's name (io/heads.py), as every objective but a classifier's
    EVAL_NAMES = {"mlm_loss": "masked_lm_loss", "mlm_accuracy": "masked_lm_accuracy",
                  "nsp_loss": "next_sentence_loss", "nsp_accuracy": "next_sentence_accuracy", "loss": "loss"}

    def loss(self, model, features, labels, training=True):
        """(loss, stats): masked-LM loss and accuracy, the real tokens a sequence, NSP's loss and accuracy."""
        out = model(features, training=training)
        ids, weights = labels["masked_lm_ids"], tf.cast(labels["masked_lm_weights"], tf.float32)
        logits = out["mlm_logits"]
        per = tf.reshape(sparse_xent(tf.reshape(ids, [-1]), tf.reshape(logits, [-1, tf.shape(logits)[-1]])),
                         tf.shape(ids))
        denominator = tf.reduce_sum(weights) + 1e-5
        mlm_loss = tf.reduce_sum(per * weights) / denominator
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), ids), tf.float32)
        real = tf.reduce_sum(tf.cast(features["padding_mask"], tf.float32), 1)
        stats = {"mlm_loss": mlm_loss, "mlm_accuracy": tf.reduce_sum(correct * weights) / denominator,
                 "tokens_per_sequence": tf.reduce_mean(real)}
        loss = mlm_loss
        if "nsp_logits" in out:
            nsp = labels["next_sentence_labels"]
            nsp_loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(nsp, out["nsp_logits"],
                                                                                   from_logits=True))
            stats["nsp_loss"] = nsp_loss
            stats["nsp_accuracy"] = tf.reduce_mean(
                tf.cast(tf.equal(tf.argmax(out["nsp_logits"], -1, output_type=tf.int32), nsp), tf.float32))
            loss = loss + nsp_loss
        return loss, stats

    def evaluate(self, outputs, targets=None):
        """The evaluation's means (`Trainer.evaluate`'s statistics, which hold the targets' comparison already)
        under google-bert's eval_results names."""
        return Evaluation({self.EVAL_NAMES[k]: v for k, v in outputs.items() if k in self.EVAL_NAMES})

    def main_metric(self, task=None):
        return "masked_lm_accuracy"

    def hf_architecture(self, weights):
        """BertForPreTraining with the next-sentence head, else BertForMaskedLM."""
        return "BertForPreTraining" if "cls/seq_relationship/output_weights" in weights else "BertForMaskedLM"
