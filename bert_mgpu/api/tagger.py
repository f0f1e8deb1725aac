"""The notebook API for token classification (NER): a label a word, entities out, on every tower.

Example:
    import bert_mgpu
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    train = bert_mgpu.read_tagged("data/msra/train.txt")                     # [Sentence]
    tagger = bert_mgpu.BertTagger.from_pretrained("model_dir", labels=bert_mgpu.tag_set(train), towers=towers)
    tagger.fit(train, output_dir="out", epochs=3, dev=bert_mgpu.read_tagged("data/msra/dev.txt"))
    tagger.evaluate(dev)["eval_f1"]                                           # entity-level, conlleval's rules
    tagger.predict(["张三在北京工作"])  # [[{"type": "PER", "text": "张三", "start": 0, "end": 2}, ...]]

`run_ner_mgpu.py` is a thin absl-flags wrapper over this class.
"""

import hashlib
import logging
from collections.abc import Sequence

import numpy as np

from bert_mgpu.api.fine_tuning import FineTuned
from bert_mgpu.api.opening import open_head
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.inputs import check_text, rows_of
from bert_mgpu.data.tagged import Sentence, as_sentences
from bert_mgpu.data.tagging_input import make_windows, split_words, tagging_dataset, word_predictions
from bert_mgpu.data.words import entity_dicts
from bert_mgpu.io import export, run_checkpoint
from bert_mgpu.io.heads import CRF_WEIGHT  # the CRF's transitions under Google's names (a google export holds them)
from bert_mgpu.io.trained import Trained, model_weights
from bert_mgpu.model.modeling import build_tagger, head_variables
from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory

log = logging.getLogger("bert_mgpu")


def sentences_digest(sentences):
    """sha256 of the sentences' tokens and tags: a resumed run must train on the same data."""
    h = hashlib.sha256()
    for s in sentences:
        h.update("\x00".join(s.tokens).encode("utf-8") + b"\x01" + "\x00".join(s.tags or ()).encode("utf-8") + b"\x02")
    return h.hexdigest()


def masked_loss(logits, labels):
    """Mean cross-entropy over the labelled positions (labels >= 0) of [N, width, C] logits, in numpy."""
    real = labels >= 0
    if not real.any():
        return 0.0
    chosen = logits[real]
    top = chosen.max(-1, keepdims=True)
    log_z = np.log(np.exp(chosen - top).sum(-1)) + top[:, 0]
    return float(np.mean(log_z - chosen[np.arange(len(chosen)), labels[real]]))


