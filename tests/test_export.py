"""Export: a SavedModel served from raw text, Hugging Face, Google TF1 and keras-hub, each read back."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import shared_runs
from conftest import WORDS, run_script, sentiment_rows, tiny_config, write_google_release

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.io import checkpoints, export

FORMATS = shared_runs.EXPORT_FORMATS
# What --init_checkpoint reads (ONNX and LiteRT graphs: test_onnx_export.py, test_tflite_export.py).
READ_BACK = tuple(f for f in FORMATS if f not in ("onnx", "tflite"))
ASCII = ["the movie was good", "awful plot !", "it was very fun and not dull", "brilliant actor , boring story"]


@pytest.fixture(scope="module")
def trained(classifier_run):
    """The session's classifier run (tests/shared_runs.py), exported in every format by the run itself
    (--do_export), tanh-GELU so that its keras-hub export is exact too; read-only, and its model loaded."""
    out = pathlib.Path(classifier_run.out)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    clf = bert_mgpu.BertClassifier.from_pretrained(str(out), towers=towers, precision="float32", max_seq_length=32)
    return out, clf, classifier_run.proc


def texts(n):
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(WORDS, rng.integers(1, 40))) for _ in range(n)]


def test_the_run_trained_and_exported_every_format(trained):
    """Every format exported by the run, each stamped with the run, the format, the step and the weights it
    holds; the run's dev accuracy is what its model, loaded back, scores on dev."""
    import json

    out, clf, proc = trained
    results = dict(line.split(" = ") for line in (out / "eval_results.txt").read_text().splitlines())
    assert int(results["global_step"]) == 160  # 640 rows / (8 x 2 towers) x 4 epochs
    digest = export.as_trained(str(out)).digest()  # the run's final weights
    for fmt in FORMATS:
        assert f"export: {fmt} -> {out / 'export' / fmt}" in proc.stdout
        stamp = json.loads((out / "export" / fmt / ".bert_mgpu_stamp.json").read_text())
        assert stamp == {"output_dir": os.path.realpath(out), "format": fmt, "precision": "float32", "step": 160,
                         "weights_sha256": digest}
    dev = sentiment_rows(50, seed=2)
    p = clf.predict([text for _, text in dev])
    right = sum(("pos" if row[1] > row[0] else "neg") == label for row, (label, _) in zip(p, dev))
    assert float(results["eval_accuracy"]) == pytest.approx(right / 50, abs=1e-6)
    assert right / 50 > 0.8  # a model that learned something: its outputs are not all alike
    p = clf.predict(ASCII)
    assert np.ptp(p[:, 0]) > 0.2, p


SERVE = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizer's ops)

path, texts = sys.argv[1], json.load(open(sys.argv[2]))
served = tf.saved_model.load(path)
fn = served.signatures["serving_default"]
full = fn(text=tf.constant(texts))
one = fn(text=tf.constant(texts[:1]))
assert not [m for m in sys.modules if m.split(".")[0] in ("bert_mgpu", "keras_hub", "keras_nlp")]
np.savez(sys.argv[3], probabilities=full["probabilities"].numpy(), one=one["probabilities"].numpy(),
         labels=full["labels"].numpy().astype(str), label_ids=full["label_ids"].numpy())
