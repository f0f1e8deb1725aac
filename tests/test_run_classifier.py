"""run_classifier_mgpu.py end to end, as a user runs it: train, evaluate, predict, resume, bad input."""

import json
import math
import os
import re
import shutil

import numpy as np
import pytest
from conftest import run_script, sentiment_rows, tiny_config, write_google_release, write_tsv


def run(*args, check=True):
    return run_script("run_classifier_mgpu.py", *args, check=check)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_tsv(d / "train.tsv", sentiment_rows(640, seed=1))
    write_tsv(d / "dev.tsv", sentiment_rows(50, seed=2))
    write_tsv(d / "test.tsv", [("", text) for _, text in sentiment_rows(13, seed=3)])  # 13: not a batch multiple
    return str(d)


def common(data, release, out, *extra):
    return ["--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={release}", f"--output_dir={out}",
            "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8", "--eval_batch_size=4",
            "--predict_batch_size=4", "--max_seq_length=32", "--precision=float32", *extra]


@pytest.fixture(scope="module")
def trained(classifier_run):
    """The session's classifier run (tests/shared_runs.py: `data`'s rows, 160 steps, exported in every format),
    read-only: a test that writes works on a copy (`copy_run`)."""
    return classifier_run.out, list(classifier_run.args), classifier_run.proc


def test_train_eval_predict_writes_every_output(trained):
    out, _, proc = trained
    results = dict(line.split(" = ") for line in open(os.path.join(out, "eval_results.txt")).read().splitlines())
    assert int(results["global_step"]) == 160  # 640 examples / (8 x 2 towers) x 4 epochs
    assert int(results["eval_examples"]) == 50
    assert float(results["eval_accuracy"]) >= 0.9, results  # the toy task is learnt from random init
    assert float(results["eval_loss"]) < 0.5
    probs = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    assert probs.shape == (13, 2) and np.allclose(probs.sum(1), 1.0, atol=1e-6)
    labels = open(os.path.join(out, "predict.txt")).read().split()
    assert len(labels) == 13 and set(labels) <= {"neg", "pos"}
    table = open(os.path.join(out, "predictions.tsv")).read().splitlines()
    assert table[0] == "id\tlabel\tp_neg\tp_pos" and len(table) == 14
    assert [row.split("\t")[1] for row in table[1:]] == labels
    assert os.path.exists(os.path.join(out, "ckpt-160.index"))
    assert any(f.startswith("events.out") for f in os.listdir(os.path.join(out, "train")))
    assert "predict: 13 examples" in proc.stdout
    run_info = json.load(open(os.path.join(out, "bert_mgpu.json")))
    assert run_info["labels"] == ["neg", "pos"] and run_info["global_step"] == 160
    # The block the run ends with: what ran, how fast, the dev numbers, and every output.
    block = proc.stdout[proc.stdout.index("== run_classifier_mgpu.py =="):].splitlines()
    facts = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in block[1:-1])
    assert facts["towers"] == "2 on CPU" and facts["precision"] == "float32"
    assert facts["trained"] == "160 steps (reached 160 steps)"
    assert float(facts["eval_accuracy"]) == pytest.approx(float(results["eval_accuracy"]), abs=5e-4)
    # Logged every 50 steps: the rate from step 50 on, the first 50 steps' (with compiling) beside it.
    rate = re.fullmatch(r"(\S+) \(from step 50 on; (\S+) up to it, compiling included\)", facts["examples/s"])
    assert rate and float(rate[1]) > 0 and float(rate[2]) > 0, facts["examples/s"]
    assert facts["wall time"].endswith(" s")
    assert block[-1] == (f"  outputs in {out}: ckpt-160 (latest checkpoint), bert_config.json, bert_mgpu.json, "
                         "confusion_matrix.png, confusion_matrix.tsv, eval_results.txt, export/, learning_curves.png, "
                         "predict.txt, predictions.tsv, test_results.tsv, train/, vocab.txt")
    counts = [line.split("\t")[1:] for line in open(os.path.join(out, "confusion_matrix.tsv")).read().splitlines()[1:]]
    assert sum(int(n) for row in counts for n in row) == 50
    assert sum(int(counts[i][i]) for i in range(2)) / 50 == pytest.approx(float(results["eval_accuracy"]))
    # --metrics and the per-class report agree with the confusion matrix.
    c = np.array(counts, float)
    for i, label in enumerate(("neg", "pos")):
        precision, recall = c[i, i] / c[:, i].sum(), c[i, i] / c[i].sum()
        assert float(results[f"report_{label}_precision"]) == pytest.approx(precision)
        assert float(results[f"report_{label}_recall"]) == pytest.approx(recall)
        assert int(results[f"report_{label}_support"]) == c[i].sum()
    f1s = [float(results[f"report_{label}_f1"]) for label in ("neg", "pos")]
    assert float(results["eval_f1_macro"]) == pytest.approx(np.mean(f1s)) and float(results["eval_f1_macro"]) > 0.8
    assert float(results["eval_auc"]) > 0.9 and float(results["eval_mcc"]) > 0.7


