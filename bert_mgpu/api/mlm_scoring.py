"""Fill-mask and pseudo-perplexity with a pretrainer's masked-LM head, every tower reading its share of the
rows (BertPretrainer.fill_mask / .score; score_text_mgpu.py).

Pseudo-perplexity (Salazar et al., 2020, "Masked Language Model Scoring"; bert-ad's run_lm_predict): each
token of a text masked in turn, its log-probability read where it was masked; the text's pseudo-log-
likelihood is their sum and its pseudo-perplexity exp(-mean).

Example:
    pre = bert_mgpu.BertPretrainer.from_pretrained("chinese_L-12_H-768_A-12", towers=towers, nsp=False)
    pre.fill_mask("今天天[MASK]很好", top_k=5)      # [{"token_str": "气", "score": ..., "sequence": ...}, ...]
    pre.score(["今天天气很好"])                     # [{"tokens": [...], "log_probs": [...], ...}]
"""

import math

import numpy as np

from bert_mgpu.core.errors import UserError
from bert_mgpu.data import masked_rows
from bert_mgpu.data.tokenization import SPECIAL_TOKENS
from bert_mgpu.model.mlm_scorer import masked_lm_scorer, split_scores
from bert_mgpu.train.training import Trainer


def _run(pre, rows, top_k, batch_size):
    scorer = masked_lm_scorer(pre.model, top_k)
    dataset = masked_rows.row_dataset(rows, pre.tokenizer, pre.towers.batch(batch_size), pre.towers.batch(1))
    out, _ = Trainer(pre.towers.strategy, scorer).predict_logits(dataset)
    return split_scores(out, top_k)


def _encode(pre, texts, max_seq_length):
    if pre.tokenizer.mask_id is None:
        raise UserError(f"{pre.tokenizer.vocab_file}: vocabulary has no [MASK] token")
    if any(name.startswith("cls/predictions/") for name in pre.fresh_heads):
        raise UserError("the checkpoint has no masked-LM head (cls/predictions/...): its scores would come from "
                        "random weights. Use a pretraining release (Google's bert_model.ckpt, transformers' "
                        "BertForMaskedLM or BertForPreTraining) or run_pretraining_mgpu.py's output")
    ids = [masked_rows.encode(pre.tokenizer, t) for t in texts]
    masked_rows.check_length(ids, max_seq_length, "text")
    return ids


def fill_mask(pre, texts, top_k=5, batch_size=32, max_seq_length=512):
    """For each text, for each of its [MASK]s, the `top_k` tokens the head puts there: [{"token",
    "token_str", "score" (probability), "sequence" (the text with it filled in)}], most likely first."""
    ids = _encode(pre, texts, max_seq_length)
    rows = masked_rows.mask_rows(ids, pre.tokenizer)
    vocab, out = pre.tokenizer.vocab, []
    special = {vocab.index(t) for t in SPECIAL_TOKENS if t in vocab}  # [UNK], [CLS], ... are never a fill
    _, top_log_probs, top_ids = _run(pre, rows, min(top_k + len(special), len(vocab)), batch_size)
    for i, text in enumerate(texts):
        parts, per_mask = text.split(masked_rows.MASK_TEXT), []
        for m in range(len(rows[i][1])):
            kept = [(int(t), lp) for t, lp in zip(top_ids[i, m], top_log_probs[i, m]) if int(t) not in special]
            per_mask.append([{"token": t, "token_str": vocab[t], "score": float(math.exp(lp)),
                              "sequence": _sequence(parts, m, vocab[t])} for t, lp in kept[:top_k]])
        out.append(per_mask)
    return out


def _sequence(parts, m, token):
    """The text (cut at its [MASK]s into `parts`) with its m-th [MASK] replaced by `token`; a `##` piece
    joins the word before it, as transformers' decoding joins it."""
    out = parts[0]
    for k, part in enumerate(parts[1:]):
        if k == m and token.startswith("##"):
            out = out.rstrip(" ") + token[2:] + part
        else:
            out += (token if k == m else masked_rows.MASK_TEXT) + part
    return out


def score(pre, texts, batch_size=32, max_seq_length=512):
    """Each text's tokens, each token's log-probability with it masked (natural log) and probability, the
    pseudo-log-likelihood (their sum) and the pseudo-perplexity exp(-mean log-probability); None for a text
    with no token (white space or control characters alone), which has no mean (JSON has no NaN)."""
    ids = _encode(pre, texts, max_seq_length)
    rows, owners = masked_rows.masked_copies(ids, pre.tokenizer)
    log_probs = _run(pre, rows, 1, batch_size)[0][:, 0] if rows else np.zeros([0])
    by_text = [[] for _ in texts]
    for (i, _), lp in zip(owners, log_probs):
        by_text[i].append(float(lp))
    vocab = pre.tokenizer.vocab
    return [{"tokens": [vocab[t] for t in row], "log_probs": lps, "probabilities": [math.exp(v) for v in lps],
             "pseudo_log_likelihood": sum(lps),
             "pseudo_perplexity": math.exp(-sum(lps) / len(lps)) if lps else None}
            for row, lps in zip(ids, by_text)]