"""


def test_saved_model_serves_raw_text_in_a_process_without_bert_mgpu(trained, tmp_path):
    out, clf, _ = trained
    batch = ASCII + texts(996)  # 1,000 texts, up to 40 words: some cut at --max_seq_length=32
    (tmp_path / "texts.json").write_text(json.dumps(batch))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", SERVE, str(out / "export" / "saved_model"), str(tmp_path / "texts.json"),
                    str(tmp_path / "served.npz")], check=True, cwd=str(tmp_path), env=env, timeout=300)
    served = np.load(tmp_path / "served.npz")
    ours = clf.predict(batch, batch_size=64)
    assert served["probabilities"].shape == (1000, 2)
    # Two float32 code paths (keras-hub's graph, one batch of 1,000; the fused encoder, batches of 64): on an
    # Intel Xeon with AMX one text of 1,000 differs by 1.4e-5 (1.9e-5 with oneDNN off), a logit 5.6e-5 apart
    # at p = 0.53; the rest by under 1e-6.
    assert np.abs(served["probabilities"] - ours).max() <= 5e-5
    assert (np.abs(served["probabilities"] - ours).max(1) > 1e-6).sum() <= 10
    assert np.abs(served["one"] - ours[:1]).max() <= 1e-5
    assert list(served["labels"]) == [clf.labels[i] for i in ours.argmax(1)]
    assert (served["label_ids"] == ours.argmax(1)).all()


def stored_values(saved_model):
    """{name: number of values} of what a SavedModel's variables/ stores."""
    import tensorflow as tf

    found = tf.train.list_variables(os.path.join(saved_model, "variables", "variables"))
    return {name: int(np.prod(shape)) for name, shape in found if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def test_the_saved_model_stores_each_weight_once(trained):
    """Issue 68 item 1: a Keras variable and the tf.Variable inside it were saved apart, every weight twice
    (174 MB for the demo's 22.7 M parameters). Now as many values as the model has: the encoder and the head."""
    out, clf, _ = trained
    stored = stored_values(str(out / "export" / "saved_model"))
    weights = checkpoints.encoder_weights(clf.model.backbone)
    expected = sum(w.size for w in weights.values()) + sum(w.size for w in clf.model.head.get_weights())
    assert len(stored) == len(weights) + 2 and sum(stored.values()) == expected, (len(stored), len(weights))
    meta = json.loads((out / "export" / "saved_model" / "assets.extra" / "bert_mgpu_export.json").read_text())
    assert len(meta["weights"]) == len(stored)


def test_saved_model_token_id_signature_and_saved_model_cli(trained):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    out, clf, _ = trained
    path = out / "export" / "saved_model"
    shown = subprocess.run([os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "show", "--dir",
                            str(path), "--tag_set", "serve"], capture_output=True, text=True, check=True)
    assert 'SignatureDef key: "serving_default"' in shown.stdout and 'SignatureDef key: "serving_ids"' in shown.stdout
    ids = [[clf.tokenizer.cls_id, *clf.tokenizer.convert_tokens_to_ids(clf.tokenizer.tokenize(t)), clf.tokenizer.sep_id]
           for t in ASCII]
    width = max(map(len, ids))
    padded = tf.constant([row + [0] * (width - len(row)) for row in ids], tf.int32)
    got = tf.saved_model.load(str(path)).signatures["serving_ids"](token_ids=padded, segment_ids=tf.zeros_like(padded))
    assert np.abs(got["probabilities"].numpy() - clf.predict(ASCII)).max() <= 1e-5


def test_hf_export_gives_transformers_the_same_outputs(reference, trained, classifier_run):
    import torch
    import transformers

    out, clf, _ = trained
    path = out / "export" / "hf"
    assert not [f for f in os.listdir(path) if f.endswith((".bin", ".pt", ".pkl"))]  # nothing pickled
    umask = os.umask(0)
    os.umask(umask)
    assert classifier_run.facts["modes"]["export/hf/model.safetensors"] == 0o666 & ~umask  # as open() makes it
    model = transformers.BertForSequenceClassification.from_pretrained(str(path)).eval()
    assert model.config.id2label == {0: "neg", 1: "pos"}
    tok = transformers.BertTokenizer.from_pretrained(str(path))
    batch = tok(ASCII, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = torch.softmax(model(**batch).logits, -1).numpy()
    assert np.abs(theirs - clf.predict(ASCII)).max() <= 1e-5


def test_hf_export_of_real_minilm_weights_matches_transformers_logits(reference, minilm_dir, tmp_path):
    """Real weights (all-MiniLM-L6-v2, exact GELU) under a random head: logits to 1e-4."""
    import torch
    import transformers

    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1)
    clf = bert_mgpu.BertClassifier.from_pretrained(minilm_dir, labels=["a", "b", "c"], towers=towers,
                                                   precision="float32", max_seq_length=64)
    clf.model.head.bias.assign([0.5, -0.25, 0.0])
    clf.export(str(tmp_path / "hf"), format="hf")
    model = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
    tok = transformers.BertTokenizer.from_pretrained(str(tmp_path / "hf"))
    with torch.no_grad():
        logits = model(**tok(ASCII, padding=True, return_tensors="pt")).logits.numpy()
    ours = np.log(clf.predict(ASCII))
    # Softmax keeps logit differences: compare them (the head's logits are not otherwise exposed).
    assert np.abs((logits - logits[:, :1]) - (ours - ours[:, :1])).max() <= 1e-4
    assert np.ptp(logits) > 0.05  # the real encoder under a head gives distinct logits


def test_google_export_has_googles_names_and_reads_back(trained):
    import tensorflow as tf

    out, clf, _ = trained
    path = out / "export" / "google"
    files = sorted(n for n in os.listdir(path) if n != ".bert_mgpu_stamp.json")  # and the run's stamp
    assert files == ["bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index", "vocab.txt"]
    names = dict(tf.train.list_variables(str(path / "bert_model.ckpt")))
    assert names["output_weights"] == [2, 32] and names["output_bias"] == [2]  # run_classifier's head
    assert names["bert/encoder/layer_1/attention/self/query/kernel"] == [32, 32]
    assert names["bert/pooler/dense/kernel"] == [32, 32]
    assert not [n for n in names if "adam" in n or n.startswith(("encoder", "head", "optimizer"))]
    config = json.loads((path / "bert_config.json").read_text())
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                "type_vocab_size", "initializer_range"):
        assert key in config
    pre = checkpoints.load_pretrained(str(path))
    assert pre.layout == "google" and pre.labels == ["neg", "pos"]
    ours = clf.trained().weights
    assert set(pre.weights) == set(ours)
    assert max(np.abs(pre.weights[k] - ours[k]).max() for k in ours) == 0.0


