"""The notebook API for extractive question answering (SQuAD, CMRC 2018, DRCD) on every tower.

Example:
    import bert_mgpu
    train, _ = bert_mgpu.read_squad("data/squad/train-v1.1.json", training=True)
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained("model_dir", max_seq_length=384)
    qa.fit(train, output_dir="out", epochs=2, learning_rate=3e-5)
    qa.evaluate(bert_mgpu.read_squad("data/squad/dev-v1.1.json")[0])   # {"eval_exact_match", "eval_f1", ...}
    qa.predict([("Who wrote it?", "It was written by Ada Lovelace.")])  # [{"text": "Ada Lovelace", ...}]

`run_squad_mgpu.py` is a thin absl-flags wrapper over this class.
"""

import hashlib
import logging

import numpy as np

from bert_mgpu.api.fine_tuning import FineTuned
from bert_mgpu.api.opening import open_head
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.squad import Question, as_questions, metric_for  # noqa: F401 (as_questions, as before)
from bert_mgpu.data.squad_input import best_answers, best_of, make_windows, span_dataset
from bert_mgpu.io import export, run_checkpoint
from bert_mgpu.io.trained import Trained, model_weights
from bert_mgpu.model.modeling import build_span_model
from bert_mgpu.model.span_objectives import GOOGLE_HEAD, SpanExtraction
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory

log = logging.getLogger("bert_mgpu")
KIND = "question_answerer"  # bert_mgpu.json's kind


def questions_digest(questions):
    """sha256 of the questions, contexts and answers: a resumed run must train on the same data."""
    h = hashlib.sha256()
    for q in questions:
        h.update("\x00".join([q.qid, q.question, q.context, repr(q.answers), str(q.impossible)]).encode("utf-8"))
    return h.hexdigest()


