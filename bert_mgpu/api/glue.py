"""The GLUE suite: every task trained and scored with its usual recipe, the leaderboard files and the table
papers print. Each task's files, metrics and recipe are glue_tasks.py's.

Example:
    task = bert_mgpu.get_task("qnli")            # glue_data/QNLI/{train,dev,test}.tsv
    print(glue.table({"mrpc": {"eval_f1": 0.88, "eval_accuracy": 0.84}}))
"""

import logging
import os

from bert_mgpu.api.classifier import BertClassifier
from bert_mgpu.core import storage
from bert_mgpu.core.errors import Interrupted, UserError
from bert_mgpu.data.glue_tasks import ALIASES, ENTAILMENT, NLI, TASKS, GlueTask  # noqa: F401 (glue.NLI, ... as before)
from bert_mgpu.data.tasks import get_task
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import reporting

log = logging.getLogger("bert_mgpu")


def score(task, results):
    """A task's GLUE score: the mean of its official metrics, x 100."""
    values = [results[m] for m in TASKS[task].metrics if m in results]
    return 100 * sum(values) / len(values) if values else None


def task_scores(results):
    """{task title: GLUE score, ..., "Average": their mean}, the numbers of `table`'s score row."""
    scores = {}
    for name, task in TASKS.items():
        if name in ("ax", "mnli-mm") or name not in results:
            continue
        scores[task.title] = score(name, results[name])
        if name == "mnli" and "mnli-mm" in results:  # one task of the average: matched and mismatched
            scores[task.title] = (scores[task.title] + score("mnli-mm", results["mnli-mm"])) / 2
    if scores:
        scores["Average"] = sum(scores.values()) / len(scores)
    return scores


def table(results):
    """The GLUE table as papers print it: a header row of task titles, a row of scores (two metrics as
    "F1/accuracy", MNLI as "m/mm"), and the average of the tasks' scores (a task's score is the mean of its
    metrics, MNLI's the mean of matched and mismatched). Markdown."""
    titles, cells = [], []
    for name, task in TASKS.items():
        if name in ("ax", "mnli-mm") or name not in results:
            continue
        r = results[name]
        cell = "/".join(f"{100 * r[m]:.1f}" for m in task.metrics)
        titles.append(task.title)
        if name == "mnli":
            titles[-1] = "MNLI-m/mm"
            if "mnli-mm" in results:
                cell += f"/{100 * results['mnli-mm']['eval_accuracy']:.1f}"
        cells.append(cell)
    average = task_scores(results).get("Average")
    titles.append("Average")
    cells.append(f"{average:.1f}" if average is not None else "")
    return "\n".join(["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles), "| " + " | ".join(cells) + " |"])


def submission(task, predictions, labels):
    """GLUE leaderboard file text for `task`: `index<TAB>prediction`, one row per test example in order;
    predictions are probabilities [N, labels] (or scores [N] for STS-B)."""
    if task == "sts-b":
        rows = [f"{min(max(float(x), 0.0), 5.0):.3f}" for x in predictions]  # the leaderboard takes 0..5
    else:
        rows = [labels[i] for i in predictions.argmax(axis=1)]
    return "index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in enumerate(rows))


def submission_path(directory, task):
    return os.path.join(directory, f"{TASKS[task].title}.tsv")


def run(glue_dir, init_checkpoint, output_dir, tasks=None, towers=None, do_predict=True, precision="auto",
        max_seq_length=128, epochs=None, learning_rate=None, batch_size=None, eval_batch_size=32, seed=12345,
        truncation="head", **fit_args):
    """Fine-tune and evaluate each task (every one by default) with its recipe; returns {task: eval results}.

    Each task trains in `output_dir/<task>` (rerun to resume); MNLI's model is evaluated on both dev sets
    and predicts AX. `epochs`, `learning_rate`, `batch_size` (per tower) replace every task's recipe;
    `truncation` is every task's (`BertClassifier`); `fit_args` go to every `fit` (use_xla, recompute, ...).
    With `do_predict`, the leaderboard files go to `output_dir/submission/`. Writes `glue_results.md`
    (`table`) and `glue_results.tsv` (every metric) in output_dir.
    """
    names = [ALIASES.get(t, t) for t in (tasks or [t for t in TASKS if t not in ("mnli-mm", "ax")])]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise UserError(f"--tasks: unknown {', '.join(unknown)} (GLUE's are {', '.join(TASKS)})")
    towers = towers or Towers()
    results, submission_dir = {}, os.path.join(output_dir, "submission")
    for name in [t for t in names if t not in ("mnli-mm", "ax")]:
        spec, task = TASKS[name], get_task(name)
        data = os.path.join(glue_dir, spec.directory)
        train = task.get_examples(data, "train")
        labels = task.get_labels(data, train)
        clf = BertClassifier.from_pretrained(init_checkpoint, labels=labels, towers=towers, precision=precision,
                                             max_seq_length=max_seq_length, task=name, task_type=task.task_type,
                                             truncation=truncation)
        log.info("GLUE %s: %d training examples, %g epochs at %g", spec.title, len(train),
                 epochs or spec.epochs, learning_rate or spec.learning_rate)
        clf.fit(train, os.path.join(output_dir, name), epochs=epochs or spec.epochs,
                learning_rate=learning_rate or spec.learning_rate, seed=seed,
                train_batch_size=batch_size or spec.batch_size, **fit_args)
        if clf.interrupted:
            raise Interrupted(f"GLUE {spec.title}: interrupted by {clf.interrupted}; rerun to resume", clf.interrupted)
        evaluated = [name] + (["mnli-mm"] if name == "mnli" else [])
        for each in evaluated:
            other = get_task(each)
            results[each] = clf.evaluate(other.get_examples(data, "dev"), batch_size=eval_batch_size)
            if towers.is_chief:  # the task's W&B/MLflow run and HParams, when fit reported to them
                reporting.report_results(fit_args.get("report_to"), os.path.join(output_dir, name),
                                         {k.replace("eval_", "eval_mm_", 1) if each == "mnli-mm" else k: v
                                          for k, v in results[each].items()}, clf.global_step)
            log.info("GLUE %s: %s", TASKS[each].title, {m: round(results[each][m], 4) for m in TASKS[each].metrics})
        if do_predict:
            storage.makedirs(submission_dir)
            for each in evaluated + (["ax"] if name == "mnli" else []):
                where = data if each != "ax" else os.path.join(glue_dir, TASKS["ax"].directory)
                if each == "ax" and not storage.exists(os.path.join(where, "diagnostic.tsv")):
                    log.warning("no %s: GLUE's diagnostic set (AX) is not predicted", where)
                    continue
                predicted = clf.predict(get_task(each).get_examples(where, "test"), batch_size=eval_batch_size)
                storage.write_atomic(submission_path(submission_dir, each), submission(each, predicted, clf.labels))
    storage.write_atomic(os.path.join(output_dir, "glue_results.md"), table(results) + "\n")
    rows = [f"{TASKS[t].title}\t{m}\t{results[t][m]:.6f}" for t in results for m in sorted(results[t])
            if m.startswith("eval_")]
    storage.write_atomic(os.path.join(output_dir, "glue_results.tsv"), "task\tmetric\tvalue\n" + "\n".join(rows) + "\n")
    return results