def test_keras_hub_preset_loads_in_keras_hub_to_the_same_outputs(trained):
    import keras_hub

    out, clf, _ = trained
    task = keras_hub.models.BertTextClassifier.from_preset(str(out / "export" / "keras_hub"))
    theirs = np.asarray(task.predict(ASCII, verbose=0))  # logits
    theirs = np.exp(theirs - theirs.max(1, keepdims=True))
    theirs /= theirs.sum(1, keepdims=True)
    assert np.abs(theirs - clf.predict(ASCII)).max() <= 1e-5


@pytest.mark.parametrize("fmt", READ_BACK)
def test_every_export_reads_back_to_the_same_predictions(trained, fmt):
    out, clf, _ = trained
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    back = bert_mgpu.BertClassifier.from_pretrained(str(out / "export" / fmt), towers=towers, precision="float32",
                                                    max_seq_length=32)
    assert back.labels == clf.labels
    batch = ASCII + texts(60)
    assert np.abs(back.predict(batch) - clf.predict(batch)).max() <= 1e-6


def test_predict_from_a_saved_model_export_with_the_script(trained, tmp_path):
    out, _, _ = trained
    again = tmp_path / "again"
    run_script("run_classifier_mgpu.py", "--task_name=tsv", f"--data_dir={out.parent / 'data'}",
               f"--init_checkpoint={out / 'export' / 'saved_model'}", f"--output_dir={again}", "--do_predict",
               "--n_gpus=0", "--max_seq_length=32", "--precision=float32")
    # The SavedModel runs keras-hub's encoder, the run its fused one: equal to float32 rounding (on an AVX2-only
    # CPU, oneDNN off, the printed 8th decimal differs).
    got, want = (np.loadtxt(d / "test_results.tsv", delimiter="\t") for d in (again, out))
    assert got.shape == want.shape == (13, 2)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_keras_hub_export_of_an_exact_gelu_model_is_refused_unless_allowed(minilm_dir, tmp_path, caplog):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1)
    clf = bert_mgpu.BertClassifier.from_pretrained(minilm_dir, labels=["a", "b"], towers=towers,
                                                   precision="float32", max_seq_length=64)
    clf.model.head.kernel.assign(clf.model.head.kernel * 50)  # a head that tells inputs apart
    with pytest.raises(UserError, match=r"computes tanh-GELU where this model has gelu and NFKC case folding where "
                                        r"this model lower-cases as google-bert; its outputs differ from this "
                                        r"model's by up to [0-9.e-]+ on \d+ texts\. Pass --allow_approximate_export"):
        clf.export(str(tmp_path / "kh"), format="keras_hub")
    assert not os.path.exists(tmp_path / "kh") and os.listdir(tmp_path) == []  # nothing left behind
    clf.export(str(tmp_path / "kh"), format="keras_hub", allow_approximate=True)
    assert os.path.exists(tmp_path / "kh" / "task.weights.h5")
    assert "keras-hub export: outputs differ from this model's by up to" in caplog.text


