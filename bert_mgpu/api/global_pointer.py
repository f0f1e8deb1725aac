"""The notebook API for GlobalPointer NER (model/global_pointer.py): every span of every entity type scored,
so entities may nest or overlap, trained on every tower.

Example:
    import bert_mgpu
    train = bert_mgpu.read_spans("data/cluener/train.json")                  # [SpanSentence]
    gp = bert_mgpu.BertGlobalPointer.from_pretrained("model_dir", types=bert_mgpu.entity_types(train))
    gp.fit(train, output_dir="out", epochs=3, dev=bert_mgpu.read_spans("data/cluener/dev.json"))
    gp.evaluate(dev)["eval_f1"]                                               # exact type and boundaries
    gp.predict(["张三在北京大学工作"])  # [[{"type": "PER", "text": "张三", "start": 0, "end": 2}, ...]]

`run_global_pointer_mgpu.py` is a thin absl-flags wrapper over this class.
"""

import hashlib
import logging
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from bert_mgpu.api.fine_tuning import FineTuned
from bert_mgpu.api.opening import open_head
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.inputs import check_text, rows_of
from bert_mgpu.data.span_input import span_dataset
from bert_mgpu.data.spans import as_span_sentences, by_position, entity_offsets, span_windows, window_entities
from bert_mgpu.data.words import split_words
from bert_mgpu.io import export, run_checkpoint
from bert_mgpu.io.trained import Trained, model_weights
from bert_mgpu.model.global_pointer import MASKED, build_global_pointer
from bert_mgpu.model.global_pointer_objective import GlobalPointerObjective, multilabel_crossentropy, span_targets
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import memory

log = logging.getLogger("bert_mgpu")
KIND = "global_pointer"  # bert_mgpu.json's kind
HEAD_SIZE = 64  # bert4keras' default: each type's query and key width
SCORES_IN_MEMORY = 2**25  # span scores a prediction holds at once (128 MB of float32): windows go in chunks


def spans_digest(sentences):
    """sha256 of the sentences' tokens and entities: a resumed run must train on the same data."""
    h = hashlib.sha256()
    for s in sentences:
        h.update("\x00".join(s.tokens).encode("utf-8") + b"\x01" + repr(s.entities).encode("utf-8") + b"\x02")
    return h.hexdigest()


