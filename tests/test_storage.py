"""Runs written to a TensorFlow file system (ram://, as gs:// or s3:// would be) and read back from it."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import sentiment_rows
from test_pretraining import new_pretrainer, text, text_data  # noqa: F401 (the `text` fixture)

import bert_mgpu
from bert_mgpu.core import storage
from bert_mgpu.io import checkpoints
from bert_mgpu.io.output_dir import check_output_dir
from bert_mgpu.io.run_dir import check_same_run
from bert_mgpu.train.budget import Budget

gfile = tf.io.gfile


def test_atomic_writes_reads_globs_and_removal_on_ram_and_local(tmp_path):
    for root in ("ram://storage_test", str(tmp_path)):
        storage.makedirs(os.path.join(root, "ckpt-3_temp"))
        storage.write_atomic(os.path.join(root, "ckpt-3_temp", "part"), b"\x00\x01")
        storage.write_atomic(os.path.join(root, "a.txt"), "één\n")
        storage.write_atomic(os.path.join(root, "a.txt"), "twee\n")  # replaced whole
        assert storage.read_text(os.path.join(root, "a.txt")) == "twee\n"
        assert storage.read_bytes(os.path.join(root, "ckpt-3_temp", "part")) == b"\x00\x01"
        assert [os.path.basename(p) for p in storage.glob(os.path.join(root, "*"))] == ["a.txt", "ckpt-3_temp"]
        storage.remove(os.path.join(root, "ckpt-3_temp"))  # a directory, as a killed save leaves one
        storage.remove(os.path.join(root, "missing"))  # nothing there: nothing to do
        assert [os.path.basename(p) for p in storage.glob(os.path.join(root, "*"))] == ["a.txt"]
        with pytest.raises(OSError):
            storage.read_text(os.path.join(root, "missing"))


def test_inside_resolves_links_locally_and_paths_on_a_remote_file_system(tmp_path):
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path, tmp_path / "run" / "up")
    assert storage.inside(str(tmp_path / "run" / "ckpt-5"), str(tmp_path / "run"))
    assert not storage.inside(str(tmp_path / "run" / "up" / "ckpt-5"), str(tmp_path / "run"))
    assert storage.inside("gs://b/run/ckpt-5", "gs://b/run")
    assert not storage.inside("gs://b/run/../other/ckpt-5", "gs://b/run")
    assert not storage.inside("gs://b/runner/ckpt-5", "gs://b/run")
    assert not storage.inside("s3://b/run/ckpt-5", "gs://b/run")


def test_overwrite_removes_a_killed_saves_temp_directory_too(tmp_path):
    """A kill -9 during a save leaves `ckpt-N_temp/`, which matches ckpt-*; starting over removes it."""
    (tmp_path / "ckpt-2_temp").mkdir()
    (tmp_path / "ckpt-2_temp" / "part-0").write_text("x")
    (tmp_path / "ckpt-1.index").write_text("x")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    (tmp_path / "bert_mgpu.json").write_text('{"settings": {"seed": 1}}')
    assert check_same_run(str(tmp_path), {"seed": 2}, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["bert_mgpu.json"]


def test_a_classifier_trains_evaluates_predicts_and_resumes_on_ram(google_release):
    out = "ram://runs/classifier"
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=8)
    train = [bert_mgpu.Example(str(i), words, label=label) for i, (label, words) in
             enumerate(sentiment_rows(64, seed=1))]
    clf = bert_mgpu.BertClassifier.from_pretrained(google_release, ["neg", "pos"], towers, "float32",
                                                   max_seq_length=32)
    clf.fit(train, out, epochs=1, learning_rate=1e-3, save_checkpoints_steps=2, verbose=False)
    names = {n.rstrip("/") for n in gfile.listdir(out)}
    assert {"bert_mgpu.json", "bert_config.json", "vocab.txt", "checkpoint", "ckpt-4.index", "train"} <= names
    assert gfile.GFile(os.path.join(out, "vocab.txt"), "rb").read() == \
        open(os.path.join(google_release, "vocab.txt"), "rb").read()
    assert gfile.listdir(os.path.join(out, "train"))  # TensorBoard events
    probs = clf.predict(train[:5])

    again = bert_mgpu.BertClassifier.from_pretrained(out, towers=towers, precision="float32", max_seq_length=32)
    assert again.global_step == 4 and again.labels == ["neg", "pos"]
    np.testing.assert_allclose(again.predict(train[:5]), probs, atol=1e-6)
    again.fit(train, out, epochs=1, learning_rate=1e-3, save_checkpoints_steps=2, verbose=False)  # resumes: done
    assert again.global_step == 4
    assert checkpoints.load_pretrained(out).layout == "bert_mgpu"


def test_pretraining_writes_its_checkpoints_and_fine_tune_markers_on_ram(text):  # noqa: F811
    out = "ram://runs/pretraining"
    pre = new_pretrainer(text, micro=4, precision="float32")
    pre.fit(text_data(pre, text), out, Budget(num_train_steps=4, finetune_time_markers=(0.5, 1.0)),
            learning_rate=1e-3, verbose=False)
    assert sorted(n.rstrip("/") for n in gfile.listdir(os.path.join(out, "finetune_checkpoints"))) == \
        ["at_0.5", "at_1"]  # and no temporary directory
    marker = os.path.join(out, "finetune_checkpoints", "at_1")
    clf = bert_mgpu.BertClassifier.from_pretrained(marker, labels=["neg", "pos"], towers=pre.towers,
                                                   max_seq_length=32)
    want = checkpoints.encoder_weights(pre.model.backbone)
    got = checkpoints.encoder_weights(clf.model.backbone)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_atomic_writes_follow_the_umask(tmp_path):
    """mkstemp makes 0600 files; what a run writes is read by others as its checkpoints are (umask)."""
    import stat

    before = os.umask(0o027)
    try:
        path = storage.write_atomic(str(tmp_path / "eval_results.txt"), "eval_accuracy = 0.5\n")
        with open(tmp_path / "by_open.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(before)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640 == stat.S_IMODE(os.stat(tmp_path / "by_open.txt").st_mode)


def test_json_cut_short_names_the_file_and_line(tmp_path):
    path = tmp_path / "bert_mgpu.json"
    path.write_text('{\n  "kind": "classifier",\n  "labels": ["neg", "po')
    with pytest.raises(bert_mgpu.UserError, match=r"bert_mgpu.json:3: not valid JSON \(Unterminated string"):
        storage.read_json(str(path))


def test_a_set_of_result_files_killed_between_renames_is_completed_by_the_next_start(tmp_path, monkeypatch):
    old = {"test_results.tsv": "old 1\n", "predict.txt": "old 2\n", "predictions.tsv": "old 3\n"}
    storage.write_set(str(tmp_path), old)
    replace, moved = os.replace, []

    def killed_after_one_result(src, dst):
        if os.path.basename(src).startswith(".set-") and moved:
            raise KeyboardInterrupt  # a kill -9 between two renames
        replace(src, dst)
        moved.append(dst) if os.path.basename(src).startswith(".set-") else None

    monkeypatch.setattr(os, "replace", killed_after_one_result)
    with pytest.raises(KeyboardInterrupt):
        storage.write_set(str(tmp_path), {name: text.replace("old", "new") for name, text in old.items()})
    monkeypatch.setattr(os, "replace", replace)
    assert [(tmp_path / n).read_text()[:3] for n in old] == ["new", "old", "old"]  # mixed, with the note left
    check_output_dir(str(tmp_path))  # what every script does first
    assert [(tmp_path / n).read_text() for n in old] == ["new 1\n", "new 2\n", "new 3\n"]
    assert sorted(os.listdir(tmp_path)) == sorted(old)
