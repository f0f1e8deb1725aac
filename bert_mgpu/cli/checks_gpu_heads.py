"""`make gpu-check`'s heads check (checks_gpu.heads_mixed_float16), on its own: every head kind and every trick
that changes the tower step, trained in mixed_float16 on every tower of the process's GPUs (CPU towers in the
tests), with what each must show after a few steps."""

import dataclasses

import numpy as np
import tensorflow as tf

from bert_mgpu.cli.check_models import bert_config, random_batches, towers_differ
from bert_mgpu.io.heads import HEADS
from bert_mgpu.model import lora, modeling
from bert_mgpu.model.adversarial import with_adversarial
from bert_mgpu.model.choice_objectives import MultipleChoice
from bert_mgpu.model.distillation import CACHED, Intermediate, with_teacher
from bert_mgpu.model.objectives import Classification
from bert_mgpu.model.span_objectives import SpanExtraction
from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification
from bert_mgpu.train import optimization, training


def run(setup, steps=3):
    """run_ner_mgpu.py --crf, run_squad_mgpu.py and run_multiple_choice_mgpu.py in mixed_float16: a token head
    with the CRF's float32 transitions (labels on every other position, -1 on the rest), the span head (start
    and end labels) and the choice head (4 choices a question, the last one padding on odd questions); then
    run_distill_ner_mgpu.py's step (a 1-layer tagger taught by a frozen 2-layer one, a row of unlabelled words,
    the hidden-state and attention losses too), --teacher_logits' (a classifier student taught by outputs the
    batch carries, no teacher run), --ema_decay's (a classifier's moving averages updated on each
    GPU after its step), --adversarial=pgd's (2 steps, then a pass on the perturbed word embeddings) and
    --lora_rank's (adapters on every dense kernel), an ELECTRA's (embeddings half as wide, projected) and every
    registered head's own probe (`Head.gpu_probe`: GlobalPointer's nested spans); each trained on every tower:
    finite losses, towers bit-equal after (the averages too, the teacher and LoRA's frozen encoder as they
    were)."""
    strategy = setup.strategy()
    rows, seq = 4 * setup.plan.towers, 32
    features, _ = next(iter(random_batches(rows, seq, 1)))
    token_labels = np.where(np.arange(seq) % 2 == 1, np.arange(rows * seq).reshape(rows, seq) % 9, -1)
    span_labels = np.stack([np.arange(rows) % seq, (np.arange(rows) + 3) % seq], 1)
    choice_features = {k: v.numpy().reshape(rows, 4, seq // 4) for k, v in features.items()}
    choice_features["padding_mask"][1::2, 3] = False
    choice_features["token_ids"][1::2, 3] = 0
    heads = {"tagger_crf": (lambda: modeling.build_tagger(bert_config("tiny"), 9, "mixed_float16", crf=True),
                            CRFTagging().loss, features, token_labels),
             "span": (lambda: modeling.build_span_model(bert_config("tiny"), "mixed_float16"), SpanExtraction().loss,
                      features, span_labels),
             "multiple_choice": (lambda: modeling.build_choice_model(bert_config("tiny"), "mixed_float16"),
                                 MultipleChoice().loss, choice_features, np.arange(rows) % 3)}
    with strategy.scope():
        teacher = modeling.build_tagger(bert_config("tiny"), 9, "mixed_float16")
        teacher.trainable = False
    before = [v.numpy() for v in teacher.weights]
    untagged = np.where(np.arange(rows)[:, None] == 1, np.where(token_labels >= 0, -2, -1), token_labels)
    student = dataclasses.replace(bert_config("tiny"), num_hidden_layers=1)
    heads["distilled_tagger"] = (lambda: modeling.build_tagger(student, 9, "mixed_float16"), with_teacher(
        TokenClassification().loss, teacher, TokenClassification(), 2.0, intermediate=Intermediate((1,), 1.0, 1.0)),
        features, untagged)
    cached = {**features, CACHED: tf.constant(np.linspace(-2, 2, rows * 2).reshape(rows, 2), tf.float32)}
    heads["distilled_cached"] = (lambda: modeling.build_classifier(student, 2, "mixed_float16"), with_teacher(
        Classification().loss, teacher, Classification(), 2.0), cached, np.arange(rows) % 2)
    heads["ema"] = (lambda: modeling.build_classifier(bert_config("tiny"), 2, "mixed_float16"), Classification().loss,
                    features, np.arange(rows) % 2)
    heads["adversarial"] = (lambda: modeling.build_classifier(bert_config("tiny"), 2, "mixed_float16"),
                    with_adversarial(Classification().loss, 1.0, 2, 0.5), features, np.arange(rows) % 2)
    heads["lora"] = (lambda: modeling.build_classifier(bert_config("tiny"), 2, "mixed_float16"), Classification().loss,
                     features, np.arange(rows) % 2)
    tiny = bert_config("tiny")
    electra = dataclasses.replace(tiny, model_type="electra", embedding_size=tiny.hidden_size // 2)
    heads["electra"] = (lambda: modeling.build_classifier(electra, 2, "mixed_float16"), Classification().loss,
                        features, np.arange(rows) % 2)
    for head in HEADS.values():  # a registered head's own (io/heads.py: GlobalPointer's): it joins by itself
        probe = head.gpu_probe(tiny, rows, seq)
        if probe is not None:
            heads[head.name] = (probe[0], probe[1], features, probe[2])
    out, ok = {}, True
    for name, (build, loss, features, labels) in heads.items():
        with strategy.scope():
            model = build()
            if name == "lora":  # adapters on every dense kernel, the encoder frozen
                lora.enable(model, lora.check_lora(4, 8, tuple(lora.TARGETS)))
            frozen = [(v, v.numpy()) for v in model.backbone.weights] if name == "lora" else []
            projection = model.backbone.embeddings_projection.kernel.numpy() if name == "electra" else None
            opt = optimization.create_optimizer(1e-3, 1000, 0, float16=True, ema_decay=0.9 if name == "ema" else 0)
        trainer = training.Trainer(strategy, model, opt, loss_fn=loss)
        data = tf.data.Dataset.from_tensors((features, labels.astype("int32"))).repeat(steps)
        losses = [trainer.train_step(b)[0] for b in trainer.training_batches(data)]
        differ = towers_differ(strategy, model)
        facts = {}
        if name == "tagger_crf":
            facts["transitions_moved"] = float(np.abs(model.crf.transitions.numpy()).max())
        if name == "distilled_tagger":
            facts["teacher_changed"] = [v.path for v, w in zip(teacher.weights, before) if not all(
                np.array_equal(c.numpy(), w) for c in strategy.experimental_local_results(v.value))]
            facts["hidden_and_attention"] = [float(trainer.stats[k]) for k in ("distill_hidden", "distill_attention")]
        if name == "distilled_cached":
            facts["cached_soft"] = float(trainer.stats["distill_soft"])
        if name == "adversarial":
            facts["adversarial_loss"] = float(trainer.stats["adversarial_loss"])
        if name == "lora":
            facts["encoder_changed"] = [v.path for v, w in frozen if not all(
                np.array_equal(c.numpy(), w) for c in strategy.experimental_local_results(v.value))]
            facts["adapters_moved"] = float(max(np.abs(v.numpy()).max() for n, v in
                                                lora.adapters(model).named_variables().items() if "lora_b" in n))
        if name == "electra":  # the embeddings' projection trains; the pooler ELECTRA lacks stays out
            facts["projection_moved"] = float(np.abs(model.backbone.embeddings_projection.kernel.numpy()
                                                     - projection).max())
            facts["pooler_trained"] = any(v.path.startswith("pooled_dense") for v in model.trainable_variables)
        if name == "ema":
            averages = opt.inner_optimizer._model_variables_moving_average
            differ += [f"average of {v.path}" for v in averages if any(not np.array_equal(
                c.numpy(), strategy.experimental_local_results(v.value)[0].numpy())
                for c in strategy.experimental_local_results(v.value))]
            facts["averages_apart"] = float(max(np.abs(a.numpy() - v.numpy()).max() for a, v in zip(
                averages, opt.inner_optimizer._trainable_variables)))
        good = bool(np.all(np.isfinite(losses))) and not differ and trainer.applied_steps >= 1 and \
            facts.get("transitions_moved") != 0 and not facts.get("teacher_changed") and \
            min(facts.get("hidden_and_attention", [1])) > 0 and facts.get("adversarial_loss", 1) > 0 and \
            facts.get("cached_soft", 1) > 0 and facts.get("averages_apart", 1) > 0 and \
            not facts.get("encoder_changed") and facts.get("adapters_moved", 1) > 0 and \
            facts.get("projection_moved", 1) > 0 and not facts.get("pooler_trained")
        ok &= good
        out[name] = {"ok": good, "losses": losses, "differ": differ, "applied": trainer.applied_steps, **facts}
    return {"ok": ok, **out, "summary": "; ".join(
        f"{name}: losses {', '.join(f'{x:.3f}' for x in r['losses'])}, {r['applied']} applied, "
        f"{len(r['differ'])} variable(s) differ" for name, r in out.items())}
