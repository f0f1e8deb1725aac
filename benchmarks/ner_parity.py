"""bert_mgpu's BertTagger against transformers' BertForTokenClassification on the same weights, data and
recipe, strictly paired by seed: entity F1 (conlleval's rules) on the same test set, and the training losses.
Results go to NOTES by hand.

    make data/python_ner/train.txt   # once: make ner-demo's sentences from Python's library reference
    python benchmarks/ner_parity.py --seeds=1,2,3 [--train_size=10000 --epochs=2]
    python benchmarks/ner_parity.py --made_up            # the made-up task of NOTES item 44

The data is make ner-demo's (real prose, the doc authors' roles as tags: MOD, CLASS, FUNC, EXC, ATTR): a fixed
sample of --train_size training sentences, the whole test.txt. Both sides fine-tune the demo MiniLM without
dropout on bert_mgpu's windows (each word's first WordPiece labelled), in float32: AdamW with google-bert's
weight decay, linear warmup and decay over all steps, clipping at 1.0, Keras' epsilon, batch 32. transformers
starts from bert_mgpu's initial head, takes bert_mgpu's batches in bert_mgpu's order and averages the loss
as two towers do (the mean of each half's mean over its labelled pieces), so what differs is the training
code alone (qa_parity.py's pairing). Both score with bert_mgpu.core.entities. Each run is its own process.
"""

import argparse
import json
import os
import pickle
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
from qa_parity import without_dropout  # noqa: E402

DATA = os.path.join(ROOT, "data", "python_ner")
RECIPE = dict(train_size=10000, epochs=2.0, learning_rate=1e-4, warmup_proportion=0.1, batch=32, max_seq_length=128)
LOG_EVERY = 10  # steps between the losses compared

PEOPLE = [["john", "smith"], ["mary"], ["peter", "brown"], ["anna"], ["david", "miller"], ["sarah", "jones"]]
PLACES = [["paris"], ["london"], ["new", "york"], ["berlin"], ["san", "francisco"], ["tokyo"], ["china"]]
ORGS = [["google"], ["general", "motors"], ["the", "united", "nations"], ["microsoft"], ["toyota"]]
FILLER = "yesterday today again later quickly really also then".split()