def test_pretrainer_exports_hf_pretraining_heads_and_google_names(reference, tmp_path):
    """BertForPreTraining from a pretrainer: the masked-LM and next-sentence logits equal ours to 1e-4."""
    import tensorflow as tf
    import torch
    import transformers

    from bert_mgpu.model import pretraining_model

    release, _ = write_google_release(str(tmp_path / "release"), seed=3)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=1)
    pre = bert_mgpu.BertPretrainer.from_config(tiny_config(len(WORDS) + 10), os.path.join(release, "vocab.txt"),
                                              towers=towers, precision="float32", fused_encoder=False)
    rng = np.random.default_rng(0)
    for var in pre.model.weights:  # weights far from initialization: heads that matter
        var.assign(var.numpy() + rng.normal(0, 0.2, var.shape).astype(np.float32))
    pre.export(str(tmp_path / "hf"), format="hf")
    pre.export(str(tmp_path / "google"), format="google")
    ids = np.array([[2, 15, 16, 4, 17, 3, 18, 4, 3, 0]], np.int32)
    segments = np.array([[0, 0, 0, 0, 0, 0, 1, 1, 1, 0]], np.int32)
    positions = np.array([[3, 7]], np.int32)
    ours = pre.model({"token_ids": ids, "segment_ids": segments, "padding_mask": ids != 0,
                      "mask_positions": positions}, training=False)
    model = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids).long(), token_type_ids=torch.tensor(segments).long(),
                       attention_mask=torch.tensor(ids != 0).long())
    mlm = theirs.prediction_logits.numpy()[0, positions[0]]
    assert np.abs(mlm - ours["mlm_logits"].numpy()[0]).max() <= 1e-4
    assert np.abs(theirs.seq_relationship_logits.numpy() - ours["nsp_logits"].numpy()).max() <= 1e-4
    assert np.ptp(mlm) > 1.0
    names = dict(tf.train.list_variables(str(tmp_path / "google" / "bert_model.ckpt")))
    assert names["cls/seq_relationship/output_weights"] == [2, 32]
    assert set(pretraining_model.head_weights(pre.model)) <= set(names)
    back = bert_mgpu.BertPretrainer.from_pretrained(str(tmp_path / "hf"), towers=towers, precision="float32",
                                                    fused_encoder=False)
    again = back.model({"token_ids": ids, "segment_ids": segments, "padding_mask": ids != 0,
                        "mask_positions": positions}, training=False)
    assert np.abs(again["mlm_logits"].numpy() - ours["mlm_logits"].numpy()).max() <= 1e-5


def test_export_alone_and_its_bad_input(trained, tmp_path):
    out, _, _ = trained
    again = tmp_path / "again"
    proc = run_script("run_classifier_mgpu.py", f"--output_dir={out}", "--do_export", f"--export_dir={again}",
                      "--export_format=hf")
    assert f"export: hf -> {again / 'hf'}" in proc.stdout and (again / "hf" / "model.safetensors").exists()

    def fails(*args, as_a_user=False):
        """The one line a failed run ends with. `as_a_user`: a new interpreter with no TF_CPP_MIN_LOG_LEVEL,
        whose stderr is that line alone; else forked from one with TensorFlow loaded (its start-up lines
        came before)."""
        proc = run_script("run_classifier_mgpu.py", *args, check=False, fresh=as_a_user,
                          env={"TF_CPP_MIN_LOG_LEVEL": None} if as_a_user else None)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 or not as_a_user, proc.stderr
        return lines[-1]

    (tmp_path / "empty").mkdir()
    assert "not a Google checkpoint" in fails(f"--output_dir={tmp_path / 'empty'}", "--do_export",
                                              f"--export_dir={tmp_path / 'x'}", as_a_user=True)
    assert ("--export_format=coreml: expected one of saved_model, hf, google, keras_hub, onnx, onnx_int8, tflite"
            in fails(f"--output_dir={out}", "--do_export", "--export_format=coreml", f"--export_dir={tmp_path / 'x'}"))
    before = (again / "hf" / "config.json").read_text()
    # The same export again (this run, this step) is done; another run's export there is refused.
    proc = run_script("run_classifier_mgpu.py", f"--output_dir={out}", "--do_export", f"--export_dir={again}",
                      "--export_format=hf")
    assert f"export: hf -> {again / 'hf'} (already there, from step" in proc.stdout
    assert (again / "hf" / "config.json").read_text() == before
    # Checked before training: a run that could not export never starts.
    fresh = tmp_path / "fresh"
    assert "exists and is not empty" in fails(
        "--task_name=tsv", f"--data_dir={out.parent / 'data'}", f"--init_checkpoint={out.parent / 'release'}",
        f"--output_dir={fresh}", "--do_train", "--do_export", f"--export_dir={again}", "--export_format=hf")
    assert not fresh.exists()


