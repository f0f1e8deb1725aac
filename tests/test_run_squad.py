"""run_squad_mgpu.py end to end, as a user runs it: train with evaluation and the best model, predict
run_squad's files, score them with the official rules, export and load back; bad input in one line."""

import json
import os

import pytest
from conftest import learning_release, run_script
from test_question_answering import marker_questions

pytestmark = pytest.mark.plain_kernels  # end-to-end runs: the kernels unfused (conftest.py)


def run(*args, check=True):
    return run_script("run_squad_mgpu.py", *args, check=check)


def write_squad(path, questions, version_2=False):
    """SQuAD's JSON: an article a question, its context a paragraph."""
    data = []
    for q in questions:
        qa = {"id": q.qid, "question": q.question,
              "answers": [{"text": t, "answer_start": s} for t, s in q.answers]}
        if version_2:
            qa["is_impossible"] = q.impossible
        data.append({"title": q.qid, "paragraphs": [{"context": q.context, "qas": [qa]}]})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "v2.0" if version_2 else "1.1", "data": data}, f, indent=1)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("squad")
    write_squad(d / "train-v1.1.json", marker_questions(512, 3, 20))
    write_squad(d / "dev-v1.1.json", marker_questions(24, 20, 50, seed=1))  # several windows each
    return d


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return learning_release(str(tmp_path_factory.mktemp("release")))


def common(data, release, out, *extra):
    return [f"--train_file={data}/train-v1.1.json", f"--predict_file={data}/dev-v1.1.json",
            f"--init_checkpoint={release}", f"--output_dir={out}", "--n_gpus=0", "--towers_per_gpu=2",
            "--train_batch_size=16", "--predict_batch_size=4", "--eval_batch_size=4", "--max_seq_length=24",
            "--doc_stride=6", "--max_query_length=4", "--precision=float32", *extra]


@pytest.fixture(scope="module")
def trained(data, release, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("out"))
    args = common(data, release, out, "--do_train", "--do_predict", "--num_train_epochs=40", "--learning_rate=2e-3",
                  "--warmup_proportion=0.05", "--eval_every_steps=160", "--load_best_model_at_end", "--do_export",
                  "--export_format=hf,google,saved_model,onnx")
    return out, args, run(*args)


def test_predict_exported_writes_run_squads_files_from_the_onnx_export(trained, data, tmp_path):
    """predict_exported.py on the run's dev file (contexts in several windows) with its ONNX export: the
    run's own predictions.json, and its n best (texts, offsets; probabilities to 1e-4)."""
    out, _, _ = trained
    served = run_script("predict_exported.py", f"--model_dir={os.path.join(out, 'export', 'onnx')}",
                        f"--input_file={data}/dev-v1.1.json", f"--output_dir={tmp_path}")
    assert "predicted 24 questions with" in served.stdout
    assert sorted(os.listdir(tmp_path)) == ["nbest_predictions.json", "predictions.json"]
    assert json.load(open(tmp_path / "predictions.json")) == json.load(open(os.path.join(out, "predictions.json")))
    got, want = (json.load(open(os.path.join(where, "nbest_predictions.json"))) for where in (tmp_path, out))
    assert got.keys() == want.keys()
    for qid in want:
        assert [(g["text"], g["start"], g["end"]) for g in got[qid]] == [(w["text"], w["start"], w["end"])
                                                                        for w in want[qid]]
        assert [g["probability"] for g in got[qid]] == pytest.approx([w["probability"] for w in want[qid]], abs=1e-4)


