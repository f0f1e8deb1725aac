"""examples/finetune.ipynb runs from top to bottom (nbclient, a fresh kernel), so it never rots."""

import json
import os

import pytest
from conftest import ROOT

import bert_mgpu

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


@pytest.mark.learning
def test_the_fine_tuning_notebook_runs_and_learns(minilm_dir, monkeypatch):
    import nbclient
    import nbformat

    if not os.path.exists(os.path.join(ROOT, "data", "rotten_tomatoes", "train.tsv")):
        pytest.fail("data/rotten_tomatoes is missing: run `make assets` (make test does)")
    notebook = nbformat.read(os.path.join(ROOT, "examples", "finetune.ipynb"), as_version=4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the kernel inherits it: the CPU, as the notebook says
    nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(ROOT, "examples")}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the curves, shown inline
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"bert_mgpu {bert_mgpu.__version__} from {os.path.join(ROOT, 'bert_mgpu')}" in text  # the install cell
    assert "device plan: 2 tower(s) on CPU" in text
    result = json.loads(text.strip().splitlines()[-1])
    labels = [line.split("\t")[0] for line in open(os.path.join(ROOT, "data", "rotten_tomatoes", "dev.tsv"),
                                                   encoding="utf-8").read().splitlines()[1:]][::6]
    majority = max(labels.count(k) for k in set(labels)) / len(labels)  # 0.61: what always "fresh" scores
    assert result["eval_accuracy"] > majority + 0.05, (result, majority)
    assert result["positive"][0] > result["positive"][1], result
    assert "evaluations at steps [16, 32, 48]" in text