class BertQuestionAnswerer(FineTuned):
    """A BERT span extractor (SQuAD) trained on every tower: a start and an end score on each position.

    `fit` trains as `BertClassifier.fit` does (evaluation while training, the best model by F1, early
    stopping, resume); `evaluate` gives the official exact match and F1 (SQuAD's, or CMRC 2018's for
    Chinese); `predict` gives each question's answer with its character offsets in the context.

    Args:
        model: the Keras model (`build_span_model`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: WordPieces a window holds.
        fused_encoder: whether `model` runs the fused encoder.
        doc_stride, max_query_length, n_best_size, max_answer_length, version_2_with_negative,
        null_score_diff_threshold: run_squad's flags of those names.

    Example:
        qa = bert_mgpu.BertQuestionAnswerer.from_pretrained("model_dir")
        qa.predict([("Where?", "In Paris.")])  # [{"text": "Paris", "start": 3, "end": 8, "probability": ...}]
    """

    unit = "windows"

    def __init__(self, model, tokenizer, config, towers, policy, max_seq_length=384, fused_encoder=True,
                 doc_stride=128, max_query_length=64, n_best_size=20, max_answer_length=30,
                 version_2_with_negative=False, null_score_diff_threshold=0.0):
        super().__init__(model, tokenizer, [], config, towers, policy, max_seq_length, SpanExtraction(),
                         fused_encoder)
        self.doc_stride, self.max_query_length = doc_stride, max_query_length
        self.n_best_size, self.max_answer_length = n_best_size, max_answer_length
        self.version_2_with_negative = version_2_with_negative
        if not np.isfinite(null_score_diff_threshold):  # nan compares false: every question would be answered
            raise UserError(f"--null_score_diff_threshold={null_score_diff_threshold}: must be a finite number")
        self.null_score_diff_threshold = null_score_diff_threshold
        self.metric = None  # "squad" or "cmrc"; None: told from the evaluation data
        self.answers = None  # the last evaluation's `Answers` (predictions, n-best, null odds)

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, towers: Towers | None = None, precision: str = "auto",
                        max_seq_length: int | None = None, do_lower_case: bool | None = None,
                        bert_config_file: str | None = None, vocab_file: str | None = None,
                        fused_encoder: bool = True, **flags) -> "BertQuestionAnswerer":
        """A question answerer from any checkpoint bert_mgpu reads; the head is its own when the checkpoint
        has one (a bert_mgpu run, google-bert run_squad's cls/squad/, transformers' BertForQuestionAnswering),
        else fresh. `flags`: doc_stride, max_query_length, ... (default: the run's own, else run_squad's)."""
        found = open_head(KIND, init_checkpoint, lambda config, policy: build_span_model(
            config, policy, fused=fused_encoder), max_seq_length, 384, towers, precision, do_lower_case,
            bert_config_file, vocab_file)
        opened, model, own, pre = found.opened, found.model, found.own, found.opened.pretrained
        facts = found.run.get("squad", {})
        unused = [n for n in found.unused if n not in GOOGLE_HEAD]
        if unused:
            log.info("not used by a question answerer: %s", ", ".join(unused))
        if own:
            run_checkpoint.restore_head(model, pre.ckpt_prefix)
            log.info("span head restored from %s", pre.ckpt_prefix)
        elif opened.has_weights and all(n in pre.weights for n in GOOGLE_HEAD):
            model.head.kernel.assign(pre.weights[GOOGLE_HEAD[0]].T)
            model.head.bias.assign(pre.weights[GOOGLE_HEAD[1]])
            log.info("span head loaded from %s", init_checkpoint)
        else:
            log.info("span head is freshly initialized")
        for name, value in flags.items():  # a setting given that is not the one the run was trained with
            if own and value is not None and name in facts and facts[name] != value:
                log.warning("--%s=%s: %s was trained with %s; using %s", name, value, init_checkpoint, facts[name],
                            value)
        settings = {k: v for k, v in {**facts, **flags}.items() if v is not None}
        qa = cls(model, opened.tokenizer, opened.config, opened.towers, opened.policy, found.max_seq_length,
                 fused_encoder, **settings)
        if own:
            step = pre.checkpoint_step
            qa.global_step = step if step is not None else int(pre.run.get("global_step", 0))
        return qa

    def _facts(self):
        """run_squad's settings of this model, kept in bert_mgpu.json and read back by from_pretrained."""
        return {"doc_stride": self.doc_stride, "max_query_length": self.max_query_length,
                "n_best_size": self.n_best_size, "max_answer_length": self.max_answer_length,
                "version_2_with_negative": self.version_2_with_negative,
                "null_score_diff_threshold": self.null_score_diff_threshold}

    # ------------------------------------------------------------------ what fit asks of a head
    def _windows(self, questions):
        return make_windows(questions, self.tokenizer, self.max_seq_length, self.max_query_length, self.doc_stride)

    def _training_data(self, questions):
        questions = as_questions(questions)
        if any(q.answer is None and not q.impossible for q in questions):
            raise UserError("training questions need an answer (or is_impossible, with version_2_with_negative)")
        if any(q.impossible for q in questions) and not self.version_2_with_negative:
            raise UserError("training questions marked is_impossible: set version_2_with_negative")
        windows, _ = self._windows(questions)
        return windows, len(windows), questions_digest(questions)

    def _train_dataset(self, windows, global_batch, seed, buckets=False):
        return span_dataset(windows, self.tokenizer, self.max_seq_length, global_batch, training=True, seed=seed,
                            buckets=buckets)

    def _as_dev(self, dev):
        return as_questions(dev)

    def _head_settings(self):
        return {**self.objective.settings(), "doc_stride": self.doc_stride, "max_query_length": self.max_query_length,
                "version_2_with_negative": self.version_2_with_negative}

    def _probe_batch(self, global_batch):
        features, _ = memory.classifier_batch(global_batch, self.max_seq_length)
        return features, np.zeros((global_batch, 2), np.int32)

    def _write_run(self, output_dir, step):
        run = {"kind": KIND, "task_type": self.objective.name, "labels": [],
               "do_lower_case": self.tokenizer.do_lower_case, "max_seq_length": self.max_seq_length,
               "squad": self._facts(), "global_step": step, "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        run_checkpoint.write_run_files(output_dir, run, self.config, self.tokenizer.vocab_file)

    def export(self, output_dir: str, format: str = "saved_model", precision: str = "float32") -> str:
        """Write the model as it is now to the new directory output_dir: "saved_model" (TensorFlow Serving,
        a question and a context as raw strings in, the answer out), "hf" (transformers'
        BertForQuestionAnswering) or "google" (run_squad's cls/squad/ head). Each reads back through
        `from_pretrained`."""
        return export.export_model(self.trained(), output_dir, format, precision)

    def trained(self) -> Trained:
        """The question answerer as it is now (its head under run_squad's names, its settings as facts), in
        the shape every export writes."""
        return Trained(KIND, self.config, self.tokenizer.vocab_file, self.tokenizer.do_lower_case,
                       model_weights(self.model, GOOGLE_HEAD), [], self.objective.name, self.max_seq_length,
                       facts=self._facts())

    # ------------------------------------------------------------------ inference
    def logits(self, questions, batch_size: int = 8, verbose="auto", source="predict"):
        """(windows, contexts, start and end scores [windows, positions, 2])."""
        windows, cut = self._windows(questions)
        logits, _ = self._window_logits(windows, lambda rows, batch, multiple: span_dataset(
            rows, self.tokenizer, self.max_seq_length, batch, training=False, rows_multiple=multiple), batch_size,
            verbose, source)
        return windows, cut, logits

    def answer(self, questions, batch_size: int = 8, verbose="auto", source="predict"):
        """Every question's answers as run_squad writes them (data/squad_input.Answers)."""
        questions = as_questions(questions)
        windows, cut, logits = self.logits(questions, batch_size, verbose, source)
        return best_answers(questions, windows, logits, cut, self.n_best_size, self.max_answer_length,
                            self.version_2_with_negative, self.null_score_diff_threshold)

    def predict(self, questions, batch_size: int = 8, verbose="auto") -> list:
        """Each question's best answer, in input order: {"text", "start", "end" (character offsets in the
        context, end exclusive), "probability"}; a v2 model's no-answer has text "" and no offsets.
        `questions`: (question, context) pairs, `Question`s or Hugging Face squad rows."""
        questions = as_questions(questions)
        return best_of(questions, self.answer(questions, batch_size, verbose))

    def _reading(self):
        return {"metric": self.metric or "squad", "version_2_with_negative": self.version_2_with_negative}

    def evaluate(self, questions, batch_size: int = 8, verbose="auto") -> dict:
        """The official scores (`self.metric`, else told from the data: SQuAD's or CMRC 2018's) and the mean
        loss over windows, as eval_<name>; keeps the answers in `self.answers`."""
        questions = as_questions(questions)
        if all(not q.answers and not q.impossible for q in questions):
            raise UserError("evaluation questions need answers")
        windows, cut, logits = self.logits(questions, batch_size, verbose, "eval")
        self.answers = best_answers(questions, windows, logits, cut, self.n_best_size, self.max_answer_length,
                                    self.version_2_with_negative, self.null_score_diff_threshold)
        gold = {q.qid: [] if q.impossible else [text for text, _ in q.answers] for q in questions}
        results = self.reader(metric=self.metric or metric_for(questions)).evaluate(self.answers, gold)
        return {**results, "eval_loss": _window_loss(windows, logits),
                "global_step": self.global_step, "eval_examples": len(questions)}


def _window_loss(windows, logits):
    """Mean over windows of run_squad's loss against each window's label (the first answer's ends, or 0)."""
    total = 0.0
    for window, scores in zip(windows, logits):
        scores = np.asarray(scores[:len(window.token_ids)], np.float64)
        top = scores.max(0)
        log_z = np.log(np.exp(scores - top).sum(0)) + top
        total += ((log_z[0] - scores[window.start, 0]) + (log_z[1] - scores[window.end, 1])) / 2
    return float(total / max(len(windows), 1))
