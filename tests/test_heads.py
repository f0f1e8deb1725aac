"""The head seam (issue 67 item 1): each head kind is one object the io layer asks; no io module compares a
kind's string."""

import ast
import os
import types

import numpy as np
import pytest
from conftest import tiny_config

from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints, heads
from bert_mgpu.io.trained import Trained
from bert_mgpu.model.modeling import build_backbone

IO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bert_mgpu", "io")


def test_no_io_module_compares_a_kind_or_looks_for_a_crf_attribute():
    """`trained.kind == "tagger"` and `getattr(model, "crf")` were the switches a new head had to extend."""
    found = []
    for name in sorted(os.listdir(IO)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(IO, name)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "kind":
                found.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and \
                    any(isinstance(a, ast.Constant) and a.value == "crf" for a in node.args):
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_every_kind_a_run_or_export_records_has_one_head_and_an_unknown_one_is_refused():
    assert [h.name for h in heads.HEADS.values()] == list(heads.HEADS)  # a head is registered under its name
    assert {"classifier", "tagger", "question_answerer", "multiple_choice", "pretrainer"} <= set(heads.HEADS)
    assert heads.head_for("pretraining") is heads.head_for("pretrainer")  # an older pretraining run's kind
    with pytest.raises(UserError, match="unknown head kind 'ranker'; expected one of classifier, tagger"):
        heads.head_for("ranker")
    for head in heads.HEADS.values():  # a head's formats are export's, and every one can be exported somehow
        assert head.formats and set(head.formats) <= set(heads.ALL_FORMATS) and head.noun.startswith("a")


def test_a_kind_has_one_name_and_runs_and_exports_written_under_the_old_names_read_as_today(tmp_path):
    """A head's objective is named as its head (a classifier's alone has a second level, its task_type); a
    tagger run that recorded "token_classification", a pretraining run "pretraining" and an ONNX export of
    a question answerer "span_extraction" read, resume and serve under today's names."""
    import json

    from bert_mgpu.io import run_dir, served
    from bert_mgpu.model.choice_objectives import MultipleChoice
    from bert_mgpu.model.mlm_objective import MaskedLanguageModel
    from bert_mgpu.model.objectives import KINDS
    from bert_mgpu.model.span_objectives import SpanExtraction
    from bert_mgpu.model.tagging_objectives import CRFTagging, TokenClassification

    made = types.SimpleNamespace(weights={}, labels=["A"], facts={})  # what a head asks of a Trained
    for name, head in heads.HEADS.items():  # every head's objective, a new head's too, has the head's name
        if name not in ("classifier", "pretrainer"):
            assert head.objective(made).name == name
    named = {o.name for o in (TokenClassification, CRFTagging, SpanExtraction, MultipleChoice, MaskedLanguageModel)}
    assert named == {"tagger", "question_answerer", "multiple_choice", "pretrainer"}
    assert set(KINDS) == {"classification", "regression", "multi_label"} and not set(KINDS) & set(heads.HEADS)

    tagger = tmp_path / "tagger"
    tagger.mkdir()
    settings = {"task_type": "token_classification", "crf": True, "doc_stride": 8, "seed": 1}
    (tagger / "bert_mgpu.json").write_text(json.dumps({"kind": "tagger", "task_type": "token_classification",
                                                       "labels": ["O"], "settings": settings}))
    (tagger / "ckpt-4.index").write_text("")
    run = run_dir.read_run(str(tagger))
    assert (run["kind"], run["task_type"], run["settings"]["task_type"]) == ("tagger", "tagger", "tagger")
    assert run["labels"] == ["O"] and run["settings"]["doc_stride"] == 8
    now = {**settings, "task_type": TokenClassification.name}
    assert run_dir.check_same_run(str(tagger), now) is False  # resumes: nothing changed but the name
    with pytest.raises(UserError, match=r"--doc_stride=8 -> 9"):
        run_dir.check_same_run(str(tagger), {**now, "doc_stride": 9})

    pretraining = tmp_path / "pretraining"
    pretraining.mkdir()
    (pretraining / "bert_mgpu.json").write_text(json.dumps({"kind": "pretraining", "global_step": 8}))
    assert run_dir.read_run(str(pretraining)) == {"kind": "pretrainer", "global_step": 8}

    export = tmp_path / "onnx"
    export.mkdir()
    (export / "model.onnx").write_bytes(b"")
    (export / "bert_mgpu.json").write_text(json.dumps({"kind": "question_answerer", "task_type": "span_extraction",
                                                       "labels": []}))
    facts, graph = served.read_facts(str(export))
    assert (facts["kind"], facts["task_type"], graph) == ("question_answerer", "question_answerer", "model.onnx")


def test_a_model_in_memory_says_what_it_is_and_trained_py_knows_no_head():
    """Each head's notebook class (and the pretrainer) gives its own `Trained`; io/trained.py, which every
    export reads through, imports no head's objective and names no head (issue 67: a new head touches no
    shared switch there)."""
    import inspect

    import bert_mgpu
    from bert_mgpu.io import trained

    for cls in (bert_mgpu.BertClassifier, bert_mgpu.BertTagger, bert_mgpu.BertQuestionAnswerer,
                bert_mgpu.BertMultipleChoice, bert_mgpu.BertPretrainer):
        assert "trained" in vars(cls), cls.__name__
    source = inspect.getsource(trained)
    tree = ast.parse(source)
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m.endswith("_objectives")}, imported
    assert not [n for n in heads.HEADS if f'"{n}"' in source]
    with pytest.raises(UserError, match="a dict is not a model bert_mgpu exports"):
        trained.as_trained({"kind": "classifier"})


