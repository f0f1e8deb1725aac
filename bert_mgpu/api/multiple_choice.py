"""The notebook API for multiple choice (SWAG, C3, CHID) on every tower.

Example:
    import bert_mgpu
    train = bert_mgpu.read_choices("data/swag/train.csv")                    # [ChoiceQuestion]
    mc = bert_mgpu.BertMultipleChoice.from_pretrained("model_dir", max_seq_length=128)
    mc.fit(train, output_dir="out", epochs=3, learning_rate=2e-5)
    mc.evaluate(bert_mgpu.read_choices("data/swag/val.csv"))                  # {"eval_accuracy", "eval_loss", ...}
    mc.predict([("A man sits at a piano.", "He", ["plays a song.", "eats the piano."])])  # [{"label": 0, ...}]

`run_multiple_choice_mgpu.py` is a thin absl-flags wrapper over this class.
"""

import hashlib
import logging

from bert_mgpu.api.fine_tuning import FineTuned
from bert_mgpu.api.opening import open_head
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.choice_input import choice_dataset, encode_questions
from bert_mgpu.data.choices import ChoiceQuestion, as_questions, chosen  # noqa: F401 (as before)
from bert_mgpu.io import export, run_checkpoint
from bert_mgpu.io.trained import Trained, model_weights
from bert_mgpu.model.choice_objectives import MultipleChoice
from bert_mgpu.model.modeling import build_choice_model
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory

log = logging.getLogger("bert_mgpu")
KIND = "multiple_choice"  # bert_mgpu.json's kind


def questions_digest(questions):
    """sha256 of the questions: a resumed run must train on the same data."""
    h = hashlib.sha256()
    for q in questions:
        h.update("\x00".join([q.guid, q.context, q.question, *q.choices, str(q.label)]).encode("utf-8") + b"\x01")
    return h.hexdigest()


