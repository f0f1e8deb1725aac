"""run_distill_mgpu.py end to end: the session's trained classifier (2 layers) teaches a 1-layer student made of its
layer 1, on two towers, from its labelled rows and unlabelled text; the student's directory is a classifier run
run_classifier_mgpu.py evaluates the same, and a rerun resumes it bit for bit."""

import json
import os
import re
import shutil

import pytest
from conftest import run_script, sentiment_rows
from test_crash_resume import assert_bit_identical


def results(path):
    return dict(line.split(" = ") for line in open(path).read().splitlines())


@pytest.fixture(scope="module")
def distilled(classifier_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("student")
    out, unlabelled = str(root / "out"), root / "unlabelled.txt"
    unlabelled.write_text("".join(f"{text}\n\n" for _, text in sentiment_rows(160, seed=7)))  # blank lines skipped
    args = ["--task_name=tsv", f"--data_dir={classifier_run.data}", f"--teacher={classifier_run.out}",
            "--teacher_layers=1", f"--output_dir={out}", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8",
            "--eval_batch_size=4", "--predict_batch_size=4", "--max_seq_length=32", "--precision=float32",
            "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=1", "--learning_rate=1e-3",
            "--temperature=2", f"--unlabeled_file={unlabelled}", "--save_checkpoints_steps=20",
            "--hidden_weight=0.5", "--attention_weight=1"]
    return out, args, run_script("run_distill_mgpu.py", *args)


def test_a_teacher_teaches_a_student_of_one_of_its_layers(distilled, classifier_run):
    out, _, proc = distilled
    student, teacher = results(os.path.join(out, "eval_results.txt")), results(
        os.path.join(classifier_run.out, "eval_results.txt"))
    assert int(student["global_step"]) == 50  # (640 labelled + 160 unlabelled) / (8 x 2 towers), 1 epoch
    # The toy task, learnt by the 2-layer teacher; its 1-layer student keeps most of it after 50 steps.
    assert float(teacher["eval_accuracy"]) >= 0.9 and float(student["eval_accuracy"]) >= 0.8, (teacher, student)
    block = proc.stdout[proc.stdout.index("== run_distill_mgpu.py =="):]
    fact = lambda key: re.search(rf"^  {key} {{2,}}(.+)$", block, re.M).group(1)  # noqa: E731
    assert fact("teacher") == f"{classifier_run.out} (2 encoder layers)" and fact("student") == "1 encoder layer"
    assert fact("unlabeled rows") == "160"
    speed = re.fullmatch(r"(\S+)x \(predicting dev: (\S+) against (\S+) rows/s\)", fact("student speed-up"))
    assert float(speed[1]) == pytest.approx(float(speed[2]) / float(speed[3]), abs=0.01) and float(speed[3]) > 0
    assert float(fact("teacher eval_accuracy")) == pytest.approx(float(teacher["eval_accuracy"]), abs=1e-6)
    run = json.load(open(os.path.join(out, "bert_mgpu.json")))
    assert run["kind"] == "classifier" and run["bert_config"]["num_hidden_layers"] == 1
    assert (run["settings"]["teacher"], run["settings"]["teacher_layers"], run["settings"]["temperature"]) == (
        classifier_run.out, ["1"], 2.0)
    assert run["settings"]["unlabeled_file"].endswith("unlabelled.txt")
    distillation = run["settings"]["distillation"]  # a changed teacher in the same directory is not resumed
    assert (distillation["unlabeled_examples"], len(distillation["teacher_sha256"])) == (160, 64)
    # The intermediate losses' layer map defaults to --teacher_layers.
    assert (distillation["layer_map"], distillation["hidden_weight"], distillation["attention_weight"]) == (
        [1], 0.5, 1.0)
    assert len(open(os.path.join(out, "predict.txt")).read().splitlines()) == 13


def test_a_distilled_run_resumes_bit_identical(distilled, tmp_path):
    """Its last checkpoint removed, the rerun of the same command resumes at step 40 and ends with the weights,
    moments and evaluation of the run never stopped (the teacher, the unlabelled rows and their order as they were)."""
    out, args, _ = distilled
    again = str(tmp_path / "out")
    shutil.copytree(out, again)
    for name in os.listdir(again):
        if name.startswith("ckpt-50."):
            os.remove(os.path.join(again, name))
    proc = run_script("run_distill_mgpu.py", *[f"--output_dir={again}" if a.startswith("--output_dir=") else a
                                               for a in args if a != "--do_predict"])
    assert f"resuming from {again}/ckpt-40 at step 40" in proc.stderr, proc.stderr[-2000:]
    assert_bit_identical(out, again, 50)
    assert open(os.path.join(out, "eval_results.txt")).read() == open(os.path.join(again, "eval_results.txt")).read()


def test_the_students_run_is_a_classifier_run(distilled, tmp_path):
    out, _, _ = distilled
    again = str(tmp_path / "again")
    data = [a for a in distilled[1] if a.startswith("--data_dir=")][0]
    proc = run_script("run_classifier_mgpu.py", "--task_name=tsv", data, f"--init_checkpoint={out}",
                      f"--output_dir={again}", "--n_gpus=0", "--towers_per_gpu=1", "--eval_batch_size=4",
                      "--max_seq_length=32", "--precision=float32", "--do_eval")
    got, want = results(os.path.join(again, "eval_results.txt")), results(os.path.join(out, "eval_results.txt"))
    assert float(got["eval_accuracy"]) == pytest.approx(float(want["eval_accuracy"]), abs=1e-6), proc.stderr[-2000:]
    assert float(got["eval_loss"]) == pytest.approx(float(want["eval_loss"]), rel=1e-4)


@pytest.mark.parametrize("extra, message", [
    ((), "--teacher is required to train: the fine-tuned classifier run that teaches"),
    (("--teacher={run}", "--teacher_layers=0", "--init_checkpoint={run}"),
     "--teacher_layers and --init_checkpoint: the student starts from one of them, not both"),
    (("--teacher={run}", "--teacher_layers=2"), "teacher_layers=2: distinct layers of the teacher's 0-1"),
    (("--teacher={run}", "--teacher_layers=0", "--unlabeled_file={run}/vocab.txt.tsv"),
     "vocab.txt.tsv: file not found"),
    (("--teacher={run}", "--teacher_layers=0", "--attention_weight=1", "--layer_map=0,1"),
     "--layer_map=0,1: one teacher layer (0-1) for each of the student's 1 layers"),
    (("--teacher={run}", "--teacher_layers=0", "--layer_map=last"), "--layer_map=last: expected layer numbers, "
     "e.g. 0,2,4"),
    (("--teacher={run}", "--teacher_layers=0", "--student_init=teacher_layers=1"),
     "--student_init with --teacher_layers or --init_checkpoint: give one of them"),
    (("--teacher={run}", "--student_init={run}/nowhere"), "out/nowhere: checkpoint not found"),  # its checkpoint
    (("--teacher={run}", "--teacher_layers=0", "--hidden_weight=1", "--teacher_logits={run}/logits.safetensors"),
     "--teacher_logits and --hidden_weight or --attention_weight: the intermediate losses need the teacher's "
     "insides at each step; drop one of them"),
])
def test_what_cannot_be_distilled_is_one_line(classifier_run, tmp_path, extra, message):
    proc = run_script("run_distill_mgpu.py", "--task_name=tsv", f"--data_dir={classifier_run.data}",
                      f"--output_dir={tmp_path / 'out'}", "--n_gpus=0", "--do_train", "--max_seq_length=32",
                      *(e.format(run=classifier_run.out) for e in extra), check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr[-2000:]


def test_cached_teacher_logits_are_predicted_once_and_named_in_the_summary(distilled, tmp_path):
    """--teacher_logits: the teacher predicts the 640 labelled and 160 unlabelled rows into the file before the
    first step; the summary says where they came from; the student is a run as any (its 50 steps), which
    exports to ONNX as any classifier does (ONNX Runtime's outputs within 1e-4 of TensorFlow's)."""
    import numpy as np
    import safetensors

    _, args, _ = distilled
    cache, out = tmp_path / "teacher.safetensors", tmp_path / "out"
    drop = ("--output_dir", "--hidden_weight", "--attention_weight", "--do_eval", "--do_predict", "--save_checkp")
    drop += ("--teacher_layers",)  # the student given by the one flag instead
    proc = run_script("run_distill_mgpu.py", *[a for a in args if not a.startswith(drop)], f"--output_dir={out}",
                      f"--teacher_logits={cache}", "--do_export", "--export_format=onnx",
                      "--student_init=teacher_layers=1")
    assert re.search(rf"^  teacher logits +predicted {re.escape(str(cache))}$", proc.stdout, re.M), proc.stdout
    with safetensors.safe_open(str(cache), framework="numpy") as f:
        logits, made = f.get_tensor("logits"), f.metadata()
    assert logits.shape == (800, 2) and np.ptp(logits) > 1 and made["precision"] == "float32"
    run = json.load(open(out / "bert_mgpu.json"))
    assert run["global_step"] == 50 and run["settings"]["distillation"]["teacher_logits"] == "cached"
    assert run["settings"]["student_init"] == "teacher_layers=1" and run["bert_config"]["num_hidden_layers"] == 1
    facts = json.load(open(out / "export" / "onnx" / "bert_mgpu.json"))
    assert facts["labels"] == ["neg", "pos"] and facts["max_difference_to_tensorflow"] < 1e-4