def test_each_head_with_predictions_has_one_served_reader_and_it_registered_itself():
    """load_exported picks a served export's reader from the readers' own `reads`, not from a table of kinds."""
    from bert_mgpu.io import exported, served

    served_formats = {"saved_model", "onnx", "onnx_int8", "tflite"}  # what load_exported reads back
    assert set(served.READERS) == {name for name, head in heads.HEADS.items()
                                   if set(head.formats) & served_formats} - {"pretrainer"}
    assert all(issubclass(r, served.Served) and r.reads == kind for kind, r in served.READERS.items())
    assert served.READERS["classifier"] is exported.Exported


def test_a_checkpoint_from_elsewhere_is_read_as_the_head_its_weight_names_hold():
    assert heads.head_of_weights({"output_weights": 0, "bert/pooler/dense/kernel": 0}).name == "classifier"
    assert heads.head_of_weights({"cls/squad/output_weights": 0}).name == "question_answerer"
    assert heads.head_of_weights({"bert/pooler/dense/kernel": 0}).name == "pretrainer"


@pytest.mark.parametrize("kind, formats", [
    ("classifier", heads.ALL_FORMATS),
    ("tagger", ("saved_model", "hf", "google", "onnx", "onnx_int8", "tflite")),
    ("question_answerer", ("saved_model", "hf", "google", "onnx", "onnx_int8", "tflite")),
    ("multiple_choice", ("hf", "google", "onnx", "onnx_int8", "tflite")),
])
def test_each_head_refuses_the_formats_it_cannot_be_written_in_with_its_reason(kind, formats):
    head = heads.head_for(kind)
    assert head.formats == formats
    for fmt in heads.ALL_FORMATS:
        if fmt in formats:
            head.check_format(fmt)
        else:
            with pytest.raises(UserError, match=f"--export_format={fmt}: {head.noun} exports as "
                                                f"{' or '.join(formats)}"):
                head.check_format(fmt)


@pytest.mark.parametrize("kind, width, shape", [("classifier", 3, (2, 3)), ("tagger", 3, (2, 5, 3)),
                                                ("question_answerer", 2, (2, 5, 2)),
                                                ("multiple_choice", 1, (2, 4))])
def test_each_heads_reference_model_carries_the_weights_it_is_built_from(kind, width, shape):
    """`Head.build` (what every export writes from): the head's kernel and bias under its Google names, the
    input rank and output width its outputs say."""
    config = tiny_config(40)
    head = heads.head_for(kind)
    rng = np.random.default_rng(0)
    weights = {head.weights[0]: rng.normal(size=(width, config.hidden_size)).astype(np.float32),
               head.weights[1]: rng.normal(size=width).astype(np.float32)}
    labels = [f"l{i}" for i in range(width)] if head.labelled else []
    weights.update(checkpoints.encoder_weights(build_backbone(config)))
    trained = Trained(kind, config, "vocab.txt", True, weights, labels)
    model = head.build(trained)
    np.testing.assert_array_equal(model.head.kernel.numpy(), weights[head.weights[0]].T)
    np.testing.assert_array_equal(model.head.bias.numpy(), weights[head.weights[1]])
    ids = np.full((2,) + (4,) * (head.input_rank - 2) + (5,), 5, np.int32)
    out = model({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids > 0}, training=False)
    assert tuple(out.shape) == shape
    named = head.outputs(trained, out)
    assert all(v.shape[0] == 2 for v in named.values()) and set(named) == {
        "classifier": {"logits", "probabilities"}, "tagger": {"logits"}, "multiple_choice": {"logits"},
        "question_answerer": {"start_logits", "end_logits"}}[kind]


def test_every_fine_tuning_head_opens_its_checkpoint_through_open_head():
    """Issue 67: one path from --init_checkpoint to a head's model (api/opening.open_head) for the
    classifier, the tagger, the GlobalPointer, the question answerer and multiple choice; none opens a
    checkpoint its own way."""
    import inspect

    from bert_mgpu.api import classifier, global_pointer, multiple_choice, question_answering, tagger

    for module in (classifier, tagger, global_pointer, question_answering, multiple_choice):
        source = inspect.getsource(module)
        assert "open_head(" in source and "open_checkpoint(" not in source, module.__name__