class BertGlobalPointer(FineTuned):
    """A BERT GlobalPointer (Su 2021, bert4keras'): each entity type scores every span of a window, a span
    above 0 is an entity, so entities may nest or overlap and no tag sequence is decoded.

    Build it with `from_pretrained`; `fit` fine-tunes and resumes as `BertTagger.fit` does (evaluation while
    training, the best model by entity F1, early stopping); `evaluate` gives entity precision, recall and F1
    (exact type and boundaries) and the loss; `predict` gives each text's entities. Long sentences are read
    in the tagger's windows, `doc_stride` apart.

    Args:
        model: the Keras model (`build_global_pointer`), built under `towers.strategy`.
        tokenizer: a `FullTokenizer`.
        types: the entity types, in the order of the scores.
        config: the `BertConfig`.
        towers: the `Towers` it runs on.
        policy: the Keras dtype policy it computes in.
        max_seq_length: WordPieces a window holds, [CLS] and [SEP] included.
        fused_encoder: whether `model` runs the fused encoder.
        doc_stride: WordPieces between the starts of a long sentence's windows (None: half a window).

    Example:
        gp = bert_mgpu.BertGlobalPointer.from_pretrained("model_dir", types=["LOC", "ORG"])
        gp.fit([(["Bank", "of", "China"], [("ORG", 0, 3), ("LOC", 2, 3)])], output_dir="out", epochs=1)
    """

    unit = "windows"

    def __init__(self, model, tokenizer, types, config, towers, policy, max_seq_length, fused_encoder=True,
                 doc_stride=None):
        super().__init__(model, tokenizer, types, config, towers, policy, max_seq_length, GlobalPointerObjective(),
                         fused_encoder)
        self.doc_stride, self.head_size = doc_stride, model.head_size

    @classmethod
    def from_pretrained(cls, init_checkpoint: str, types: Sequence[str] | None = None, towers: Towers | None = None,
                        precision: str = "auto", max_seq_length: int | None = None,
                        do_lower_case: bool | None = None, bert_config_file: str | None = None,
                        vocab_file: str | None = None, fused_encoder: bool = True, doc_stride: int | None = None,
                        head_size: int | None = None) -> "BertGlobalPointer":
        """A GlobalPointer from any checkpoint bert_mgpu reads; the head is fresh unless the checkpoint holds
        one for the same types (a bert_mgpu GlobalPointer run, its google export). max_seq_length and
        doc_stride: the windows (default: the run's own, else 128 and half a window); head_size: each type's
        query and key width (default: the checkpoint's, else 64)."""
        opening = open_head(KIND, init_checkpoint, None, max_seq_length, towers=towers, precision=precision,
                            do_lower_case=do_lower_case, bert_config_file=bert_config_file, vocab_file=vocab_file)
        opened, own, run, pre = opening.opened, opening.own, opening.run, opening.opened.pretrained
        types = list(types or (run.get("labels") if own else pre.labels) or [])
        if not types:
            raise UserError("no entity types: give them (from the training data, or --labels)")
        twice = sorted({t for t in types if types.count(t) > 1})
        if twice:
            raise UserError(f"--labels names {', '.join(twice)} more than once: {','.join(types)}")
        head = pre.weights.get("output_weights") if opened.has_weights and not own else None
        found = None  # the head size of a google export's head for these types
        if head is not None and list(pre.labels or []) == types and head.shape[0] % (2 * len(types)) == 0:
            found = head.shape[0] // (2 * len(types))
        head_size = int(head_size or (run.get("head_size") if own else found) or HEAD_SIZE)
        model = opening.build(lambda config, policy: build_global_pointer(config, len(types), head_size, policy,
                                                                          fused=fused_encoder))
        if own and run.get("labels") == types and run.get("head_size") == head_size:
            run_checkpoint.restore_head(model, pre.ckpt_prefix)
            log.info("GlobalPointer head restored from %s", pre.ckpt_prefix)
        elif found == head_size:
            model.head.kernel.assign(head.T)
            model.head.bias.assign(pre.weights["output_bias"])
            log.info("GlobalPointer head loaded from %s", init_checkpoint)
        else:
            log.info("GlobalPointer head (%d types, head size %d) is freshly initialized", len(types), head_size)
        gp = cls(model, opened.tokenizer, types, opened.config, opened.towers, opened.policy, opening.max_seq_length,
                 fused_encoder, doc_stride if doc_stride is not None else run.get("doc_stride") if own else None)
        if own:
            step = pre.checkpoint_step
            gp.global_step = step if step is not None else int(run.get("global_step", 0))
        return gp

    # ------------------------------------------------------------------ what fit asks of a head
    def _windows(self, sentences):
        return span_windows(sentences, self.tokenizer, self.labels, self.max_seq_length, self.doc_stride)

    def _training_data(self, sentences):
        sentences = as_span_sentences(sentences)
        bare = next((s for s in sentences if s.entities is None), None)
        if bare is not None:
            raise UserError(f"training sentence {bare.guid} has no entities (give [] for a sentence with none)")
        unknown = sorted({k for s in sentences for k, _, _ in s.entities} - set(self.labels))
        if unknown:
            raise UserError(f"training entities of type {', '.join(unknown)}, which the model has no output for "
                            f"({', '.join(self.labels)})")
        windows, entities = self._windows(sentences)
        return (windows, entities), len(windows), spans_digest(sentences)

    def _train_dataset(self, data, global_batch, seed, buckets=False):
        return span_dataset(*data, self.tokenizer, self.max_seq_length, global_batch, training=True, seed=seed,
                            buckets=buckets)

    def _rows_dataset(self, data, global_batch, rows_multiple):
        return span_dataset(*data, self.tokenizer, self.max_seq_length, global_batch, training=False,
                            rows_multiple=rows_multiple)

    def _as_dev(self, dev):
        return as_span_sentences(dev)

    def _head_settings(self):
        return {**self.objective.settings(), "doc_stride": self._stride(), "head_size": self.head_size}

    def _stride(self):
        return self.doc_stride if self.doc_stride is not None else (self.max_seq_length - 2) // 2

    def _probe_batch(self, global_batch):
        features, _ = memory.classifier_batch(global_batch, self.max_seq_length)
        return features, np.full((global_batch, 1, 3), -1, np.int32)

    def _reading(self):
        return {"types": tuple(self.labels)}

    def _write_run(self, output_dir, step):
        run = {"kind": KIND, "task_type": self.objective.name, "labels": self.labels, "head_size": self.head_size,
               "do_lower_case": self.tokenizer.do_lower_case, "max_seq_length": self.max_seq_length,
               "doc_stride": self._stride(), "global_step": step, "settings": self.settings,
               **({"train_config": self.train_config.as_dict()} if self.train_config else {})}
        run_checkpoint.write_run_files(output_dir, run, self.config, self.tokenizer.vocab_file)

    def export(self, output_dir: str, format: str = "google", precision: str = "float32") -> str:
        """Write the model as it is now to the new directory output_dir as "google" (bert_model.ckpt, the
        head's dense layer as output_weights/output_bias, the types as id2label), which reads back through
        `from_pretrained`."""
        return export.export_model(self.trained(), output_dir, format, precision)

    def trained(self) -> Trained:
        """The model as it is now, in the shape every export writes."""
        return Trained(KIND, self.config, self.tokenizer.vocab_file, self.tokenizer.do_lower_case,
                       model_weights(self.model), list(self.labels), self.objective.name, self.max_seq_length,
                       facts={"doc_stride": self._stride(), "head_size": self.head_size})

    # ------------------------------------------------------------------ inference
    def _entities(self, sentences, batch_size, verbose, source):
        """(each sentence's {(type index, first word, end word)}, the mean loss over windows and types for an
        evaluation, else None), the windows scored in chunks so that their span scores stay within
        SCORES_IN_MEMORY."""
        windows, entities = self._windows(sentences)
        chunk = max(8 * self.towers.count, SCORES_IN_MEMORY // (len(self.labels) * self.max_seq_length ** 2))
        found, losses = [set() for _ in sentences], []
        for begin in range(0, len(windows), chunk):
            rows = slice(begin, begin + chunk)
            scores, labels = self._window_logits(
                windows[rows], lambda w, batch, multiple, labels=entities[rows]: span_dataset(
                    w, labels, self.tokenizer, self.max_seq_length, batch, training=False, rows_multiple=multiple),
                batch_size, verbose if len(windows) <= chunk else False, source)
            window_entities(windows[rows], scores, len(sentences), found)
            if source == "eval":  # a prediction has no entities to score against
                losses.append(self._loss(scores, labels, [len(w.token_ids) for w in windows[rows]]))
        if not losses:
            return found, None
        return found, float(np.average([value for value, _ in losses], weights=[n for _, n in losses]))

    def _loss(self, scores, labels, lengths):
        """(the objective's loss over these windows, their count), in float32 on the host; the positions past a
        window's own length (its batch's padding, and the prediction's, which pads scores with 0) masked."""
        real = np.arange(scores.shape[-1])[None, :] < np.asarray(lengths)[:, None]
        scores = np.where(real[:, None, :, None] & real[:, None, None, :], scores, MASKED)
        targets = span_targets(labels, scores.shape)
        width = scores.shape[-1]
        per = multilabel_crossentropy(tf.reshape(targets, [-1, width * width]), tf.reshape(scores, [-1, width * width]))
        return float(tf.reduce_mean(per)), len(scores)

    def predict_entities(self, sentences, batch_size: int = 8, verbose="auto") -> list:
        """Each sentence's entities [(type, first token, end token exclusive)], by position (`as_span_sentences`
        inputs: raw texts are cut into words)."""
        sentences = as_span_sentences(sentences)
        found, _ = self._entities(sentences, batch_size, verbose, "predict")
        return by_position(found, self.labels)

    def predict(self, texts, batch_size: int = 8, verbose="auto") -> list:
        """Each input's entities, in input order: [{"type", "text", "start", "end"}] a text, nested ones
        included. For a raw string, start and end are character offsets into it (end exclusive); for a list of
        tokens, token indices and the text is the tokens joined by a space."""
        rows = [r["tokens"] if isinstance(r, dict) and "tokens" in r else r.get("text") if isinstance(r, dict)
                else r for r in rows_of(texts)]
        for i, row in enumerate(rows):
            if isinstance(row, str):
                check_text(row, f"input {i}")
            elif not isinstance(row, list | tuple):
                raise UserError(f"input {i}: expected a text or a list of tokens, not {type(row).__name__}")
        words = [split_words(r) if isinstance(r, str) else None for r in rows]
        found = self.predict_entities([[w for w, _, _ in split] if split is not None else list(r)
                                       for split, r in zip(words, rows)], batch_size, verbose)
        return entity_offsets(rows, words, found)

    def evaluate(self, sentences, batch_size: int = 8, verbose="auto") -> dict:
        """Entity precision, recall and F1 (micro; an entity counts when its type and both ends are right,
        nested ones each on its own) and the loss, as eval_<name>; sets `self.report` ({type: (precision,
        recall, F1, support)})."""
        sentences = as_span_sentences(sentences)
        if any(s.entities is None for s in sentences):
            raise UserError("evaluation sentences need their entities")
        found, loss = self._entities(sentences, batch_size, verbose, "eval")
        results = self.reader().evaluate(by_position(found, self.labels), [s.entities for s in sentences])
        self.report = results.report
        return {**results, "eval_loss": loss, "global_step": self.global_step, "eval_examples": len(sentences)}
