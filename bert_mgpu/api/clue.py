"""The CLUE suite: every task fine-tuned with CLUE's baseline recipe (the classification tasks, CLUENER,
CMRC 2018, CHID and C3), its dev score, the leaderboard's submission files and the table CLUE prints. Each task's files,
labels and recipe are clue_tasks.py's. The twin of glue.py.

Example:
    results = clue.run("CLUEdataset", "chinese_L-12_H-768_A-12", "clue", tasks=["afqmc", "tnews"], towers=towers)
    print(clue.table(results))
"""

import logging
import os

from bert_mgpu.api.classifier import BertClassifier
from bert_mgpu.api.multiple_choice import BertMultipleChoice
from bert_mgpu.api.question_answering import BertQuestionAnswerer
from bert_mgpu.api.tagger import BertTagger
from bert_mgpu.core import storage
from bert_mgpu.core.errors import Interrupted, UserError
from bert_mgpu.data import choices
from bert_mgpu.data.clue_tasks import ALIASES, TASKS, submission_lines
from bert_mgpu.data.squad import read_squad
from bert_mgpu.data.tagged import read_tagged, tag_set
from bert_mgpu.parallel.devices import Towers
from bert_mgpu.train import reporting

log = logging.getLogger("bert_mgpu")


def task_scores(results):
    """{task title: its score x 100 (accuracy; CLUENER's entity F1; CMRC 2018's exact match), ...,
    "Score": their mean}, CLUE's numbers."""
    scores = {TASKS[t].title: 100 * results[t][TASKS[t].metric] for t in TASKS if t in results}
    if scores:
        scores["Score"] = sum(scores.values()) / len(scores)
    return scores


def table(results):
    """CLUE's table: Score (the mean) first, then each task's dev score. Markdown."""
    scores = task_scores(results)
    titles = ["Score", *[t for t in scores if t != "Score"]]
    return "\n".join(["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles),
                      "| " + " | ".join(f"{scores[t]:.2f}" for t in titles) + " |"])


def resolve(tasks, clue_dir=None):
    """--tasks -> CLUE task names, in the table's order; UserError naming an unknown one. None (all): the
    tasks whose folders `clue_dir` holds."""
    if not tasks:
        found = [t for t in TASKS if clue_dir is None or TASKS[t].find(clue_dir)]
        if not found:
            raise UserError(f"{clue_dir}: no CLUE task folder ({', '.join(TASKS)}, or <task>_public)")
        if len(found) < len(TASKS):
            log.info("CLUE: %s not in %s, left out", ", ".join(t for t in TASKS if t not in found), clue_dir)
        return found
    names = [ALIASES.get(t, t) for t in tasks]
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
    for name in resolve(tasks, clue_dir):
        task = TASKS[name]
        folder = task.directory(clue_dir)
        recipe = dict(epochs=epochs or task.epochs, learning_rate=learning_rate or task.learning_rate, seed=seed,
                      train_batch_size=batch_size or task.batch_size, **fit_args)
        opened = dict(towers=towers, precision=precision, max_seq_length=max_seq_length or task.max_seq_length)
        log.info("CLUE %s: %g epochs at %g", task.title, recipe["epochs"], recipe["learning_rate"])
        train = {"classifier": _classifier, "tagger": _tagger, "question_answerer": _answerer,
                 "multiple_choice": _chooser}[task.head]
        model, dev, predict = train(task, folder, init_checkpoint, opened, recipe, os.path.join(output_dir, name))
        if model.interrupted:
            raise Interrupted(f"CLUE {task.title}: interrupted by {model.interrupted}; rerun to resume",
                              model.interrupted)
        results[name] = model.evaluate(dev, batch_size=eval_batch_size)
        if towers.is_chief:
            reporting.report_results(fit_args.get("report_to"), os.path.join(output_dir, name), results[name],
                                     model.global_step)
        log.info("CLUE %s: %s %.4f", task.title, task.metric, results[name][task.metric])
        if do_predict:
            if task.test_file(folder) is None:
                log.warning("no test file in %s: CLUE %s is not predicted", folder, task.title)
                continue
            text = predict(eval_batch_size)
            if towers.is_chief:
                storage.makedirs(submission_dir)
                storage.write_atomic(os.path.join(submission_dir, task.submission), text)
    if towers.is_chief:
        storage.write_atomic(os.path.join(output_dir, "clue_results.md"), table(results) + "\n")
        rows = [f"{TASKS[t].title}\t{m}\t{results[t][m]:.6f}" for t in results for m in sorted(results[t])
                if m.startswith("eval_")]
        storage.write_atomic(os.path.join(output_dir, "clue_results.tsv"),
                             "task\tmetric\tvalue\n" + "\n".join(rows) + "\n")
    return results