class BertTagger(FineTuned):
    """A BERT token classifier (NER) trained on every tower: a label on each word's first WordPiece.

    Build it with `from_pretrained`; `fit` fine-tunes and resumes as `BertClassifier.fit` does (evaluation
    while training, the best model by entity F1, early stopping); `evaluate` gives entity-level precision,
    recall and F1 (conlleval's rules) and token accuracy; `predict` gives each text's entities. Sentences
    longer than a window are read in windows `doc_stride` apart, each word predicted where it has most
    context, never cut short.

    Args:
        model: the Keras model (`build_tagger`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        labels: the tags, in the order of the logits ("O" first).
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: WordPieces a window holds, [CLS] and [SEP] included.
        fused_encoder: whether `model` runs the fused encoder.
        doc_stride: WordPieces between the starts of a long sentence's windows (None: half a window).

    Example:
        tagger = bert_mgpu.BertTagger.from_pretrained("model_dir", labels=["O", "B-PER", "I-PER"])
        tagger.fit([(["John", "runs"], ["B-PER", "O"])], output_dir="out", epochs=1)
        tagger.predict(["John runs"])  # [[{"type": "PER", "text": "John", "start": 0, "end": 4}]]
    """

    unit = "windows"

    def __init__(self, model, tokenizer, labels, config, towers, policy, max_seq_length, fused_encoder=True,
                 doc_stride=None):
        super().__init__(model, tokenizer, labels, config, towers, policy, max_seq_length,
                         CRFTagging() if model.crf is not None else TokenClassification(), fused_encoder)
        self.doc_stride = doc_stride

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, labels: Sequence[str] | None = None, towers: Towers | None = None,
                        precision: str = "auto", max_seq_length: int | None = None,
                        do_lower_case: bool | None = None, bert_config_file: str | None = None,
                        vocab_file: str | None = None, fused_encoder: bool = True,
                        doc_stride: int | None = None, crf: bool | None = None) -> "BertTagger":
        """A tagger from any checkpoint bert_mgpu reads; the head is fresh unless the checkpoint holds a
        tagger's head for the same tags (a bert_mgpu tagger run, a Hugging Face BertForTokenClassification).
        max_seq_length and doc_stride: the windows (default: a tagger run's own, else 128 and half a window).
        crf: a CRF over the scores (crf.py; default: whether the checkpoint has one)."""
        opening = open_head("tagger", init_checkpoint, None, max_seq_length, towers=towers, precision=precision,
                            do_lower_case=do_lower_case, bert_config_file=bert_config_file, vocab_file=vocab_file)
        opened, own, max_seq_length = opening.opened, opening.own, opening.max_seq_length
        pre = opened.pretrained
        run = opening.run
        labels = list(labels or (run.get("labels") if own else pre.labels) or [])
        if not labels:
            raise UserError("no labels: give the tags (from the training data, or --labels)")
        twice = sorted({tag for tag in labels if labels.count(tag) > 1})
        if twice:  # a head of one output more than the tags it can name
            raise UserError(f"--labels names {', '.join(twice)} more than once: {','.join(labels)}")
        if crf is None:
            crf = bool(run.get("crf")) if own else CRF_WEIGHT in pre.weights
        model = opening.build(lambda config, policy: build_tagger(config, len(labels), policy,
                                                                  fused=fused_encoder, crf=crf))
        unused = [name for name in opening.unused if not (crf and name == CRF_WEIGHT)]
        if unused:
            log.info("not used by a tagger: %s", ", ".join(unused))
        head = pre.weights.get("output_weights") if opened.has_weights and not own else None
        if own and run.get("labels") == labels and bool(run.get("crf")) == crf:
            run_checkpoint.restore_head(model, pre.ckpt_prefix)
            log.info("tagger head restored from %s", pre.ckpt_prefix)
        elif head is not None and list(pre.labels or []) == labels and head.T.shape == tuple(model.head.kernel.shape):
            model.head.kernel.assign(head.T)
            model.head.bias.assign(pre.weights["output_bias"])
            if crf and CRF_WEIGHT in pre.weights:
                model.crf.transitions.assign(pre.weights[CRF_WEIGHT])
            log.info("tagger head loaded from %s", init_checkpoint)
        else:
            log.info("tagger head (%d tags) is freshly initialized", len(labels))
        tagger = cls(model, opened.tokenizer, labels, opened.config, opened.towers, opened.policy, max_seq_length,
                     fused_encoder, doc_stride if doc_stride is not None else run.get("doc_stride") if own else None)
        if own:
            step = pre.checkpoint_step
            tagger.global_step = step if step is not None else int(run.get("global_step", 0))
        return tagger

    # ------------------------------------------------------------------ what fit asks of a head
    def _windows(self, sentences, untagged=TokenClassification.IGNORED):
        return make_windows(sentences, self.tokenizer, self.labels, self.max_seq_length, self.doc_stride, untagged)

    def _training_data(self, sentences):
        sentences = as_sentences(sentences, split_words)
        untagged = next((s for s in sentences if s.tags is None), None)
        if untagged is not None:
            raise UserError(f"training sentence {untagged.guid} has no tags")
        sentences = self._with_unlabelled(sentences)
        windows = self._windows(sentences, TokenClassification.UNTAGGED)  # only a Distiller's unlabelled text
        return windows, len(windows), sentences_digest(sentences)

    def unlabelled_rows(self, rows):
        out = []
        for i, s in enumerate(as_sentences(rows, split_words)):
            if s.tags is not None:
                raise UserError(f"unlabeled sentence {s.guid} has tags: tagged sentences are fit's")
            out.append(Sentence(f"unlabeled-{i}", s.tokens, None, 0))
        return out

    def with_encoder(self, config):
        with self.towers.strategy.scope():
            model = build_tagger(config, len(self.labels), self.policy, fused=self.fused_encoder,
                                 crf=self.model.crf is not None)
        return BertTagger(model, self.tokenizer, self.labels, config, self.towers, self.policy, self.max_seq_length,
                          self.fused_encoder, self.doc_stride)

    def _label_counts(self, windows):
        """Each tag's count over the tokens the loss reads: a word in two windows counts twice, as it trains."""
        return np.bincount([t for w in windows for t in w.labels if t >= 0], minlength=len(self.labels))

    def _train_dataset(self, windows, global_batch, seed, buckets=False):
        return tagging_dataset(windows, self.tokenizer, self.max_seq_length, global_batch, training=True, seed=seed,
                               buckets=buckets)

    def _rows_dataset(self, windows, global_batch, rows_multiple):
        return tagging_dataset(windows, self.tokenizer, self.max_seq_length, global_batch, training=False,
                               rows_multiple=rows_multiple)

    def _as_dev(self, dev):
        return as_sentences(dev, split_words)

    def _head_settings(self):
        return {**self.objective.settings(), "doc_stride": self._stride()}

    def _stride(self):
        return self.doc_stride if self.doc_stride is not None else (self.max_seq_length - 2) // 2

    def _probe_batch(self, global_batch):
        features, _ = memory.classifier_batch(global_batch, self.max_seq_length)
        return features, np.zeros((global_batch, self.max_seq_length), np.int32)

    def _write_run(self, output_dir, step):
        run = {"kind": "tagger", "task_type": self.objective.name, "labels": self.labels,
               "crf": isinstance(self.objective, CRFTagging),
               "do_lower_case": self.tokenizer.do_lower_case, "max_seq_length": self.max_seq_length,
               "doc_stride": self._stride(), "global_step": step, "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        run_checkpoint.write_run_files(output_dir, run, self.config, self.tokenizer.vocab_file)

    def export(self, output_dir: str, format: str = "saved_model", precision: str = "float32") -> str:
        """Write the model as it is now to the new directory output_dir: "saved_model" (TensorFlow Serving:
        raw text in, each word's tag and the entities with character offsets out; `precision` its compute
        dtype), "hf" (transformers' BertForTokenClassification, id2label) or "google" (bert_model.ckpt, with a
        CRF's crf/transitions). Each reads back through `from_pretrained`."""
        return export.export_model(self.trained(), output_dir, format, precision)

    def trained(self) -> Trained:
        """The tagger as it is now (a CRF's transitions under Google's name), in the shape every export
        writes."""
        weights = model_weights(self.model)
        transitions = head_variables(self.model).get("transitions")
        if transitions is not None:
            weights[CRF_WEIGHT] = np.asarray(transitions.numpy(), np.float32)
        return Trained("tagger", self.config, self.tokenizer.vocab_file, self.tokenizer.do_lower_case,
                       weights, list(self.labels), self.objective.name, self.max_seq_length,
                       facts={"doc_stride": self._stride()})

    # ------------------------------------------------------------------ inference
    def _tag_ids(self, sentences, batch_size, verbose, source):
        """(label ids per word of each sentence, mean loss over the labelled pieces)."""
        windows = self._windows(sentences)
        logits, labels = self._window_logits(windows, lambda rows, batch, multiple: tagging_dataset(
            rows, self.tokenizer, self.max_seq_length, batch, training=False, rows_multiple=multiple), batch_size,
            verbose, source)
        ids = word_predictions(windows, logits, [len(s.tokens) for s in sentences], self.objective.decoder(self.model))
        return ids, masked_loss(logits, labels)

    def predict_tags(self, sentences, batch_size: int = 8, verbose="auto") -> list:
        """Each sentence's tags, a word each (`as_sentences` inputs: raw texts are cut into words)."""
        sentences = as_sentences(sentences, split_words)
        ids, _ = self._tag_ids(sentences, batch_size, verbose, "predict")
        return [[self.labels[i] for i in row] for row in ids]

    def predict(self, texts, batch_size: int = 8, verbose="auto") -> list:
        """Each input's entities, in input order: [{"type", "text", "start", "end"}] a text. For a raw string,
        start and end are character offsets into it (end exclusive); for a list of tokens, token indices and
        the text is the tokens joined by a space."""
        rows = [r["tokens"] if isinstance(r, dict) and "tokens" in r else r.get("text") if isinstance(r, dict)
                else r for r in rows_of(texts)]  # a DataFrame's rows: its "tokens" or "text" column
        for i, row in enumerate(rows):
            if isinstance(row, str):
                check_text(row, f"input {i}")
            elif not isinstance(row, list | tuple):
                raise UserError(f"input {i}: expected a text or a list of tokens, not {type(row).__name__}")
        words = [split_words(r) if isinstance(r, str) else None for r in rows]
        tags = self.predict_tags([[w for w, _, _ in found] if found is not None else r
                                  for found, r in zip(words, rows)], batch_size, verbose)
        return [entity_dicts(row, found, sequence) for row, found, sequence in zip(rows, words, tags)]

    def evaluate(self, sentences, batch_size: int = 8, verbose="auto") -> dict:
        """Entity-level micro precision, recall and F1 (conlleval's rules), token accuracy over words and the
        loss over labelled pieces, as eval_<name>; sets `self.report` ({type: (precision, recall, F1,
        support)})."""
        sentences = as_sentences(sentences, split_words)
        if any(s.tags is None for s in sentences):
            raise UserError("evaluation sentences need tags")
        ids, loss = self._tag_ids(sentences, batch_size, verbose, "eval")
        results = self.reader().evaluate([[self.labels[i] for i in row] for row in ids], [s.tags for s in sentences])
        self.report = results.report
        return {**results, "eval_loss": loss, "global_step": self.global_step, "eval_examples": len(sentences)}