def test_rerun_resumes_and_predicts_the_same(trained, classifier_run, tmp_path):
    out, args = copy_run(classifier_run, tmp_path)
    before = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    proc = run(*args)
    assert "resuming from" in proc.stderr and "ckpt-160 at step 160" in proc.stderr
    after = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    np.testing.assert_allclose(after, before, atol=1e-6)


def test_predict_only_from_the_output_directory_on_one_tower(trained, data, tmp_path):
    out, _, _ = trained
    before = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    pred_dir = str(tmp_path / "predict_only")
    proc = run("--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={out}", f"--output_dir={pred_dir}",
               "--do_predict", "--n_gpus=0", "--predict_batch_size=5", "--precision=float32", "--max_seq_length=32")
    assert "classifier head restored" in proc.stderr
    np.testing.assert_allclose(np.loadtxt(os.path.join(pred_dir, "test_results.tsv"), delimiter="\t"), before,
                               atol=1e-5)


def test_reference_encoder_predicts_the_same_and_cannot_resume_a_fused_run(trained, classifier_run, data, tmp_path):
    """--fused_encoder=false runs keras-hub's BertBackbone on the same checkpoint: the same probabilities."""
    out, _, _ = trained
    before = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t")
    pred_dir = str(tmp_path / "predict_reference")
    run("--task_name=tsv", f"--data_dir={data}", f"--init_checkpoint={out}", f"--output_dir={pred_dir}",
        "--do_predict", "--n_gpus=0", "--predict_batch_size=4", "--precision=float32", "--max_seq_length=32",
        "--fused_encoder=false")
    np.testing.assert_allclose(np.loadtxt(os.path.join(pred_dir, "test_results.tsv"), delimiter="\t"), before,
                               atol=1e-5)
    out, args = copy_run(classifier_run, tmp_path)  # writable: the refusal must be what keeps it as it was
    files = sorted(os.listdir(out))
    proc = run(*args, "--fused_encoder=false", check=False)
    assert proc.returncode == 1 and "--fused_encoder=None -> False" in proc.stderr, proc.stderr[-2000:]
    assert sorted(os.listdir(out)) == files


