"""Sentence embeddings and google-bert's extract_features, on two towers, against transformers."""

import json

import numpy as np
import pytest
from conftest import run_script

import bert_mgpu
from bert_mgpu.api.embeddings import Encoder

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument!", "The stock market fell sharply today.",
         "Ünïcödé accents, CAPITALS and “quotes”", "short"] * 3 + ["a much longer sentence " * 12]


def transformers_reference(path, texts):
    """all-MiniLM-L6-v2 as sentence-transformers computes it: BertModel, then the mean over real tokens."""
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(path).eval()
    batch = transformers.BertTokenizer.from_pretrained(path)(texts, padding=True, truncation=True, max_length=64,
                                                             return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    mask = batch["attention_mask"][:, :, None].float()
    mean = ((out.last_hidden_state * mask).sum(1) / mask.sum(1)).numpy()
    return mean, out.last_hidden_state[:, 0].numpy(), out.pooler_output.numpy()


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    return Encoder.from_pretrained(minilm_dir, towers, precision="float32", max_seq_length=64)


def test_mean_pooled_minilm_embeddings_equal_transformers(reference, minilm, minilm_dir):
    ours = {p: minilm.embed(TEXTS, pooling=p, batch_size=3 if p == "mean" else 16) for p in ("mean", "cls", "pooler")}
    mean, cls, pooler = transformers_reference(minilm_dir, TEXTS)
    assert ours["mean"].shape == (16, 384)
    assert np.abs(ours["mean"] - mean).max() <= 1e-4  # every input, in order, whatever the batches and towers
    assert np.abs(ours["cls"] - cls).max() <= 1e-4 and np.abs(ours["pooler"] - pooler).max() <= 1e-4
    normed = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    similarity = normed @ normed.T  # a sentence-embedding model: the paraphrase is nearer than the news
    assert similarity[0, 1] > similarity[0, 2] + 0.2


def test_a_classifier_embeds_with_its_encoder(reference, minilm_dir):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    clf = bert_mgpu.BertClassifier.from_pretrained(minilm_dir, labels=["a", "b"], towers=towers,
                                                   precision="float32", max_seq_length=64)
    mean, _, _ = transformers_reference(minilm_dir, TEXTS[:5])
    assert np.abs(clf.embed(TEXTS[:5]) - mean).max() <= 1e-4


def test_extract_features_writes_googles_json_lines_and_npy(reference, minilm_dir, google_release, tmp_path):
    import torch
    import transformers

    (tmp_path / "in.txt").write_text("A man is playing a guitar.\n\nhello world ||| a second sentence\n")
    proc = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}",
                      f"--output_file={tmp_path / 'f.jsonl'}", f"--output_npy={tmp_path / 'e.npy'}",
                      f"--init_checkpoint={minilm_dir}", "--layers=-1,-2", "--max_seq_length=32", "--n_gpus=0",
                      "--towers_per_gpu=2", "--precision=float32", "--batch_size=1")
    assert "features: 3 lines, layers -1,-2" in proc.stdout and "embeddings: 3 x 384 (mean)" in proc.stdout
    assert "in.txt: 1 blank line(s), the first at line 2: each gives the features of an empty text" in proc.stderr
    lines = [json.loads(line) for line in open(tmp_path / "f.jsonl")]
    assert [x["linex_index"] for x in lines] == [0, 1, 2]  # row i is line i + 1, the blank one included
    assert [f["token"] for f in lines[1]["features"]] == ["[CLS]", "[SEP]"]  # as google-bert reads a blank line
    tokens = [f["token"] for f in lines[2]["features"]]
    assert tokens == ["[CLS]", "hello", "world", "[SEP]", "a", "second", "sentence", "[SEP]"]
    assert [layer["index"] for layer in lines[2]["features"][0]["layers"]] == [-1, -2]
    model = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tok = transformers.BertTokenizer.from_pretrained(minilm_dir)
    with torch.no_grad():
        hidden = model(**tok(["hello world"], ["a second sentence"], return_tensors="pt"),
                       output_hidden_states=True).hidden_states
    for j, index in enumerate((-1, -2)):
        ours = np.array([f["layers"][j]["values"] for f in lines[2]["features"]])
        assert np.abs(ours - hidden[index][0].numpy()).max() <= 1e-4
    mean, _, _ = transformers_reference(minilm_dir, ["A man is playing a guitar.", ""])
    vectors = np.load(tmp_path / "e.npy")
    assert vectors.shape == (3, 384) and np.abs(vectors[:2] - mean).max() <= 1e-4  # the blank line is row 1
    bad = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'x'}",
                     f"--init_checkpoint={google_release}", "--layers=-3", "--max_seq_length=32", check=False)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
        "extract_features.py: error: --layers=-3: the model has 2 layers (-2 to 1)")
    two = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'y'}",
                     f"--init_checkpoint={google_release}", "--max_seq_length=32")  # google-bert's default: -1..-4
    assert "layers -1,-2 ->" in two.stdout  # the 2 a 2-layer model has
    same = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'z'}",
                      f"--init_checkpoint={google_release}", "--max_seq_length=32", "--precision=float32")
    assert "layers -1,-2 ->" in same.stdout
    assert (tmp_path / "y").read_text() == (tmp_path / "z").read_text()  # float32 is the default here
    for target, says in ((tmp_path, f"--output_npy={tmp_path} is a directory; give a file name in it"),
                         (tmp_path / "no" / "e.npy", f"--output_npy={tmp_path}/no/e.npy: the directory {tmp_path}/no "
                                                     "does not exist")):
        bad = run_script("extract_features.py", f"--input_file={tmp_path / 'in.txt'}", f"--output_npy={target}",
                         f"--init_checkpoint={google_release}", check=False)
        assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == f"extract_features.py: error: {says}"