class BertMultipleChoice(FineTuned):
    """A BERT multiple-choice model trained on every tower: each choice read with its context, one score a
    choice, softmax over the question's choices (transformers' BertForMultipleChoice).

    `fit` trains as `BertClassifier.fit` does (evaluation while training, the best model by accuracy, early
    stopping, resume); `evaluate` gives accuracy and loss; `predict` each question's choice and probabilities.

    Args:
        model: the Keras model (`build_choice_model`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: WordPieces a choice's input holds (context, question and choice; the longer cut first).
        fused_encoder: whether `model` runs the fused encoder.

    Example:
        mc = bert_mgpu.BertMultipleChoice.from_pretrained("model_dir")
        mc.predict([("The sky is", "", ["blue.", "a fish."])])  # [{"label": 0, "probabilities": [...]}]
    """

    unit = "questions"

    def __init__(self, model, tokenizer, config, towers, policy, max_seq_length=128, fused_encoder=True):
        super().__init__(model, tokenizer, [], config, towers, policy, max_seq_length, MultipleChoice(),
                         fused_encoder)
        self.probe_choices = 4  # choices a question has in `auto_batch_size`'s probe (SWAG's; CHID has 10)

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, towers: Towers | None = None, precision: str = "auto",
                        max_seq_length: int | None = None, do_lower_case: bool | None = None,
                        bert_config_file: str | None = None, vocab_file: str | None = None,
                        fused_encoder: bool = True) -> "BertMultipleChoice":
        """A multiple-choice model from any checkpoint bert_mgpu reads; the head is the checkpoint's when it
        has a one-unit head (a bert_mgpu multiple-choice run, transformers' BertForMultipleChoice, its Google
        export), else fresh."""
        found = open_head(KIND, init_checkpoint, lambda config, policy: build_choice_model(
            config, policy, fused=fused_encoder), max_seq_length, 128, towers, precision, do_lower_case,
            bert_config_file, vocab_file)
        opened, model, own, pre = found.opened, found.model, found.own, found.opened.pretrained
        head = pre.weights.get("output_weights") if opened.has_weights and not own else None
        unused = [n for n in found.unused if not (head is not None and n in ("output_weights", "output_bias"))]
        if unused:
            log.info("not used by a multiple-choice model: %s", ", ".join(unused))
        if own:
            run_checkpoint.restore_head(model, pre.ckpt_prefix)
            log.info("multiple-choice head restored from %s", pre.ckpt_prefix)
        elif (head is not None and head.T.shape == tuple(model.head.kernel.shape)
              and pre.task_type != "regression"):
            model.head.kernel.assign(head.T)
            model.head.bias.assign(pre.weights["output_bias"])
            log.info("multiple-choice head loaded from %s", init_checkpoint)
        else:
            log.info("multiple-choice head is freshly initialized")
        mc = cls(model, opened.tokenizer, opened.config, opened.towers, opened.policy, found.max_seq_length,
                 fused_encoder)
        if own:
            step = pre.checkpoint_step
            mc.global_step = step if step is not None else int(pre.run.get("global_step", 0))
        return mc

    # ------------------------------------------------------------------ what fit asks of a head
    def _encode(self, questions):
        return encode_questions(questions, self.tokenizer, self.max_seq_length)

    def _training_data(self, questions):
        questions = as_questions(questions)
        unlabelled = next((q for q in questions if q.label is None), None)
        if unlabelled is not None:
            raise UserError(f"{unlabelled.where or 'question ' + unlabelled.guid}: a training question needs a label")
        return self._encode(questions), len(questions), questions_digest(questions)

    def _train_dataset(self, rows, global_batch, seed, buckets=False):  # a question's choices: no length buckets
        return choice_dataset(rows, self.max_seq_length, global_batch, training=True, seed=seed)

    def _as_dev(self, dev):
        return as_questions(dev)

    def _head_settings(self):
        return self.objective.settings()

    def _probe_batch(self, global_batch):
        choices = self.probe_choices
        features, labels = memory.classifier_batch(global_batch * choices, self.max_seq_length)
        return ({k: v.reshape(global_batch, choices, -1) for k, v in features.items()},
                labels[:global_batch])

    def _write_run(self, output_dir, step):
        run = {"kind": KIND, "task_type": self.objective.name, "labels": [],
               "do_lower_case": self.tokenizer.do_lower_case, "max_seq_length": self.max_seq_length,
               "global_step": step, "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        run_checkpoint.write_run_files(output_dir, run, self.config, self.tokenizer.vocab_file)

    def export(self, output_dir: str, format: str = "hf", precision: str = "float32") -> str:
        """Write the model as it is now to the new directory output_dir: "hf" (transformers'
        BertForMultipleChoice) or "google" (bert_model.ckpt, the head as output_weights [1, hidden]). Each
        reads back through `from_pretrained`."""
        return export.export_model(self.trained(), output_dir, format, precision)

    def trained(self) -> Trained:
        """The model as it is now (its head as a one-label classifier's), in the shape every export writes."""
        return Trained(KIND, self.config, self.tokenizer.vocab_file, self.tokenizer.do_lower_case,
                       model_weights(self.model), [], self.objective.name, self.max_seq_length)

    # ------------------------------------------------------------------ inference
    def scores(self, questions, batch_size: int = 8, verbose="auto", source="predict"):
        """(the questions, scores [questions, choices], padded choices -1e4) in input order."""
        questions = as_questions(questions)
        rows = self._encode(questions)
        scores, _ = self._window_logits(rows, lambda r, batch, multiple: choice_dataset(
            r, self.max_seq_length, batch, training=False, rows_multiple=multiple), batch_size, verbose, source)
        return questions, scores

    def predict(self, questions, batch_size: int = 8, verbose="auto") -> list:
        """Each question's choice, in input order: {"label" (its index), "answer" (its text), "probabilities"
        (over its choices)}."""
        questions, scores = self.scores(questions, batch_size, verbose)
        return chosen(questions, self.objective.predict(scores, [len(q.choices) for q in questions]))

    def evaluate(self, questions, batch_size: int = 8, verbose="auto") -> dict:
        """Accuracy and the mean loss over questions, as eval_<name>."""
        questions = as_questions(questions)
        if any(q.label is None for q in questions):
            raise UserError("evaluation questions need labels")
        questions, scores = self.scores(questions, batch_size, verbose, "eval")
        results = self.reader().evaluate(scores, [q.label for q in questions])
        return {**results, "global_step": self.global_step, "eval_examples": len(questions)}