def test_gradient_accumulation_makes_the_global_batch_and_the_steps(data, google_release, tmp_path):
    """640 examples, 2 towers x 8 x 2 accumulated = 32 a step: 20 steps an epoch, a quarter of one 5, recorded
    in the run (with --layerwise_lr_decay, --class_weights=auto, --focal_gamma, --rdrop_alpha, --ema_decay,
    --adversarial=pgd and google-bert's recipe, each step several passes: the steps are few)."""
    out = str(tmp_path / "acc")
    proc = run(*common(data, google_release, out, "--do_train", "--num_train_epochs=0.25",
                       "--gradient_accumulation_steps=2", "--log_every_steps=10", "--num_warmup_steps=3",
                       "--layerwise_lr_decay=0.9", "--class_weights=auto", "--focal_gamma=2", "--rdrop_alpha=4",
                       "--length_buckets", "--adam_eps=1e-6", "--lr_schedule=google-bert", "--ema_decay=0.99",
                       "--adversarial=pgd", "--pgd_steps=2", "--adv_epsilon=0.5"))
    labels = [line.split("\t")[0] for line in open(os.path.join(data, "train.tsv"), encoding="utf-8")][1:]
    counts = {k: labels.count(k) for k in ("neg", "pos")}  # the weights: examples / (labels x count)
    assert "class weights: " + ", ".join(f"{k} {len(labels) / (2 * n):.4g}" for k, n in counts.items()) in proc.stderr
    assert "5 steps of 32 (2 towers x 8 x 2 accumulation steps), warmup 3," in proc.stderr  # as given, in steps
    with open(os.path.join(out, "bert_mgpu.json"), encoding="utf-8") as f:
        run_file = json.load(f)
    assert run_file["global_step"] == 5 and run_file["settings"]["gradient_accumulation_steps"] == 2
    assert run_file["settings"]["num_warmup_steps"] == run_file["train_config"]["num_warmup_steps"] == 3
    assert run_file["train_config"]["train_batch_size"] == 8  # the config as it ran: the per-tower batch resolved
    # --layerwise_lr_decay (its rates: test_optimization) is one of the run's settings, which a resume must share.
    assert run_file["settings"]["layerwise_lr_decay"] == run_file["train_config"]["layerwise_lr_decay"] == 0.9
    assert (run_file["settings"]["class_weights"], run_file["settings"]["focal_gamma"]) == ("auto", 2.0)
    assert run_file["settings"]["rdrop_alpha"] == 4.0
    assert {k: run_file["settings"][k] for k in ("adversarial", "adv_epsilon", "pgd_steps", "pgd_alpha")} == {
        "adversarial": "pgd", "adv_epsilon": 0.5, "pgd_steps": 2, "pgd_alpha": 0.02}  # its loss: test_adversarial
    # google-bert's batching, epsilon and schedule, asked for: recorded (their effects: test_input_pipeline,
    # test_training's schedule, NOTES 83).
    assert {k: run_file["settings"][k] for k in ("length_buckets", "adam_eps", "lr_schedule")} == {
        "length_buckets": True, "adam_eps": 1e-6, "lr_schedule": "google-bert"}
    # --ema_decay (its averages and where they are used: test_ema) with --ema_for_eval's default.
    assert (run_file["settings"]["ema_decay"], run_file["settings"]["ema_for_eval"]) == (0.99, True)
    assert run(*common(data, google_release, out, "--do_train", "--gradient_accumulation_steps=0"),
               check=False).stderr.strip().endswith("--gradient_accumulation_steps=0: must be at least 1")


def test_dry_run_prints_the_plan():
    proc = run("--dry_run", "--n_gpus=0", "--towers_per_gpu=3", "--train_batch_size=16")
    assert "3 tower(s) on CPU" in proc.stdout and "global batch = 16 x 3 = 48" in proc.stdout
    flags = open("/proc/cpuinfo").read()  # --precision=auto: bfloat16 where the CPU multiplies it fast
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f" {f}" in flags]
    assert proc.stdout.strip().splitlines()[-1] == (
        f"precision: mixed_bfloat16 (CPU has {'/'.join(bf16)} (fast bfloat16 matmul))" if bf16 else
        "precision: float32 (CPU has neither AMX nor AVX512-BF16)")
    # The same flag under the name that says what it is; and two workers double the global batch.
    proc = run("--dry_run", "--n_gpus=0", "--towers_per_gpu=3", "--per_tower_train_batch_size=8",
               "--worker_hosts=10.0.0.1:2222,10.0.0.2:2222", "--task_index=1", "--eval_strategy=steps",
               "--eval_steps=5")  # Hugging Face's names are taken too
    assert "global batch = 8 x 3 x 2 workers = 48" in proc.stdout
    proc = run("--dry_run", "--n_gpus=0", "--precision=float32")
    assert proc.stdout.strip().splitlines()[-1] == "precision: float32 (requested by --precision)"
    proc = run("--dry_run", "--n_gpus=0", "--towers_per_gpu=2", "--train_batch_size=8",
               "--gradient_accumulation_steps=2")  # the global batch a step takes, accumulation included
    assert "global batch = 8 x 2 x 2 accumulation steps = 32" in proc.stdout
    proc = run_script("run_pretraining_mgpu.py", "--dry_run", "--n_gpus=0", "--towers_per_gpu=2",
                      "--train_batch_size=64", "--train_micro_batch_size_per_gpu=16")  # was "= 32", then 64
    assert "global batch = 16 x 2 x 2 accumulation steps = 64" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].endswith("global batch 64 = 2 towers x 16 x 2 accumulation steps")