def _classifier(task, folder, init_checkpoint, opened, recipe, output_dir):
    """A sentence(-pair) task -> (the trained classifier, dev examples, predict(batch) -> submission text)."""
    labels = task.label_list(folder)
    train, _ = task.read(folder, "train", labels)
    labels = labels or sorted({e.label for e in train})
    dev, _ = task.read(folder, "dev", labels)
    clf = BertClassifier.from_pretrained(init_checkpoint, labels=labels, task=task.name, **opened)
    clf.fit(train, output_dir, **recipe)

    def predict(batch_size):
        test, ids = task.read(folder, "test", labels)
        predicted = clf.predict(test, batch_size=batch_size).argmax(axis=1)
        return submission_lines(task, ids, [clf.labels[i] for i in predicted], task.descriptions(folder))

    return clf, dev, predict


def _tagger(task, folder, init_checkpoint, opened, recipe, output_dir):
    """CLUENER -> (the trained tagger, dev sentences, predict(batch) -> cluener_predict.json's text)."""
    read = lambda split: read_tagged(os.path.join(folder, f"{split}.json"), "cluener")  # noqa: E731
    train = read("train")
    tagger = BertTagger.from_pretrained(init_checkpoint, labels=tag_set(train), **opened)
    tagger.fit(train, output_dir, **recipe)

    def predict(batch_size):
        test = read("test")
        files = tagger.reader(data_format="cluener").prediction_files(tagger.predict_tags(test, batch_size=batch_size),
                                                                      test)
        return files["cluener_predict.json"]

    return tagger, read("dev"), predict


def _answerer(task, folder, init_checkpoint, opened, recipe, output_dir):
    """CMRC 2018 -> (the trained answerer, dev questions, predict(batch) -> {question id: answer} JSON)."""
    import json

    train, _ = read_squad(os.path.join(folder, "train.json"), training=True)
    length = opened["max_seq_length"]  # run_squad's query and stride, shrunk if the windows are (tests)
    qa = BertQuestionAnswerer.from_pretrained(init_checkpoint, max_query_length=min(64, length // 4),
                                              doc_stride=min(128, length // 2), **opened)
    qa.fit(train, output_dir, **recipe)

    def predict(batch_size):
        test, _ = read_squad(os.path.join(folder, "test.json"))
        return json.dumps(qa.answer(test, batch_size=batch_size).predictions, ensure_ascii=False, indent=2) + "\n"

    return qa, read_squad(os.path.join(folder, "dev.json"))[0], predict


def _chooser(task, folder, init_checkpoint, opened, recipe, output_dir):
    """CHID or C3 -> (the trained multiple-choice model, dev questions, predict(batch) -> its leaderboard file)."""
    read = lambda split: choices.read_split(folder, split, task.name)[0]  # noqa: E731
    train = read("train")
    mc = BertMultipleChoice.from_pretrained(init_checkpoint, **opened)
    mc.probe_choices = max(len(q.choices) for q in train)
    mc.fit(train, output_dir, **recipe)

    def predict(batch_size):
        test = read("test")
        scored = mc.predict(test, batch_size=batch_size)
        files = mc.reader(submission=task.name).prediction_files([p["probabilities"] for p in scored], test)
        return files[task.submission]

    return mc, read("dev"), predict
