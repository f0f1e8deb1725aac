"""The CLUE suite (classification tasks): every task fine-tuned with CLUE's baseline recipe, its dev accuracy,
the leaderboard's submission files and the table CLUE prints. Each task's files, labels and recipe are
clue_tasks.py's. The twin of glue.py.

Example:
    results = clue.run("CLUEdataset", "chinese_L-12_H-768_A-12", "clue", tasks=["afqmc", "tnews"], towers=towers)
    print(clue.table(results))
"""

import logging
import os

from bert_mgpu.api.classifier import BertClassifier
from bert_mgpu.core import storage
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.clue_tasks import ALIASES, TASKS, submission_lines
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import reporting

log = logging.getLogger("bert_mgpu")


def task_scores(results):
    """{task title: dev accuracy x 100, ..., "Score": their mean}, CLUE's numbers."""
    scores = {TASKS[t].title: 100 * results[t]["eval_accuracy"] for t in TASKS if t in results}
    if scores:
        scores["Score"] = sum(scores.values()) / len(scores)
    return scores


def table(results):
    """CLUE's table: Score (the mean) first, then each task's dev accuracy. Markdown."""
    scores = task_scores(results)
    titles = ["Score", *[t for t in scores if t != "Score"]]
    return "\n".join(["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles),
                      "| " + " | ".join(f"{scores[t]:.2f}" for t in titles) + " |"])


def resolve(tasks):
    """--tasks -> CLUE task names, in the table's order; UserError naming an unknown one."""
    names = [ALIASES.get(t, t) for t in (tasks or list(TASKS))]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise UserError(f"--tasks: unknown {', '.join(unknown)} (CLUE's are {', '.join(TASKS)})")
    return [t for t in TASKS if t in names]


def run(clue_dir, init_checkpoint, output_dir, tasks=None, towers=None, do_predict=True, precision="auto",
        max_seq_length=None, epochs=None, learning_rate=None, batch_size=None, eval_batch_size=32, seed=12345,
        **fit_args):
    """Fine-tune each task (every one by default) with its recipe and evaluate it on dev; returns
    {task: eval results}. Each trains in `output_dir/<task>` (rerun to resume). `max_seq_length`,
    `epochs`, `learning_rate`, `batch_size` (per tower) replace every task's recipe; `fit_args` go to every
    `fit`. With `do_predict`, the leaderboard files go to `output_dir/submission/`. Writes
    `clue_results.md` (`table`) and `clue_results.tsv` (every metric)."""
    towers = towers or Towers()
    results, submission_dir = {}, os.path.join(output_dir, "submission")
    for name in resolve(tasks):
        task = TASKS[name]
        folder = task.directory(clue_dir)
        labels = task.label_list(folder)
        train, _ = task.read(folder, "train", labels)
        labels = labels or sorted({e.label for e in train})
        dev, _ = task.read(folder, "dev", labels)
        clf = BertClassifier.from_pretrained(init_checkpoint, labels=labels, towers=towers, precision=precision,
                                             max_seq_length=max_seq_length or task.max_seq_length, task=name)
        log.info("CLUE %s: %d training examples, %g epochs at %g", task.title, len(train), epochs or task.epochs,
                 learning_rate or task.learning_rate)
        clf.fit(train, os.path.join(output_dir, name), epochs=epochs or task.epochs,
                learning_rate=learning_rate or task.learning_rate, seed=seed,
                train_batch_size=batch_size or task.batch_size, **fit_args)
        if clf.interrupted:
            raise UserError(f"CLUE {task.title}: interrupted by {clf.interrupted}; rerun to resume")
        results[name] = clf.evaluate(dev, batch_size=eval_batch_size)
        if towers.is_chief:
            reporting.report_results(fit_args.get("report_to"), os.path.join(output_dir, name), results[name],
                                     clf.global_step)
        log.info("CLUE %s: accuracy %.4f", task.title, results[name]["eval_accuracy"])
        if do_predict:
            if not os.path.exists(os.path.join(folder, "test.json")):
                log.warning("no %s: CLUE %s is not predicted", os.path.join(folder, "test.json"), task.title)
                continue
            test, ids = task.read(folder, "test", labels)
            predicted = clf.predict(test, batch_size=eval_batch_size).argmax(axis=1)
            if towers.is_chief:
                storage.makedirs(submission_dir)
                storage.write_atomic(os.path.join(submission_dir, task.submission), submission_lines(
                    task, ids, [clf.labels[i] for i in predicted], task.descriptions(folder)))
    if towers.is_chief:
        storage.write_atomic(os.path.join(output_dir, "clue_results.md"), table(results) + "\n")
        rows = [f"{TASKS[t].title}\t{m}\t{results[t][m]:.6f}" for t in results for m in sorted(results[t])
                if m.startswith("eval_")]
        storage.write_atomic(os.path.join(output_dir, "clue_results.tsv"),
                             "task\tmetric\tvalue\n" + "\n".join(rows) + "\n")
    return results