def bad_release(tmp_path, **overrides):
    directory, _ = write_google_release(str(tmp_path / "rel"))
    from bert_mgpu.model.config import BertConfig

    cfg = BertConfig.from_json_file(os.path.join(directory, "bert_config.json"))
    BertConfig(**{**cfg.to_dict(), **overrides}).to_json_file(os.path.join(directory, "bert_config.json"))
    return directory


NUMBERS = {"epochs_nan": "--num_train_epochs=nan", "epochs_inf": "--num_train_epochs=inf",
           "eval_batch_zero": "--eval_batch_size=0", "seq_length_one": "--max_seq_length=1",
           "stride_over_window": "--doc_stride=400", "pooling_without_stride": "--window_pooling=max",
           "truncation_with_windows": "--doc_stride=8 --truncation=tail",
           "class_weights_count": "--class_weights=1,2,3", "class_weights_negative": "--class_weights=1,-1",
           "focal_gamma_negative": "--focal_gamma=-1", "class_weights_multi_label": "--class_weights=auto "
           "--task_type=multi_label", "rdrop_negative": "--rdrop_alpha=-1",
           "rdrop_multi_label": "--rdrop_alpha=4 --task_type=multi_label", "adam_eps_zero": "--adam_eps=0",
           "ema_decay_one": "--ema_decay=1", "adv_epsilon_zero": "--adversarial=fgm --adv_epsilon=0",
           "lora_targets_unknown": "--lora_rank=4 --lora_targets=query,dense",
           "lora_on_keras_hub_layers": "--lora_rank=4 --fused_encoder=false"}


# One case of each stage a run can stop at: its flags, its devices, its data, its checkpoint. TensorFlow
# prints its start-up lines as it loads, whichever error follows.
STARTED_AS_A_USER_DOES = ("negative_gpus", "cuda_names_missing_devices", "invalid_utf8", "checkpoint_vs_config")