def _entity(words, kind):
    return [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def made_up_sentence(rng):
    """NOTES item 44's task: a template with its slots filled (entities that need context), filler around."""
    pick = lambda pool: pool[int(rng.integers(len(pool)))]  # noqa: E731
    o = lambda text: [(w, "O") for w in text.split()]  # noqa: E731
    templates = [
        lambda: _entity(pick(PEOPLE), "PER") + o("visited") + _entity(pick(PLACES), "LOC"),
        lambda: _entity(pick(PEOPLE), "PER") + o("works for") + _entity(pick(ORGS), "ORG") + o("in")
        + _entity(pick(PLACES), "LOC"),
        lambda: o("shares of") + _entity(["apple"], "ORG") + o("rose in") + _entity(pick(PLACES), "LOC"),
        lambda: _entity(pick(PEOPLE), "PER") + o("ate an apple in") + _entity(pick(PLACES), "LOC"),
        lambda: _entity(["jordan"], "PER") + o("scored for") + _entity(pick(ORGS), "ORG"),
        lambda: _entity(pick(PEOPLE), "PER") + o("flew to") + _entity(["jordan"], "LOC"),
        lambda: _entity(["washington"], "PER") + o("said that") + _entity(pick(PEOPLE), "PER") + o("was right"),
        lambda: o("the meeting in") + _entity(["washington"], "LOC") + o("with") + _entity(pick(ORGS), "ORG"),
        lambda: _entity(pick(ORGS), "ORG") + o("opened an office in") + _entity(pick(PLACES), "LOC"),
    ]
    parts = templates[int(rng.integers(len(templates)))]()
    before = [(str(w), "O") for w in rng.choice(FILLER, int(rng.integers(0, 3)))]
    after = [(str(w), "O") for w in rng.choice(FILLER, int(rng.integers(0, 3)))]
    return before + parts + after


def splits(made_up):
    """(train, test) as [(words, tags)]: the same for every seed and system."""
    if made_up:
        rows = [made_up_sentence(rng) for rng in [np.random.default_rng(100)] for _ in range(RECIPE["train_size"])]
        test = [made_up_sentence(rng) for rng in [np.random.default_rng(200)] for _ in range(500)]
        return [([w for w, _ in r], [t for _, t in r]) for r in rows], [([w for w, _ in r], [t for _, t in r])
                                                                       for r in test]
    from bert_mgpu.data.tagged import read_tagged

    train = [(s.tokens, s.tags) for s in read_tagged(os.path.join(DATA, "train.txt"))]
    chosen = np.random.default_rng(100).permutation(len(train))[:RECIPE["train_size"]]
    test = [(s.tokens, s.tags) for s in read_tagged(os.path.join(DATA, "test.txt"))]
    return [train[i] for i in sorted(chosen)], test


def ours(seed, model_dir, work, made_up):
    import keras

    import bert_mgpu
    from bert_mgpu.core.entities import entity_scores
    from bert_mgpu.data.tagged import Sentence, tag_set

    train, test = splits(made_up)
    sentences = [Sentence(f"train-{i}", w, t, 1) for i, (w, t) in enumerate(train)]
    labels = tag_set(sentences)
    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=RECIPE["batch"] // 2)
    tagger = bert_mgpu.BertTagger.from_pretrained(model_dir, labels=labels, towers=towers, precision="float32",
                                                  max_seq_length=RECIPE["max_seq_length"])
    windows = tagger._windows(sentences)
    steps = int(len(windows) / RECIPE["batch"] * RECIPE["epochs"])  # as fit counts them
    draw = lambda: [b[2].numpy().tolist() for b in tagger._train_dataset(windows, RECIPE["batch"], seed).take(steps)]  # noqa: E731
    order = draw()
    if draw() != order:
        raise SystemExit("the training batches are not the same for a seed: no strict pairing")
    test_sentences = [Sentence(f"test-{i}", w, None, 1) for i, (w, _) in enumerate(test)]
    with open(os.path.join(work, f"start_{seed}.pkl"), "wb") as f:
        pickle.dump({"kernel": tagger.model.head.kernel.numpy(), "bias": tagger.model.head.bias.numpy(),
                     "order": order, "windows": windows, "test_windows": tagger._windows(test_sentences),
                     "labels": labels}, f)
    started = time.monotonic()
    history = tagger.fit(sentences, os.path.join(work, f"ours_{seed}"), epochs=RECIPE["epochs"],
                         learning_rate=RECIPE["learning_rate"], warmup_proportion=RECIPE["warmup_proportion"],
                         seed=seed, overwrite=True, verbose=False, log_every=LOG_EVERY, **common.PAIRED_OPTIMIZER)
    seconds = time.monotonic() - started
    predicted = tagger.predict_tags([w for w, _ in test], batch_size=64)
    return (entity_scores([t for _, t in test], predicted)["f1"], seconds,
            dict(zip(history["step"], history["loss"])))


def transformers_run(seed, model_dir, work, made_up):
    import torch
    import transformers

    from bert_mgpu.core.entities import entity_scores
    from bert_mgpu.data.tagging_input import word_predictions

    _, test = splits(made_up)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    with open(os.path.join(work, f"start_{seed}.pkl"), "rb") as f:
        shared = pickle.load(f)  # bert_mgpu's initial head, windows and batches
    labels = shared["labels"]
    model = transformers.BertForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))
    with torch.no_grad():
        model.classifier.weight.copy_(torch.tensor(shared["kernel"].T))
        model.classifier.bias.copy_(torch.tensor(shared["bias"]))

    def tensors(windows):
        """Padded to the longest rounded up to 8, as bert_mgpu's batches (labels -1 where none)."""
        width = min(-(-max(len(w.token_ids) for w in windows) // 8) * 8, RECIPE["max_seq_length"])
        ids = torch.zeros((len(windows), width), dtype=torch.long)
        tags = torch.full((len(windows), width), -1, dtype=torch.long)
        for i, w in enumerate(windows):
            ids[i, :len(w.token_ids)] = torch.tensor(w.token_ids)
            tags[i, :len(w.labels)] = torch.tensor(w.labels)
        return ids, tags

    def half_loss(logits, tags):
        weight = (tags >= 0).float()
        per = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tags.clamp(min=0).reshape(-1),
                                                reduction="none") * weight.reshape(-1)
        return per.sum() / weight.sum().clamp(min=1.0)

    windows, half = shared["windows"], RECIPE["batch"] // 2

    def loss_of(batch):
        ids, tags = tensors([windows[i] for i in batch])
        logits = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=(ids != 0).long()).logits
        return (half_loss(logits[:half], tags[:half]) + half_loss(logits[half:], tags[half:])) / 2  # two towers

    losses, seconds = common.paired_torch_steps(model, shared["order"], loss_of, RECIPE["learning_rate"],
                                                RECIPE["warmup_proportion"], LOG_EVERY)
    model.eval()
    test_windows, logits = shared["test_windows"], []
    with torch.no_grad():
        for start in range(0, len(test_windows), 64):
            ids, _ = tensors(test_windows[start:start + 64])
            logits.extend(model(input_ids=ids, token_type_ids=torch.zeros_like(ids),
                                attention_mask=(ids != 0).long()).logits.numpy())
    ids = word_predictions(test_windows, logits, [len(w) for w, _ in test])
    predicted = [[labels[i] for i in row] for row in ids]
    return entity_scores([t for _, t in test], predicted)["f1"], seconds, losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train_size", type=int, default=None, help="training sentences (10000; made up: 400)")
    parser.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    parser.add_argument("--made_up", action="store_true", help="NOTES item 44's made-up task instead")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one system, one seed, this work directory
    parser.add_argument("--system", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    RECIPE.update(epochs=args.epochs, train_size=args.train_size or (400 if args.made_up else 10000))
    if args.made_up:
        RECIPE.update(max_seq_length=48)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.one:
        f1, seconds, losses = {"ours": ours, "transformers": transformers_run}[args.system](
            seeds[0], args.model_dir, args.one, args.made_up)
        print(json.dumps({"f1": f1, "seconds": seconds, "losses": losses}))
        return
    if not args.made_up and not os.path.exists(os.path.join(DATA, "train.txt")):
        raise SystemExit(f"{DATA}/train.txt is missing: run `make data/python_ner/train.txt`")
    work = tempfile.mkdtemp(prefix="ner_parity_")
    model_dir = without_dropout(work)
    print(f"recipe: {RECIPE}", flush=True)
    results = {}
    for seed in seeds:
        for system in ("ours", "transformers"):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run([sys.executable, __file__, f"--one={work}", f"--system={system}", f"--seeds={seed}",
                                  f"--epochs={args.epochs}", f"--train_size={RECIPE['train_size']}",
                                  f"--model_dir={model_dir}", *(["--made_up"] if args.made_up else [])], env=env,
                                 capture_output=True, text=True, check=True)
            results.setdefault(system, {})[seed] = json.loads(out.stdout.strip().splitlines()[-1])
            print(system, seed, {k: v for k, v in results[system][seed].items() if k != "losses"}, flush=True)
        mine, theirs = results["ours"][seed]["losses"], results["transformers"][seed]["losses"]
        print("  loss at step " + ", ".join(f"{s}: {float(mine[s]):.4f} / {float(theirs[s]):.4f}"
                                            for s in mine if s in theirs), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    for system, runs in results.items():
        f1 = [r["f1"] for r in runs.values()]
        print(f"{system}: entity F1 mean {100 * np.mean(f1):.2f} (seeds {', '.join(f'{100 * v:.2f}' for v in f1)}), "
              f"training {np.mean([r['seconds'] for r in runs.values()]):.0f} s a run")
    gaps = [100 * (results["ours"][s]["f1"] - results["transformers"][s]["f1"]) for s in seeds]
    print(f"paired F1 difference (ours - transformers), points: mean {np.mean(gaps):+.2f}, per seed "
          f"{', '.join(f'{g:+.2f}' for g in gaps)}")


if __name__ == "__main__":
    main()
