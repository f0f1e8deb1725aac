"""Hugging Face transformers (PyTorch CPU build) with a plain training loop, bf16 autocast or float32
(`common.precision()`).

Its usual pipeline for Rotten Tomatoes: the fast tokenizer on each batch with dynamic padding (what
DataCollatorWithPadding does); for NER sentences the same with words split beforehand and each word's first
piece labelled (run_ner.py's tokenize_and_align_labels, DataCollatorForTokenClassification). Masked LM
computes logits at every position, as BertForMaskedLM does.

Usage: python benchmarks/bench_transformers.py CASE
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def main(case):
    spec = common.CASES[case]
    shape = common.SHAPES[spec["shape"]]
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], intermediate_size=shape["inter"], hidden_act="gelu",
        max_position_embeddings=512, num_labels=2)
    if spec["mode"] == "mlm":
        model = transformers.BertForMaskedLM(config)
    elif spec["mode"] == "span":
        model = transformers.BertForQuestionAnswering(config)
    elif spec.get("head") == "tag":
        config.num_labels = len(common.NER_TAGS)
        model = transformers.BertForTokenClassification(config)
    else:
        model = transformers.BertForSequenceClassification(config)
    b = common.BATCH

    if spec["data"] == "ner":
        tokenizer = transformers.BertTokenizerFast(vocab_file=common.VOCAB, do_lower_case=True)
        rows = common.ner_sentences("test" if spec["mode"] == "predict" else "train")
        if spec["mode"] != "predict":
            rows = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
        label_of = {t: i for i, t in enumerate(common.NER_TAGS)}

        def batches():
            while True:
                for i in range(0, len(rows), b):
                    chunk = rows[i:i + b]
                    enc = tokenizer([w for w, _ in chunk], is_split_into_words=True, padding=True, truncation=True,
                                    max_length=common.SEQ, return_tensors="pt")
                    labels = torch.full(enc["input_ids"].shape, -100, dtype=torch.long)
                    for row, (_, tags) in enumerate(chunk):
                        before = None
                        for position, word in enumerate(enc.word_ids(row)):
                            if word is not None and word != before:
                                labels[row, position] = label_of[tags[word]]
                            before = word
                    yield dict(enc), labels
    elif spec["data"] == "rt":
        tokenizer = transformers.BertTokenizerFast(vocab_file=common.VOCAB, do_lower_case=True)
        rows = common.rotten_tomatoes("dev" if spec["mode"] == "predict" else "train")
        if spec["mode"] != "predict":
            rows = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]

        def batches():
            while True:
                for i in range(0, len(rows), b):
                    chunk = rows[i:i + b]
                    enc = tokenizer([t for t, _ in chunk], padding=True, truncation=True,
                                    max_length=common.SEQ, return_tensors="pt")
                    yield dict(enc), torch.tensor([y for _, y in chunk])
    else:
        d = common.synthetic(8 * b, seq=spec.get("seq", common.SEQ))
        ids = d["masked_ids"] if spec["mode"] == "mlm" else d["token_ids"]
        if spec["mode"] == "mlm":
            target = np.full_like(ids, -100)
            np.put_along_axis(target, d["mask_positions"], d["mask_ids"], 1)
        elif spec["mode"] == "span":
            target = d["spans"]
        else:
            target = d["labels"]

        def batches():
            while True:
                for i in range(0, len(ids), b):
                    yield ({"input_ids": torch.from_numpy(ids[i:i + b]).long(),
                            "token_type_ids": torch.from_numpy(d["segment_ids"][i:i + b]).long(),
                            "attention_mask": torch.from_numpy(d["padding_mask"][i:i + b]).long()},
                           torch.from_numpy(target[i:i + b]).long())

    bf16 = common.precision() == "bf16"
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    if spec["mode"] == "predict":
        model.eval()
        real = spec["data"] in ("rt", "ner")  # passes over a real set: the first warms up
        passes = 2 if real else 1
        n = len(range(0, len(rows), b)) if real else spec["warmup"] + spec["steps"]
        meter = common.Meter(n if real else spec["warmup"])
        it = batches()
        with torch.inference_mode(), autocast():
            for _ in range(n * passes if real else n):
                x, _ = next(it)
                model(**x).logits.float()
                meter.step(x["attention_mask"].sum(1).numpy())
    else:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
        meter = common.Meter(spec["warmup"])
        it = batches()
        for _ in range(spec["warmup"] + spec["steps"]):
            x, y = next(it)
            with autocast():
                if spec["mode"] == "span":
                    loss = model(**x, start_positions=y[:, 0], end_positions=y[:, 1]).loss
                else:
                    loss = model(**x, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            meter.step(x["attention_mask"].sum(1).numpy())
    common.emit(meter.result("transformers", case, shape, spec["mode"], precision=common.precision(),
                             attention=model.config._attn_implementation))


if __name__ == "__main__":
    main(sys.argv[1])