@pytest.mark.parametrize("case, expected", [
    ("missing_file", r"train.tsv: file not found"),
    ("malformed_row", r"train.tsv:3: expected at least 2 columns, found 1"),
    ("unknown_label", r"dev.tsv:2: label 'maybe' is not one of neg, pos"),
    ("empty_dataset", r"train.tsv: no examples"),
    ("vocab_vs_config", r"vocab.txt: 38 tokens but the model config has vocab_size=20"),
    ("checkpoint_vs_config", r"checkpoint does not match the model config: mis-shaped: "
                             r"bert/embeddings/word_embeddings is \[38, 32\], model wants \[38, 64\]"),
    ("too_many_gpus", r"--n_gpus=2 but only 0 GPU\(s\) are visible"),
    ("negative_gpus", r"--n_gpus=-2 is invalid; it must be an integer >= -1"),
    ("seq_over_positions", r"--max_seq_length=100 is over the model's position table"),
    ("nul_byte", r"train.tsv:3: NUL byte at column 8; is it a binary or UTF-16 file\?"),
    ("invalid_utf8", r"train.tsv:4: invalid UTF-8 at byte 10 of the line \(invalid start byte\); .*"
                     r"--invalid_utf8=replace"),
    ("unclosed_quote", r"train.csv:3: a quote opened on this line never closes"),
    ("empty_text", r"train.tsv:3: empty text in column 2"),
    ("labels_differ", r"train.tsv:3: label 'neg' is not one of bad, pos"),
    ("towers_zero", r"--towers_per_gpu=0 is invalid"),
    ("layerwise_lr_decay_over_1", r"--layerwise_lr_decay=1.2: must be above 0 and at most 1"),
    ("cuda_names_missing_devices", r"CUDA_VISIBLE_DEVICES=5,7 lists 2 device\(s\) but TensorFlow sees only 0"),
    ("output_dir_is_a_file", r"--output_dir=.*keep.txt is a file, not a directory"),
    ("output_dir_not_writable", r"--output_dir=/sys/kernel is not writable"),
    ("config_of_another_model", r"bert_config.json: model_type='roberta' is not BERT"),
    ("auto_batch_without_limit", r"--auto_batch_size on CPU needs --memory_limit_mb"),
    ("unreadable_file", r"train.tsv: cannot read \(Is a directory\)"),
    ("epochs_nan", r"--num_train_epochs=nan: must be a finite number above 0"),
    ("epochs_inf", r"--num_train_epochs=inf: must be a finite number above 0"),
    ("eval_batch_zero", r"--eval_batch_size=0: must be at least 1"),
    ("seq_length_one", r"--max_seq_length=1: must be at least 3"),
    ("stride_over_window", r"--doc_stride=400: must be above 0 and below the \d+ pieces of a window"),
    ("pooling_without_stride", r"--window_pooling=max needs --doc_stride"),
    ("truncation_with_windows", r"--truncation=tail with --doc_stride: windows keep every piece"),
    ("class_weights_count", r"--class_weights: 3 weights for 2 labels \(neg, pos\)"),
    ("class_weights_negative", r"--class_weights=1,-1: each weight must be a finite number above 0"),
    ("focal_gamma_negative", r"--focal_gamma=-1.0: must be a finite number, 0 or more"),
    ("class_weights_multi_label", r"--class_weights and --focal_gamma weigh a softmax over classes"),
    ("rdrop_negative", r"--rdrop_alpha=-1.0: must be a finite number, 0 or more"),
    ("rdrop_multi_label", r"--rdrop_alpha compares two passes' softmax over classes .*; not a multi_label head's"),
    ("adam_eps_zero", r"--adam_eps=0.0: must be a finite number above 0"),
    ("ema_decay_one", r"--ema_decay=1.0: must be 0 \(no average\) or more, and below 1"),
    ("adv_epsilon_zero", r"--adv_epsilon=0.0: must be a finite number above 0"),
    ("lora_targets_unknown", r"--lora_targets=query,dense: distinct names of query, key, value, attention_output"),
    ("lora_on_keras_hub_layers", r"--lora_rank runs its adapters in bert_mgpu's fused encoder: leave "
                                 r"--fused_encoder on"),
    ("train_is_a_file", r"out/train is a file; bert_mgpu writes its TensorBoard events into a directory"),
    ("train_is_a_link", r"out/train is a symbolic link; .* remove the link"),
    ("tab_inside_text", r"train.tsv:3: 3 cells but the first row has 2; a tab inside a text\?"),
    ("config_cut_short", r"rel/config.json:3: not valid JSON \(.*\)"),
    ("run_file_cut_short", r"rel/bert_mgpu.json:4: not valid JSON \(Unterminated string starting at, column \d+\)"),
])
def test_bad_input_is_one_line_and_nonzero_exit(case, expected, tmp_path, data, google_release):
    import re

    d, release, extra, env = tmp_path / "d", google_release, [], None
    d.mkdir()
    write_tsv(d / "train.tsv", sentiment_rows(20))
    write_tsv(d / "dev.tsv", sentiment_rows(5))
    if case == "missing_file":
        os.remove(d / "train.tsv")
    elif case == "malformed_row":
        write_tsv(d / "train.tsv", [("pos", "fine"), ("only-one-column",)])
    elif case == "unknown_label":
        write_tsv(d / "dev.tsv", [("maybe", "hmm")])
    elif case == "empty_dataset":
        write_tsv(d / "train.tsv", [])
        extra = ["--labels=neg,pos"]
    elif case == "vocab_vs_config":
        release = bad_release(tmp_path, vocab_size=20)
    elif case == "checkpoint_vs_config":
        release = bad_release(tmp_path, hidden_size=64)
    elif case == "layerwise_lr_decay_over_1":
        extra = ["--layerwise_lr_decay=1.2"]
    elif case == "too_many_gpus":
        extra = ["--n_gpus=2"]
    elif case == "negative_gpus":
        extra = ["--n_gpus=-2"]
    elif case == "seq_over_positions":
        extra = ["--max_seq_length=100"]
    elif case == "nul_byte":
        write_tsv(d / "train.tsv", [("pos", "good"), ("neg", "bad\x00film")])
    elif case == "invalid_utf8":
        (d / "train.tsv").write_bytes(b"label\ttext\npos\tgood\nneg\tbad\npos\tfine \xff film\n")
    elif case == "unclosed_quote":
        (d / "train.csv").write_text('label,text\npos,good\nneg,"bad film\npos,fine\n')
        (d / "dev.csv").write_text("label,text\npos,good\n")
        extra = ["--task_name=csv"]
    elif case == "empty_text":
        write_tsv(d / "train.tsv", [("pos", "good"), ("neg", "  ")])
    elif case == "labels_differ":
        write_tsv(d / "train.tsv", [("pos", "good"), ("neg", "bad")])
        extra = ["--labels=bad,pos"]
    elif case == "towers_zero":
        extra = ["--towers_per_gpu=0"]
    elif case == "cuda_names_missing_devices":
        extra, env = ["--n_gpus=1"], {"CUDA_VISIBLE_DEVICES": "5,7"}
    elif case == "config_of_another_model":
        release = bad_release(tmp_path)
        with open(os.path.join(release, "bert_config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(release, "bert_config.json"), "w") as f:
            json.dump({**cfg, "model_type": "roberta"}, f)
    elif case == "auto_batch_without_limit":
        extra = ["--auto_batch_size"]
    elif case == "unreadable_file":  # (the tests run as root, whom file permissions do not stop)
        os.remove(d / "train.tsv")
        (d / "train.tsv").mkdir()
    elif case in NUMBERS:
        extra = NUMBERS[case].split()
    elif case == "tab_inside_text":
        write_tsv(d / "train.tsv", [("pos", "good"), ("neg", "bad\tfilm")])
    elif case == "config_cut_short":  # a Hugging Face directory whose config.json a crash cut short
        release = tmp_path / "rel"
        release.mkdir()
        (release / "config.json").write_text('{\n  "model_type": "bert",\n  "hidden_')
    elif case == "run_file_cut_short":  # a bert_mgpu output directory, its bert_mgpu.json cut short
        release = tmp_path / "rel"
        release.mkdir()
        (release / "bert_mgpu.json").write_text('{\n  "kind": "classifier",\n  "labels": [\n    "neg", "po')
    out = tmp_path / "out"
    out.mkdir()
    linked = tmp_path / "elsewhere"
    linked.mkdir()
    if case == "train_is_a_file":
        (out / "train").write_text("mine")
    elif case == "train_is_a_link":
        os.symlink(linked, out / "train")
    (out / "keep.txt").write_text("already here")
    target = {"output_dir_is_a_file": out / "keep.txt", "output_dir_not_writable": "/sys/kernel"}.get(case, out)
    args = common(str(d), release, str(target), "--do_train", "--do_eval") + extra
    # The cases of STARTED_AS_A_USER_DOES start a new interpreter with no TF_CPP_MIN_LOG_LEVEL, as a user
    # does: TensorFlow's start-up lines must not precede the error. The others fork from one that has
    # TensorFlow loaded already (tests/script_runner.py).
    as_a_user = case in STARTED_AS_A_USER_DOES
    proc = run_script("run_classifier_mgpu.py", *args, check=False, fresh=as_a_user,
                      env={**({"TF_CPP_MIN_LOG_LEVEL": None} if as_a_user else {}), **(env or {})})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("run_classifier_mgpu.py: error:")]
    assert len(ours) == 1 and re.search(expected, ours[0]), proc.stderr[-2000:]
    assert ours[0] == proc.stderr.strip().splitlines()[-1]
    for noise in ("cuInit", "cudart_stub", "absl::InitializeLog", "cpu_feature_guard") if as_a_user else ():
        assert noise not in proc.stderr, proc.stderr[:2000]
    assert (out / "keep.txt").read_text() == "already here"
    assert os.listdir(linked) == [] and (case != "train_is_a_file" or (out / "train").read_text() == "mine")


def test_tiny_config_sanity():
    assert tiny_config(38).hidden_size == 32  # the fixtures above assume it


@pytest.mark.process
def test_auto_batch_size_trains_with_the_largest_batch_that_fits(data, google_release, tmp_path):
    import re

    out = tmp_path / "auto"
    proc = run(*common(data, google_release, str(out), "--do_train", "--auto_batch_size", "--memory_limit_mb=8",
                       "--num_train_epochs=0.25"))
    found = re.search(r"auto batch size: (\d+) per tower fits in 7.8 MiB, 98% of 8 \(trials (.*)\)", proc.stderr)
    assert found, proc.stderr[-2000:]
    best = int(found.group(1))
    peaks = {int(b): (float(p), over) for b, p, over in re.findall(r"(\d+): ([\d.]+) MiB( over)?", found.group(2))}
    assert peaks[best] == (peaks[best][0], "") and peaks[best][0] <= 7.84  # the edge, measured on both sides
    assert peaks[best + 1][1] == " over" and peaks[best + 1][0] >= 7.84  # (over 98% of 8 MiB, shown to 0.01)
    run_info = json.load(open(out / "bert_mgpu.json"))
    assert run_info["settings"]["per_tower_batch"] == best
    # trained with it: 2 towers, 1/4 of an epoch of ceil(640 / global batch) steps, rounded up (transformers')
    assert run_info["global_step"] == math.ceil(math.ceil(640 / (2 * best)) * 0.25)


# ---------------------------------------------------------------- what a red-team found (issue 24)

def copy_run(run, tmp_path):
    """A writable copy of the read-only shared run -> (its directory, the run's args writing there, without
    --do_export: these reruns' subject is resuming, and a run started over would export every format again)."""
    return run.copy(tmp_path / "run", without=("--do_export", "--export_format="))


def snapshot(directory):
    """Every file under `directory` with its bytes: what a refused run must leave as it was."""
    return {os.path.relpath(os.path.join(root, name), directory): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(directory) for name in names}


def one_error_line(proc):
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stderr.strip().splitlines()[-1]


def test_eval_and_predict_fall_back_past_a_damaged_newest_checkpoint(trained, classifier_run, data, tmp_path):
    out, _ = copy_run(classifier_run, tmp_path)
    newest = os.path.join(out, "ckpt-160.data-00000-of-00001")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)  # a copy cut short
    flags = ["--task_name=tsv", f"--data_dir={data}", "--n_gpus=0", "--eval_batch_size=4", "--predict_batch_size=4",
             "--max_seq_length=32", "--precision=float32", "--do_eval", "--do_predict"]
    proc = run(*flags, f"--output_dir={out}")  # eval/predict of the output directory itself
    assert f"using {out}/ckpt-150, not the damaged {out}/ckpt-160" in proc.stderr
    listed = proc.stdout.strip().splitlines()[-1]  # the summary names what was read, and what could not be
    assert listed.startswith(f"  outputs in {out}: ckpt-160 (damaged: not read), ckpt-150 (latest readable "
                             "checkpoint), bert_config.json, "), listed
    reference = tmp_path / "reference"
    run(*flags, f"--init_checkpoint={out}/ckpt-150", f"--output_dir={reference}")
    for name in ("eval_results.txt", "test_results.tsv"):
        assert open(os.path.join(out, name)).read() == (reference / name).read_text(), name
    assert float(re.search(r"eval_accuracy = (\S+)", (reference / "eval_results.txt").read_text())[1]) >= 0.9
    assert "global_step = 150\n" in (reference / "eval_results.txt").read_text()  # the step it read, not 160


