"""bert_mgpu's BertMultipleChoice against transformers' BertForMultipleChoice on the same weights, data and recipe,
strictly paired by seed: dev accuracy and the training losses. Results go to NOTES by hand.

    make data/python_qa/train.json   # once: make qa-demo's questions on Python's reference docs
    python benchmarks/mc_parity.py --seeds=1,2,3 [--epochs=2]

No registry package ships a multiple-choice set, so the questions are make qa-demo's, asked as multiple choice:
"What does NAME() return?" with, as choices, the answers of every entry of its context (two to four, so
questions have different numbers of choices), and the context read with each. The context is each entry's
name and first sentence ("abs(): Return the absolute value of a number."), in the page's order: make
qa-demo's whole paragraphs (a median of 185 pieces with a choice) would be cut, answers and all, at a
length four choices a question can afford here; these fit 192 pieces but for 3%. Both sides fine-tune the demo
MiniLM without dropout on bert_mgpu's encoding (data/choice_input.py), in float32: AdamW with google-bert's
weight decay, linear warmup and decay over all steps, clipping at 1.0, Keras' epsilon. transformers starts
from bert_mgpu's initial head and takes bert_mgpu's batches in bert_mgpu's order, padded choices masked out of
its softmax as bert_mgpu masks them, so what differs is the training code alone (qa_parity.py's pairing).
Each run is its own process.
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
from qa_parity import MINILM, without_dropout  # noqa: E402

DATA = os.path.join(ROOT, "data", "python_qa")
RECIPE = dict(epochs=2.0, learning_rate=1e-4, warmup_proportion=0.1, batch=16, max_seq_length=192)
LOG_EVERY = 10  # steps between the losses compared


def questions(split):
    """make qa-demo's questions as multiple choice: the context's answers are the choices."""
    from bert_mgpu.data.choices import ChoiceQuestion

    with open(os.path.join(DATA, f"{split}.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    out = []
    for article in data:
        for paragraph in article["paragraphs"]:
            answers = [qa["answers"][0]["text"] for qa in paragraph["qas"]]
            if len(set(answers)) < len(answers) or len(answers) < 2:
                continue  # two entries with one answer: not a question with one right choice
            names = [qa["question"][len("What does "):-len(" return?")] for qa in paragraph["qas"]]
            context = " ".join(f"{name}: Return {answer}." for name, answer in zip(names, answers))
            for k, qa in enumerate(paragraph["qas"]):
                out.append(ChoiceQuestion(qa["id"], context, qa["question"], answers, k))
    return out


def batch_order(mc, rows, steps, seed):
    """The question indices of each of fit's first `steps` batches (its own dataset, as fit builds it)."""
    def draw():
        return [b[2].numpy().tolist() for b in mc._train_dataset(rows, RECIPE["batch"], seed).take(steps)]

    order = draw()
    if draw() != order:
        raise SystemExit("the training batches are not the same for a seed: no strict pairing")
    return order


def ours(seed, model_dir, work):
    import keras

    import bert_mgpu

    train, dev = questions("train"), questions("dev")
    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=RECIPE["batch"] // 2)
    mc = bert_mgpu.BertMultipleChoice.from_pretrained(model_dir, towers=towers, precision="float32",
                                                      max_seq_length=RECIPE["max_seq_length"])
    rows = mc._encode(train)
    steps = int(len(train) / RECIPE["batch"] * RECIPE["epochs"])  # as fit counts them
    np.savez(os.path.join(work, f"start_{seed}.npz"), kernel=mc.model.head.kernel.numpy(),
             bias=mc.model.head.bias.numpy(), order=np.array(batch_order(mc, rows, steps, seed)))
    started = time.monotonic()
    history = mc.fit(train, os.path.join(work, f"ours_{seed}"), epochs=RECIPE["epochs"],
                     learning_rate=RECIPE["learning_rate"], warmup_proportion=RECIPE["warmup_proportion"], seed=seed,
                     overwrite=True, verbose=False, log_every=LOG_EVERY, **common.PAIRED_OPTIMIZER)
    seconds = time.monotonic() - started
    return mc.evaluate(dev, batch_size=16)["eval_accuracy"], seconds, dict(zip(history["step"], history["loss"]))