def test_train_predict_and_score_write_run_squads_files(trained, data):
    out, _, proc = trained
    predictions = json.load(open(os.path.join(out, "predictions.json")))
    nbest = json.load(open(os.path.join(out, "nbest_predictions.json")))
    gold = json.load(open(data / "dev-v1.1.json"))["data"]
    answers = {a["paragraphs"][0]["qas"][0]["id"]: a["paragraphs"][0]["qas"][0]["answers"][0]["text"] for a in gold}
    assert sorted(predictions) == sorted(answers) and sorted(nbest) == sorted(answers)
    right = sum(predictions[q] == a for q, a in answers.items())
    assert right >= 22, (right, predictions)
    assert all(1 <= len(v) <= 20 and abs(sum(k["probability"] for k in v) - 1) < 1e-6 for v in nbest.values())
    assert not os.path.exists(os.path.join(out, "null_odds.json"))
    results = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    assert float(results["eval_exact_match"]) == pytest.approx(100 * right / 24)  # the official rules on the file
    assert float(results["eval_f1"]) >= float(results["eval_exact_match"])
    history = open(os.path.join(out, "eval_history.tsv")).read().splitlines()
    assert history[0].split("\t") == ["step", "loss", "exact_match", "f1"] and len(history) >= 4
    assert "eval: f1 " in proc.stdout and "(squad) on 24 questions" in proc.stdout
    assert "predict: 24 questions -> " in proc.stdout and "metric" in proc.stdout
    for fmt in ("hf", "google", "saved_model"):
        assert os.path.isdir(os.path.join(out, "export", fmt)), os.listdir(os.path.join(out, "export"))


def test_the_exports_and_the_run_directory_answer_again_the_same(trained, data, tmp_path):
    """The run directory and its best model's ckpt-N prefix predict with their own windows (--doc_stride=6,
    --max_query_length=4, not the flags' defaults, which would also not fit its 24 pieces); the exports, which
    keep no settings, are told them."""
    import tensorflow as tf

    out, _, _ = trained
    expected = json.load(open(os.path.join(out, "predictions.json")))
    lengths = ("--max_seq_length=24", "--doc_stride=6", "--max_query_length=4")
    prefix = tf.train.latest_checkpoint(os.path.join(out, "best"))
    assert os.path.basename(prefix).startswith("ckpt-"), prefix
    for source in (out, prefix, os.path.join(out, "export", "hf"), os.path.join(out, "export", "google")):
        again = tmp_path / os.path.basename(source)
        proc = run(f"--init_checkpoint={source}", f"--predict_file={data}/dev-v1.1.json", f"--output_dir={again}",
                   "--do_predict", "--n_gpus=0", "--towers_per_gpu=2", "--precision=float32",
                   *(lengths if source not in (out, prefix) else ()))
        assert json.load(open(again / "predictions.json")) == expected, source
        assert "was trained with" not in proc.stderr
    proc = run(f"--init_checkpoint={out}", f"--predict_file={data}/dev-v1.1.json", f"--output_dir={tmp_path / 'o'}",
               "--do_predict", "--n_gpus=0", "--precision=float32", "--doc_stride=5")
    assert f"--doc_stride=5: {out} was trained with 6; using 5" in proc.stderr


def test_chinese_data_is_scored_by_cmrc_2018s_rules(trained, tmp_path):
    """--do_predict on a file with answers scores it; Chinese contexts (CMRC 2018, DRCD) by CMRC's rules."""
    out, _, _ = trained
    context = "北京是中国的首都。"
    path = tmp_path / "cmrc2018_dev.json"
    path.write_text(json.dumps({"version": "v1.0", "data": [{"paragraphs": [{"id": "p", "context": context, "qas": [
        {"id": f"c{i}", "question": "中国的首都是哪里？", "answers": [{"text": "北京", "answer_start": 0}]}
        for i in range(2)]}]}]}, ensure_ascii=False), encoding="utf-8")
    again = tmp_path / "out"
    proc = run(f"--init_checkpoint={out}", f"--predict_file={path}", f"--output_dir={again}", "--do_predict",
               "--n_gpus=0", "--max_seq_length=24", "--doc_stride=6", "--max_query_length=4", "--precision=float32")
    assert "(cmrc) on 2 questions" in proc.stdout
    results = dict(line.split(" = ") for line in open(again / "eval_results.txt").read().splitlines())
    predicted = json.load(open(again / "predictions.json"))
    assert sorted(predicted) == ["c0", "c1"] and all(p in context for p in predicted.values())
    assert "eval_average" in results and 0 <= float(results["eval_f1"]) <= 100


def test_a_rerun_of_the_finished_command_trains_nothing_and_writes_the_same(trained):
    out, args, _ = trained
    before = open(os.path.join(out, "predictions.json")).read()
    proc = run(*args)
    assert "export: hf" in proc.stdout and "already there" in proc.stdout
    assert open(os.path.join(out, "predictions.json")).read() == before