def test_a_saved_model_in_bfloat16_serves_close_to_float32(trained, tmp_path):
    import tensorflow as tf

    out, clf, _ = trained
    path = clf.export(str(tmp_path / "bf16"), format="saved_model", precision="mixed_bfloat16")
    meta = json.loads((tmp_path / "bf16" / "assets.extra" / "bert_mgpu_export.json").read_text())
    assert meta["precision"] == "mixed_bfloat16" and meta["labels"] == ["neg", "pos"]
    got = tf.saved_model.load(path).signatures["serving_default"](text=tf.constant(ASCII))["probabilities"].numpy()
    difference = np.abs(got - clf.predict(ASCII)).max()
    assert 0 < difference <= 0.05, difference  # bfloat16 has 8 bits of mantissa: close, not equal


def test_a_pretrainer_without_nsp_exports_masked_lm_and_a_keras_hub_backbone(reference, tmp_path):
    import keras_hub
    import torch
    import transformers

    release, _ = write_google_release(str(tmp_path / "release"), seed=4)
    vocab = os.path.join(release, "vocab.txt")
    pre = bert_mgpu.BertPretrainer.from_config(tiny_config(len(WORDS) + 10, hidden_act="gelu_new"), vocab,
                                              towers=bert_mgpu.Towers(n_gpus=0), precision="float32", nsp=False)
    rng = np.random.default_rng(1)
    for var in pre.model.weights:
        var.assign(var.numpy() + rng.normal(0, 0.2, var.shape).astype(np.float32))
    pre.export(str(tmp_path / "hf"), format="hf", max_seq_length=16)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and "id2label" not in config
    model = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = np.array([[2, 15, 4, 17, 3]], np.int32)
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids).long()).logits.numpy()[0, 2]
    ours = pre.model({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": ids != 0,
                      "mask_positions": np.array([[2]], np.int32)}, training=False)["mlm_logits"].numpy()[0, 0]
    assert np.abs(theirs - ours).max() <= 1e-4 and np.ptp(ours) > 1.0
    pre.export(str(tmp_path / "kh"), format="keras_hub", max_seq_length=16)  # tanh-GELU: exact, not refused
    backbone = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "kh"))
    assert backbone.num_layers == 2 and keras_hub.models.BertTokenizer.from_preset(str(tmp_path / "kh"))


def test_rerunning_a_finished_command_with_do_export_is_done_not_an_error(classifier_run, tmp_path):
    """Issue 33: the same command again (after it finished, or after a kill between two formats) found its own
    exports and refused them as "exists and is not empty"; each stamped export of the same run and step is
    now done. On a copy of the shared run."""
    out, args = classifier_run.copy(tmp_path / "run")  # its stamps name the copy (tests/shared_runs.py)
    before = {fmt: sorted(os.listdir(os.path.join(out, "export", fmt))) for fmt in FORMATS}
    proc = run_script("run_classifier_mgpu.py", *args)
    step = json.load(open(os.path.join(out, "export", "hf", ".bert_mgpu_stamp.json")))["step"]
    assert step == json.load(open(os.path.join(out, "bert_mgpu.json")))["global_step"] == 160
    for fmt in FORMATS:
        assert f"export: {fmt} -> {os.path.join(out, 'export', fmt)} (already there, from step {step})" in proc.stdout
        assert sorted(os.listdir(os.path.join(out, "export", fmt))) == before[fmt]


