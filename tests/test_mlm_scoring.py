"""Fill-mask and pseudo-perplexity (BertPretrainer.fill_mask / .score, score_text_mgpu.py) against
transformers' BertForMaskedLM on the exported weights, on two towers."""

import json
import math

import numpy as np
import pytest
from conftest import WORDS, run_script, tiny_config, write_vocab

import bert_mgpu
from bert_mgpu.core.errors import UserError
from bert_mgpu.data import masked_rows

TEXTS = ["the movie was very good", "a dull plot [MASK] a boring story", "it [MASK] not [MASK]",
         "brilliant", "the actor and the story of this film was great but the plot was dull and boring"]


@pytest.fixture(scope="module")
def pretrainer(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlm")
    write_vocab(str(d / "vocab.txt"), list(WORDS) + ["##s", "##ing"])
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    pre = bert_mgpu.BertPretrainer.from_config(tiny_config(len(WORDS) + 12), str(d / "vocab.txt"), towers=towers,
                                              precision="float32", nsp=False)
    rng = np.random.default_rng(0)
    for var in pre.model.weights:  # weights far from their initialization: probabilities that differ
        var.assign(var.numpy() + rng.normal(0, 0.3, var.shape).astype(np.float32))
    pre.export(str(d / "hf"), format="hf")
    pre.save_finetune_checkpoint(str(d / "model"), 0)
    return pre, d


def reference_log_probs(model, tok, text):
    """transformers: each token masked in turn, its log-probability there."""
    import torch

    ids = [tok.cls_id, *tok.id_lists([text])[0], tok.sep_id]
    out = []
    for t in range(1, len(ids) - 1):
        copy = list(ids)
        copy[t] = tok.mask_id
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([copy])).logits[0, t]
        out.append(float(torch.log_softmax(logits, -1)[ids[t]]))
    return out


def test_scores_equal_transformers_masked_lm_and_fill_mask_its_top_tokens(reference, pretrainer):
    import torch
    import transformers

    pre, d = pretrainer
    model = transformers.BertForMaskedLM.from_pretrained(str(d / "hf")).eval()
    plain = [t for t in TEXTS if "[MASK]" not in t]
    scores = pre.score(plain, batch_size=3)  # 3 copies a tower: the texts' copies cross batches and towers
    for text, s in zip(plain, scores):
        ref = reference_log_probs(model, pre.tokenizer, text)
        assert s["tokens"] == pre.tokenizer.tokenize(text) and len(s["log_probs"]) == len(ref)
        np.testing.assert_allclose(np.exp(s["log_probs"]), np.exp(ref), atol=1e-4)
        np.testing.assert_allclose(s["pseudo_perplexity"], math.exp(-np.mean(ref)), rtol=1e-4)
        np.testing.assert_allclose(s["pseudo_log_likelihood"], sum(ref), atol=1e-3)
    assert max(s["pseudo_perplexity"] for s in scores) / min(s["pseudo_perplexity"] for s in scores) > 1.2

    one = pre.fill_mask("a dull plot [MASK] a boring story", top_k=4)
    two = pre.fill_mask("it [MASK] not [MASK]", top_k=4)
    assert [len(one), len(two), len(two[0])] == [4, 2, 4]  # one [MASK]: its list; two: a list each
    tok = pre.tokenizer
    for text, fills in (("a dull plot [MASK] a boring story", [one]), ("it [MASK] not [MASK]", two)):
        pieces = text.split("[MASK]")
        ids = [tok.cls_id]
        for k, piece in enumerate(pieces):
            ids += tok.id_lists([piece])[0] + ([tok.mask_id] if k < len(pieces) - 1 else [])
        ids.append(tok.sep_id)
        where = [i for i, t in enumerate(ids) if t == tok.mask_id]
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0], -1).numpy()
        for at, fill in zip(where, fills):
            special = [tok.vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
            best = np.array([t for t in np.argsort(-probs[at]) if t not in special][:4])  # never a special token
            assert [f["token"] for f in fill] == best.tolist()
            np.testing.assert_allclose([f["score"] for f in fill], probs[at][best], atol=1e-4)
    def filled(before, token, after):
        return (before.rstrip(" ") + token[2:] if token.startswith("##") else before + token) + after

    assert one[0]["sequence"] == filled("a dull plot ", one[0]["token_str"], " a boring story")
    assert two[1][0]["sequence"] == filled("it [MASK] not ", two[1][0]["token_str"], "")


def test_the_script_writes_a_line_a_text_and_names_bad_lines(pretrainer, tmp_path):
    pre, d = pretrainer
    texts = tmp_path / "texts.txt"
    texts.write_text("the movie was very good\n\nbrilliant\n\x01\x02\n", encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    proc = run_script("score_text_mgpu.py", f"--input_file={texts}", f"--output_file={out}",
                      f"--init_checkpoint={d / 'model'}", "--n_gpus=0", "--towers_per_gpu=2", "--batch_size=2")
    strict = lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not JSON"))  # noqa: E731
    rows = [json.loads(line, parse_constant=strict) for line in out.read_text(encoding="utf-8").splitlines()]
    expected = pre.score(["the movie was very good", "brilliant"])
    assert [r["line"] for r in rows] == [1, 3, 4]
    for row, want in zip(rows, expected):
        np.testing.assert_allclose(row["log_probs"], want["log_probs"], atol=1e-5)
    # Control characters alone: no token, so no mean; null, not NaN, and the mean over the other two.
    assert rows[2]["tokens"] == [] and rows[2]["pseudo_perplexity"] is None
    mean = (expected[0]["pseudo_perplexity"] + expected[1]["pseudo_perplexity"]) / 2
    assert f"mean pseudo-perplexity {mean:.3f} over 2 texts" in proc.stderr, proc.stderr[-2000:]
    assert f"{texts}: line(s) 4 hold no token to score" in proc.stderr
    masked = tmp_path / "masked.txt"
    masked.write_text("the [MASK] was good\nno mask here\n", encoding="utf-8")
    proc = run_script("score_text_mgpu.py", "--mode=fill_mask", f"--input_file={masked}",
                      f"--output_file={tmp_path / 'fills.jsonl'}", f"--init_checkpoint={d / 'model'}", "--n_gpus=0",
                      check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"score_text_mgpu.py: error: {masked}:2: no [MASK] to fill")
    assert not (tmp_path / "fills.jsonl").exists()


def test_a_checkpoint_without_a_masked_lm_head_and_a_text_too_long_are_refused(minilm_dir):
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2)
    minilm = bert_mgpu.BertPretrainer.from_pretrained(minilm_dir, towers=towers, nsp=False)  # an encoder alone
    with pytest.raises(UserError, match=r"^the checkpoint has no masked-LM head \(cls/predictions/...\)"):
        minilm.score(["the movie"])
    with pytest.raises(UserError, match=r"^text 2: 9 tokens; with \[CLS\] and \[SEP\] longer than --max_seq_length=10"):
        masked_rows.check_length([[1] * 8, [1] * 9], 10, "text")
