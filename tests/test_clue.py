"""The CLUE suite: CLUE's file layouts read into examples (WSC's marks, CSL's keywords, TNEWS's label codes), the
suite run end to end on files in those layouts, its table and its submission files. CLUE's data is not to be
had offline: the files here are written in its layouts, with made-up rows."""

import json
import random

import pytest
from conftest import WORDS, learning_release, run_script

from bert_mgpu.api import clue
from bert_mgpu.core.errors import UserError
from bert_mgpu.data.clue_tasks import TASKS, wsc_text

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)

# CLUEWSC2020's first training row, as its train.json has it.
WSC = {"target": {"span2_index": 37, "span1_index": 5, "span1_text": "床", "span2_text": "它"}, "idx": 0,
       "label": "false",
       "text": "这时候放在床上枕头旁边的手机响了，我感到奇怪，因为欠费已被停机两个月，现在它突然响了。"}


def write_lines(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_rows_become_the_pairs_clues_baselines_read(tmp_path):
    assert wsc_text(WSC, "train.json", 1) == \
        "这时候放在_床_上枕头旁边的手机响了，我感到奇怪，因为欠费已被停机两个月，现在[它]突然响了。"
    csl = {"id": 3, "abst": "摘要", "keyword": ["水声", "信号"], "label": "1"}
    assert TASKS["csl"].pair(csl, "train.json", 1) == ("水声 信号", "摘要")
    folder = tmp_path / "tnews_public"
    write_lines(folder / "labels.json", [{"label": "100", "label_desc": "news_story"},
                                         {"label": "101", "label_desc": "news_culture"}])
    write_lines(folder / "train.json", [{"label": "101", "label_desc": "news_culture", "sentence": "文化",
                                         "keywords": ""}])
    write_lines(folder / "test.json", [{"id": 7, "sentence": "故事", "keywords": ""}])
    task = TASKS["tnews"]
    assert task.directory(str(tmp_path)) == str(folder)
    labels = task.label_list(str(folder))
    assert labels == ["100", "101"]
    (train, _), (test, ids) = task.read(str(folder), "train", labels), task.read(str(folder), "test", labels)
    assert (train[0].text_a, train[0].label, test[0].label, ids) == ("文化", "101", None, [7])
    assert clue.submission_lines(task, [7], ["100"], task.descriptions(str(folder))) == \
        '{"id": 7, "label": "100", "label_desc": "news_story"}\n'
    nli = tmp_path / "ocnli"
    write_lines(nli / "dev.json", [{"sentence1": "a", "sentence2": "b", "label": "-"},
                                   {"sentence1": "c", "sentence2": "d", "label": "neutral"}])
    assert [e.label for e in TASKS["ocnli"].read(str(nli), "dev", TASKS["ocnli"].label_list(str(nli)))[0]] == \
        ["neutral"]  # the undecided pair left out


@pytest.mark.parametrize("task, row, expected", [
    ("tnews", {"label": "199", "sentence": "x"}, ":2: label '199' is not one of TNEWS's (100, 101)"),
    ("cluewsc2020", {**WSC, "target": {**WSC["target"], "span2_index": 36}},
     ":2: span2_text '它' is not at span2_index 36 of the text"),
    ("afqmc", {"sentence1": "x", "label": "1"}, ":2: no key 'sentence2' (its keys: sentence1, label)"),
])
def test_bad_rows_are_named_with_their_file_and_line(tmp_path, task, row, expected):
    folder = tmp_path / task
    good = {"tnews": {"label": "100", "sentence": "y"}, "cluewsc2020": WSC,
            "afqmc": {"sentence1": "x", "sentence2": "y", "label": "0"}}[task]
    write_lines(folder / "train.json", [good, row])
    if task == "tnews":
        write_lines(folder / "labels.json", [{"label": "100"}, {"label": "101"}])
    with pytest.raises(UserError) as e:
        TASKS[task].read(str(folder), "train", TASKS[task].label_list(str(folder)))
    assert str(e.value) == f"{folder / 'train.json'}{expected}"
    with pytest.raises(UserError, match=r"^--tasks: unknown race \(CLUE's are afqmc, tnews"):
        clue.resolve(["afqmc", "race"])
    assert clue.resolve(None, str(tmp_path)) == [task]  # all: the tasks whose folders are there
    with pytest.raises(UserError, match="no cluener/ folder"):
        TASKS["cluener"].directory(str(tmp_path))


def test_the_suite_trains_each_task_and_writes_clues_table_and_submission_files(tmp_path):
    release = learning_release(str(tmp_path / "release"))
    rng = random.Random(0)
    good, bad = ["good", "great", "fun", "brilliant"], ["bad", "awful", "dull", "boring"]

    def sentence(label):
        return " ".join(rng.choice(good if label == "1" else bad) for _ in range(4)) + " " + rng.choice(WORDS)

    for split, n in (("train", 128), ("dev", 32), ("test", 10)):
        rows = [(str(rng.randint(0, 1)), i) for i in range(n)]
        write_lines(tmp_path / "clue" / "afqmc_public" / f"{split}.json",
                    [{"id": i, "sentence1": sentence(y), "sentence2": "the movie",
                      **({"label": y} if split != "test" else {})} for y, i in rows])
        write_lines(tmp_path / "clue" / "cluewsc2020_public" / f"{split}.json",
                    [{**WSC, "idx": i, **({"label": ("false", "true")[int(y)]} if split != "test" else {"label": None})}
                     for y, i in rows])
    people = ["张三", "李四", "王五"]
    for split, n in (("train", 16), ("dev", 8), ("test", 5)):
        rows = []
        for i in range(n):
            who = rng.choice(people)
            rows.append({"id": i, "text": f"{who}在北京工作", **({"label": {"name": {who: [[0, 1]]},
                                                                          "address": {"北京": [[3, 4]]}}}
                                                                 if split != "test" else {})})
        write_lines(tmp_path / "clue" / "cluener_public" / f"{split}.json", rows)
        paragraphs = [{"id": f"{split}-p{i}", "context": f"{people[i % 3]}在北京工作。他喜欢电影。", "qas": [
            {"id": f"{split}-q{i}", "question": "谁在北京工作？",
             "answers": [{"text": people[i % 3], "answer_start": 0}] if split != "test" else []}]}
            for i in range(n)]
        folder = tmp_path / "clue" / "cmrc2018_public"
        folder.mkdir(exist_ok=True)
        (folder / f"{split}.json").write_text(json.dumps({"version": "v1.0", "data": [
            {"id": split, "title": "t", "paragraphs": paragraphs}]}, ensure_ascii=False), encoding="utf-8")
        # C3: d- and m- files, test1.1.json; CHID: a blank a paragraph, the answers beside.
        c3 = [[[f"{people[i % 3]}在北京工作。"], [{"question": "谁在北京工作？", "choice": people, "id": i,
                                                **({"answer": people[i % 3]} if split != "test" else {})}], f"d{i}"]
              for i in range(n)]
        name = "test1.1.json" if split == "test" else f"d-{split}.json"
        folder = tmp_path / "clue" / "c3_public"
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps(c3, ensure_ascii=False), encoding="utf-8")
        if split != "test":
            (folder / f"m-{split}.json").write_text(json.dumps(c3[:2], ensure_ascii=False), encoding="utf-8")
        idioms = ["一心一意", "三心二意", "七上八下"]
        blanks = [f"#idiom{('train', 'dev', 'test').index(split)}{i:05d}#" for i in range(n)]
        write_lines(tmp_path / "clue" / "chid_public" / ("test1.1.json" if split == "test" else f"{split}.json"),
                    [{"candidates": idioms, "content": [f"他做事{b}。"]} for b in blanks])
        if split != "test":
            (tmp_path / "clue" / "chid_public" / f"{split}_answer.json").write_text(
                json.dumps({b: i % 3 for i, b in enumerate(blanks)}))
    out = tmp_path / "out"
    proc = run_script("run_clue_mgpu.py", f"--clue_dir={tmp_path / 'clue'}", f"--init_checkpoint={release}",
                      f"--output_dir={out}", "--tasks=all", "--n_gpus=0", "--towers_per_gpu=2",
                      "--num_train_epochs=4", "--learning_rate=1e-3", "--train_batch_size=4", "--precision=float32",
                      "--max_seq_length=64")
    table = (out / "clue_results.md").read_text().splitlines()
    assert table[0] == "| Score | AFQMC | WSC | CLUENER | CMRC2018 | CHID | C3 |" and table[2] in proc.stdout
    cells = [float(c) for c in table[2].strip("| ").split(" | ")]
    assert cells[0] == pytest.approx(sum(cells[1:]) / 6, abs=0.01)
    assert cells[1] > 75, cells  # AFQMC's made-up pairs are learnable: the suite trained and evaluated it
    tsv = (out / "clue_results.tsv").read_text().splitlines()
    assert "AFQMC\teval_accuracy\t" in "\n".join(tsv) and "WSC\teval_accuracy\t" in "\n".join(tsv)
    afqmc = [json.loads(line) for line in (out / "submission" / "afqmc_predict.json").read_text().splitlines()]
    assert [r["id"] for r in afqmc] == list(range(10)) and {r["label"] for r in afqmc} <= {"0", "1"}
    wsc = [json.loads(line) for line in (out / "submission" / "cluewsc11_predict.json").read_text().splitlines()]
    assert [r["id"] for r in wsc] == list(range(10)) and {r["label"] for r in wsc} <= {"true", "false"}
    assert (out / "afqmc" / "ckpt-64.index").exists()  # 128 examples / 8 a step x 4 epochs
    ner = [json.loads(line) for line in (out / "submission" / "cluener_predict.json").read_text().splitlines()]
    assert [r["id"] for r in ner] == list(range(5)) and all(isinstance(r["label"], dict) for r in ner)
    answers = json.loads((out / "submission" / "cmrc2018_predict.json").read_text())
    assert sorted(answers) == [f"test-q{i}" for i in range(5)] and all(isinstance(a, str) for a in answers.values())
    assert "CMRC2018\teval_f1\t" in "\n".join(tsv) and "CLUENER\teval_f1\t" in "\n".join(tsv)
    assert "C3\teval_accuracy\t" in "\n".join(tsv) and "CHID\teval_accuracy\t" in "\n".join(tsv)
    c3 = [json.loads(line) for line in (out / "submission" / "c311_predict.json").read_text().splitlines()]
    assert [r["id"] for r in c3] == list(range(5)) and {r["label"] for r in c3} <= {0, 1, 2}
    chid = json.loads((out / "submission" / "chid11_predict.json").read_text())
    assert sorted(chid) == [f"#idiom2{i:05d}#" for i in range(5)] and set(chid.values()) <= {0, 1, 2}