@pytest.mark.parametrize("case", ["not_json", "past_the_end", "empty_question", "empty_context", "stride_too_long",
                                  "query_too_long", "v2_data_as_v1", "v1_data_as_v2", "impossible_as_a_string",
                                  "answer_start_a_bool", "nan_threshold"])
def test_bad_input_is_one_line_naming_file_and_line(case, data, release, tmp_path):
    train = marker_questions(8, 3, 10)
    extra, expected, version_2 = ["--do_train", "--do_eval"], None, False
    if case == "past_the_end":
        train[2].answers = [("brilliant", len(train[2].context) - 3)]
        expected = "question 0-2's answer ends at character"
    elif case == "empty_question":
        train[3].question = " "
        expected = "question 0-3 is empty"
    elif case == "empty_context":
        train[1].context = ""
        expected = "a paragraph with an empty context"
    elif case == "stride_too_long":
        extra.append("--doc_stride=17")
        expected = "--doc_stride=17: must be above 0 and below the 17 pieces left for the context"
    elif case == "query_too_long":
        extra.append("--max_query_length=24")
        expected = "--max_query_length=24: must be at least 1 and leave room for the context"
    elif case == "v2_data_as_v1":
        version_2 = True
        expected = "is SQuAD v2 data (questions marked is_impossible): pass --version_2_with_negative"
    elif case == "v1_data_as_v2":
        extra.append("--version_2_with_negative")
        expected = "is SQuAD v1 data (no is_impossible marks)"
    elif case in ("impossible_as_a_string", "nan_threshold"):
        version_2 = True
        extra.append("--version_2_with_negative")
    path = write_squad(tmp_path / "train.json", train, version_2)
    if case in ("impossible_as_a_string", "answer_start_a_bool"):  # types JSON allows but SQuAD does not
        squad = json.load(open(path))
        qa = squad["data"][1]["paragraphs"][0]["qas"][0]
        if case == "impossible_as_a_string":  # read as True before: the question's answers dropped
            qa["is_impossible"] = "false"
            expected = f"question {qa['id']}'s is_impossible is 'false'; expected true or false"
        else:  # read as character 1 before
            qa["answers"][0]["answer_start"] = True
            expected = f"question {qa['id']} has an answer without its text and answer_start"
        json.dump(squad, open(path, "w"), indent=1)
    elif case == "nan_threshold":  # nan compares false: every question was answered
        extra.append("--null_score_diff_threshold=nan")
        expected = "--null_score_diff_threshold=nan: must be a finite number"
    if case == "not_json":
        text = open(path).read().splitlines()
        text[4] = "  oops"
        open(path, "w").write("\n".join(text))
        expected = f"{path}:5: not JSON"
    elif case.startswith("v"):
        expected = f"{path}: {expected}"
    out = tmp_path / "out"
    proc = run(*common(str(data), release, str(out)), f"--train_file={path}", *extra, check=False)  # a later flag wins
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run_squad_mgpu.py: error: ") and expected in last, proc.stderr
    if case in ("past_the_end", "empty_question", "empty_context"):
        assert f"{path}:" in last  # the file and its line
    assert not os.path.exists(out / "checkpoint")  # nothing trained


def test_kill_9_mid_run_then_rerun_ends_bit_identical_to_the_uninterrupted_run(tmp_path, release):
    """The windows come back in the same order after a resume: its batches skip what was seen."""
    from test_crash_resume import killed_then_resumed

    write_squad(tmp_path / "train.json", marker_questions(64, 3, 40))  # some contexts take two windows
    write_squad(tmp_path / "dev.json", marker_questions(8, 3, 20, seed=1))

    def args(out):
        return [*common(str(tmp_path), release, out), f"--train_file={tmp_path}/train.json",
                f"--predict_file={tmp_path}/dev.json", "--do_train", "--do_eval", "--train_batch_size=4",
                "--num_train_epochs=1", "--save_checkpoints_steps=4", "--deterministic", "--learning_rate=1e-3"]

    killed_then_resumed("run_squad_mgpu.py", args, tmp_path, run)