def test_a_checkpoint_file_naming_another_directory_is_refused(trained, data, tmp_path):
    """A `checkpoint` file that names ../elsewhere/ckpt-160, through --init_checkpoint or eval's default
    --output_dir: refused in one line, nothing written."""
    here = tmp_path / "here"
    here.mkdir()
    for name in ("bert_mgpu.json", "vocab.txt"):
        shutil.copy(os.path.join(trained[0], name), here / name)
    outside = os.path.relpath(os.path.join(trained[0], "ckpt-160"), here)
    (here / "checkpoint").write_text(f'model_checkpoint_path: "{outside}"\n')
    before = snapshot(here)
    flags = ["--task_name=tsv", f"--data_dir={data}", "--n_gpus=0", "--max_seq_length=32", "--do_eval"]
    for where in ([f"--output_dir={here}"], [f"--init_checkpoint={here}", f"--output_dir={tmp_path / 'o'}"]):
        line = one_error_line(run(*flags, *where, check=False))
        assert line == (f"run_classifier_mgpu.py: error: {here}/checkpoint: names {here}/{outside}, outside "
                        f"{here}; refusing to read it"), line
    assert snapshot(here) == before and not os.path.exists(tmp_path / "o" / "eval_results.txt")


def test_a_rerun_with_another_vocabulary_is_another_run(trained, classifier_run, tmp_path):
    out, args = copy_run(classifier_run, tmp_path)
    tokens = open(os.path.join(out, "vocab.txt")).read().split("\n")
    tokens[10], tokens[11] = tokens[11], tokens[10]  # the same size, another vocabulary
    other = tmp_path / "other_vocab.txt"
    other.write_text("\n".join(tokens))
    before = snapshot(out)
    line = one_error_line(run(*args, f"--vocab_file={other}", check=False))
    assert "holds a run with other settings (--vocab_sha256=" in line, line
    assert snapshot(out) == before