def test_truncation_is_kept_by_the_run_and_served_by_its_saved_model(trained, tmp_path):
    """--truncation=head+tail: the run directory records it, from_pretrained reads it back, the SavedModel
    cuts raw text the same way, and keras-hub's preprocessor (head only) is refused."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    out, clf, _ = trained
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    both = bert_mgpu.BertClassifier.from_pretrained(str(out), towers=towers, precision="float32", max_seq_length=32,
                                                    truncation="head+tail")
    rng = np.random.default_rng(3)
    filler = ["the", "movie", "film", "plot", "actor", "story", "was", "very", "it"]
    long = [" ".join(rng.choice(filler, 60)) + " " + w for w in ("good", "awful", "fun", "boring")]  # its word last
    assert np.abs(both.predict(ASCII) - clf.predict(ASCII)).max() <= 1e-6  # short texts: nothing cut
    assert np.abs(both.predict(long) - clf.predict(long)).max() > 1e-3  # long ones: other pieces read
    rows = [bert_mgpu.Example(str(i), t, None, label) for i, (label, t) in enumerate(sentiment_rows(32, seed=4))]
    both.fit(rows, str(tmp_path / "run"), epochs=1, learning_rate=1e-4, verbose=False)
    back = bert_mgpu.BertClassifier.from_pretrained(str(tmp_path / "run"), towers=towers, precision="float32",
                                                    max_seq_length=32)
    assert back.truncation == "head+tail"
    assert np.abs(back.predict(long) - both.predict(long)).max() <= 1e-6
    path = both.export(str(tmp_path / "saved_model"))
    served = tf.saved_model.load(path).signatures["serving_default"](text=tf.constant(long + ASCII))
    assert np.abs(served["probabilities"].numpy() - both.predict(long + ASCII)).max() <= 1e-5
    with pytest.raises(UserError, match="keeps the head of a long text; this model reads its head\\+tail"):
        both.export(str(tmp_path / "keras_hub"), "keras_hub")
    with pytest.raises(UserError, match="--truncation=middle: one of"):
        bert_mgpu.BertClassifier.from_pretrained(str(out), towers=towers, max_seq_length=32, truncation="middle")


def test_a_run_started_over_replaces_its_old_export_and_a_foreign_one_is_refused(trained, tmp_path):
    """Issue 66 item 3: --overwrite_output_dir retrained to the same step and kept the old run's export
    ("already there, from step 80"): the stamp named directory, format, precision and step, not the weights.
    It now holds the weights' digest: the new run's export replaces the old one; without the flag, an
    export of other weights is refused, left as it was."""
    out, _, _ = trained
    run = tmp_path / "out"
    args = ["--task_name=tsv", f"--data_dir={out.parent / 'data'}", f"--init_checkpoint={out.parent / 'release'}",
            f"--output_dir={run}", "--do_train", "--do_export", "--export_format=hf", "--n_gpus=0",
            "--towers_per_gpu=2", "--train_batch_size=8", "--max_seq_length=32", "--precision=float32",
            "--num_train_epochs=1"]
    run_script("run_classifier_mgpu.py", *args, "--learning_rate=2e-3")
    first = json.load(open(run / "bert_mgpu.json"))["global_step"]
    old = (run / "export" / "hf" / "model.safetensors").read_bytes()
    proc = run_script("run_classifier_mgpu.py", *args, "--learning_rate=1e-3", "--overwrite_output_dir")
    step = json.load(open(run / "bert_mgpu.json"))["global_step"]
    assert step == first > 0  # the same step, other weights
    assert f"export: hf -> {run / 'export' / 'hf'} (replacing the export of step {step}" in proc.stdout
    new = (run / "export" / "hf" / "model.safetensors").read_bytes()
    assert new != old
    digest = export.as_trained(str(run)).digest()
    stamp = json.load(open(run / "export" / "hf" / ".bert_mgpu_stamp.json"))
    assert stamp["weights_sha256"] == digest and stamp["step"] == step
    assert export.as_trained(str(run / "export" / "hf")).digest() == digest  # the export holds those weights
    # The same command again: done. A stamp of other weights (an older export), without the flag: refused.
    proc = run_script("run_classifier_mgpu.py", *args, "--learning_rate=1e-3")
    assert f"export: hf -> {run / 'export' / 'hf'} (already there, from step {step})" in proc.stdout
    stamp["weights_sha256"] = "0" * 64
    (run / "export" / "hf" / ".bert_mgpu_stamp.json").write_text(json.dumps(stamp))
    proc = run_script("run_classifier_mgpu.py", *args, "--learning_rate=1e-3", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "holds an earlier export of this run directory" in proc.stderr.strip().splitlines()[-1]
    assert (run / "export" / "hf" / "model.safetensors").read_bytes() == new