def transformers_run(seed, model_dir, work):
    import torch
    import transformers

    from bert_mgpu.data.choice_input import encode_questions
    from bert_mgpu.data.tokenization import FullTokenizer

    train, dev = questions("train"), questions("dev")
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    tokenizer = FullTokenizer(os.path.join(MINILM, "vocab.txt"), True)
    model = transformers.BertForMultipleChoice.from_pretrained(model_dir)
    shared = np.load(os.path.join(work, f"start_{seed}.npz"))  # bert_mgpu's initial head and batches
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor(shared["kernel"].T))
        model.classifier.bias.copy_(torch.tensor(shared["bias"]))

    def scores(rows, index):
        width = int(rows.lengths[index].max())
        ids = torch.tensor(rows.token_ids[index, :, :width], dtype=torch.long)
        out = model(input_ids=ids, token_type_ids=torch.tensor(rows.segment_ids[index, :, :width], dtype=torch.long),
                    attention_mask=(ids != 0).long()).logits
        return out.masked_fill(ids[:, :, 0] == 0, -1e4)  # a padded choice, as bert_mgpu's model

    rows = encode_questions(train, tokenizer, RECIPE["max_seq_length"])
    steps = int(len(train) / RECIPE["batch"] * RECIPE["epochs"])
    labels = torch.tensor(rows.labels).long()
    losses, seconds = common.paired_torch_steps(
        model, shared["order"].tolist()[:steps],
        lambda batch: torch.nn.functional.cross_entropy(scores(rows, np.array(batch)), labels[np.array(batch)]),
        RECIPE["learning_rate"], RECIPE["warmup_proportion"], LOG_EVERY)
    model.eval()
    dev_rows = encode_questions(dev, tokenizer, RECIPE["max_seq_length"])
    with torch.no_grad():
        chosen = np.concatenate([scores(dev_rows, np.arange(i, min(i + 16, len(dev)))).argmax(1).numpy()
                                 for i in range(0, len(dev), 16)])
    return float(np.mean(chosen == dev_rows.labels)), seconds, losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one system, one seed, this work directory
    parser.add_argument("--system", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", default=MINILM, help=argparse.SUPPRESS)
    args = parser.parse_args()
    RECIPE.update(epochs=args.epochs)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.one:
        accuracy, seconds, losses = {"ours": ours, "transformers": transformers_run}[args.system](
            seeds[0], args.model_dir, args.one)
        print(json.dumps({"accuracy": accuracy, "seconds": seconds, "losses": losses}))
        return
    if not os.path.exists(os.path.join(DATA, "train.json")):
        raise SystemExit(f"{DATA}/train.json is missing: run `make data/python_qa/train.json`")
    work = tempfile.mkdtemp(prefix="mc_parity_")
    model_dir = without_dropout(work)
    train, dev = questions("train"), questions("dev")
    blind = np.mean([1 / len(q.choices) for q in dev])
    print(f"{len(train)} training and {len(dev)} dev questions; choosing at random: {blind:.3f}", flush=True)
    results = {}
    for seed in seeds:
        for system in ("ours", "transformers"):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run([sys.executable, __file__, f"--one={work}", f"--system={system}", f"--seeds={seed}",
                                  f"--epochs={args.epochs}", f"--model_dir={model_dir}"], env=env,
                                 capture_output=True, text=True, check=True)
            results.setdefault(system, {})[seed] = json.loads(out.stdout.strip().splitlines()[-1])
            print(system, seed, {k: v for k, v in results[system][seed].items() if k != "losses"}, flush=True)
        mine, theirs = results["ours"][seed]["losses"], results["transformers"][seed]["losses"]
        print("  loss at step " + ", ".join(f"{s}: {float(mine[s]):.4f} / {float(theirs[s]):.4f}"
                                            for s in mine if s in theirs), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    for system, runs in results.items():
        accuracy = [r["accuracy"] for r in runs.values()]
        print(f"{system}: dev accuracy mean {np.mean(accuracy):.4f} (seeds {', '.join(f'{a:.4f}' for a in accuracy)}), "
              f"training {np.mean([r['seconds'] for r in runs.values()]):.0f} s a run")
    gaps = [results["ours"][s]["accuracy"] - results["transformers"][s]["accuracy"] for s in seeds]
    print(f"paired accuracy difference (ours - transformers): mean {np.mean(gaps):+.4f}, per seed "
          f"{', '.join(f'{g:+.4f}' for g in gaps)}")


if __name__ == "__main__":
    main()