def test_a_save_killed_half_way_is_cleaned_up_on_resume_and_on_overwrite(trained, classifier_run, tmp_path):
    """kill -9 during a save leaves ckpt-N_temp/ (a directory matching ckpt-*): resuming removes it, and
    --overwrite_output_dir starts over without tripping on it."""
    out, args = copy_run(classifier_run, tmp_path)
    left = os.path.join(out, "ckpt-161_temp")
    os.makedirs(left)
    open(os.path.join(left, "part-00000-of-00001.data-00000-of-00001"), "wb").write(b"\0" * 100)
    run(*args)
    assert not os.path.exists(left) and os.path.exists(os.path.join(out, "ckpt-160.index"))
    os.makedirs(left)
    run(*[a for a in args if not a.startswith(("--learning_rate", "--num_train_epochs"))], "--learning_rate=1e-3",
        "--num_train_epochs=0.25", "--overwrite_output_dir")
    assert sorted(f for f in os.listdir(out) if f.startswith("ckpt-")) == [
        "ckpt-10.data-00000-of-00001", "ckpt-10.index"]
    assert json.load(open(os.path.join(out, "bert_mgpu.json")))["global_step"] == 10


def test_result_files_follow_the_umask_as_checkpoints_do(classifier_run):
    mask = os.umask(0o022)
    os.umask(mask)
    written = classifier_run.facts["modes"]  # each file's mode as the run wrote it, before it was made read-only
    modes = {name: written[name] for name in (
        "ckpt-160.index", "eval_results.txt", "predictions.tsv", "bert_mgpu.json", "vocab.txt")}
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_a_linked_vocab_is_replaced_not_written_through_and_a_short_one_is_named(data, tmp_path):
    """vocab.txt in --output_dir as a link to someone's file: the run replaces the link, the file stays.
    A vocabulary shorter than the config's vocab_size trains, with a warning naming both numbers."""
    release, _ = write_google_release(str(tmp_path / "rel"), config=tiny_config(45))  # 38 tokens in vocab.txt
    out = tmp_path / "out"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("not a vocabulary\n")
    os.symlink(precious, out / "vocab.txt")
    proc = run(*common(data, release, str(out), "--do_train", "--num_train_epochs=0.1"))
    assert "vocab.txt: 38 tokens but the model config has vocab_size=45; the last 7 embedding rows" in proc.stderr
    assert precious.read_text() == "not a vocabulary\n"
    assert not os.path.islink(out / "vocab.txt")
    assert (out / "vocab.txt").read_text() == open(os.path.join(release, "vocab.txt")).read()
