"""`make gpu-check` on a machine without GPUs: every check runs, each in its own process, on logical CPU devices
with the GPU run's own objects, says so, and writes its JSON."""

import json
import subprocess
import sys

import pytest

from bert_mgpu.cli import gpu_check


class ForkedChildren:
    """gpu_check's `subprocess`, with each check's child forked from the test worker's warm server
    (tests/script_runner.py) instead of a new interpreter: still a process of its own, with its own devices
    and TensorFlow runtime, the check's argv and environment; it skips the import, 4-6 s a child."""

    PIPE, TimeoutExpired, Popen = subprocess.PIPE, subprocess.TimeoutExpired, subprocess.Popen

    def __init__(self):
        self.argvs = []

    def run(self, cmd, capture_output, text, timeout, env):
        from conftest import run_python

        assert cmd[:3] == [sys.executable, "-m", "bert_mgpu.cli.gpu_check"] and capture_output and text
        self.argvs.append(cmd[3:])
        code = f"import sys\nfrom bert_mgpu.cli import gpu_check\nsys.exit(gpu_check.main({cmd[3:]!r}))"
        return run_python(code, env=env, timeout=timeout, check=False)


@pytest.mark.process
def test_gpu_check_runs_every_check_on_logical_cpu_devices_and_writes_its_json(tmp_path, monkeypatch, capsys):
    out = tmp_path / "output" / "gpu_check.json"
    children = ForkedChildren()
    monkeypatch.setattr(gpu_check, "subprocess", children)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    code = gpu_check.main(["--quick", f"--out={out}"])
    proc = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert [argv[1] for argv in children.argvs] == [c for c in gpu_check.CHECKS if c != "two_workers"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (f"{len(gpu_check.CHECKS)} of {len(gpu_check.CHECKS)} checks passed on logical CPU devices, with the GPU "
            "run's own strategy and NCCL collectives") in proc.stdout
    checks = json.load(open(out))["checks"]
    assert list(checks) == list(gpu_check.CHECKS) and all(c["ok"] for c in checks.values())
    for policy, dtypes in (("mixed_float16", {"float16", "float32"}), ("mixed_bfloat16", {"float32"}),
                           ("float32", {"float32"})):
        step = checks[f"step_{policy}"]
        assert step["collectives"] == ["nccl"] and step["differ"] == [] and step["applied"] >= 1
        assert len(step["packs"]) >= 4 and {d for d, _ in step["packs"]} == dtypes, step["packs"]
    assert checks["two_towers_per_gpu"]["all_reduce"] == "ring"
    heads = checks["heads_mixed_float16"]
    assert heads["tagger_crf"]["differ"] == [] and heads["tagger_crf"]["transitions_moved"] > 0
    assert heads["span"]["differ"] == [] and heads["span"]["applied"] >= 1
    assert heads["multiple_choice"]["differ"] == [] and heads["multiple_choice"]["applied"] >= 1
    assert heads["distilled_tagger"]["differ"] == heads["distilled_tagger"]["teacher_changed"] == []
    assert min(heads["distilled_tagger"]["hidden_and_attention"]) > 0  # the intermediate losses ran in float16
    cached = heads["distilled_cached"]  # --teacher_logits: the batch's cached outputs teach, no teacher runs
    assert cached["differ"] == [] and cached["cached_soft"] > 0 and cached["applied"] >= 1
    pgd = heads["adversarial"]
    assert pgd["differ"] == [] and pgd["adversarial_loss"] > 0 and pgd["applied"] >= 1
    assert heads["ema"]["differ"] == [] and heads["ema"]["applied"] >= 2 and heads["ema"]["averages_apart"] > 0
    adapted = heads["lora"]  # --lora_rank: the adapters moved on every tower alike, the encoder not at all
    assert adapted["differ"] == adapted["encoder_changed"] == [] and adapted["adapters_moved"] > 0
    electra = heads["electra"]  # embeddings half as wide, projected; no pooler trained
    assert electra["differ"] == [] and electra["projection_moved"] > 0 and electra["pooler_trained"] is False
    failing = checks["failing_tower"]
    assert failing["message"].startswith("out of memory on tower 1 at per-tower batch 4 x sequence length 32")
    assert failing["seconds"] < 120
    workers = checks["two_workers"]["workers"]
    assert [w["policy"] for w in workers] == ["mixed_bfloat16"] * 2 and workers[0]["checksum"] == workers[1]["checksum"]
    assert [r["towers"] for r in checks["scaling"]["rows"]] == [1, 2] and checks["scaling"]["rows"][0]["speedup"] == 1
    assert checks["devices"]["cuda_device_order"] == "PCI_BUS_ID"
    assert checks["libraries"]["cuda13_wheels"] == []


def test_a_check_that_raises_fails_in_one_line_and_an_unknown_one_is_refused(tmp_path):
    """Each check runs in a child process: one that raises comes back as a failed result naming its error
    (the parent goes on to the next); a name that is no check is refused before anything runs."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "-m", "bert_mgpu.cli.gpu_check", "--only=devices,nonsense", f"--out={out}"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown check(s) nonsense" in proc.stderr
    result = gpu_check.run_child(["--check", "no_such_check"], 120)
    assert not result["ok"] and "AttributeError" in result["error"]


def test_a_checks_devices_keep_memory_statistics_where_onednn_is_off():
    """auto_batch_size reads the CPU allocator's peaks: a child's Setup chooses an allocator that keeps them
    before TensorFlow starts, as Towers does (with oneDNN off, as on AVX2-only CPUs, the default keeps none)."""
    from conftest import run_python

    code = ("from bert_mgpu.cli.gpu_check import Setup\nfrom bert_mgpu.parallel import devices\n"
            "from bert_mgpu.train import memory\nSetup()\n"
            "import tensorflow as tf\nmeter = memory.peak_meter(devices.plan_devices(0, 1, ()))\n"
            "x = tf.ones([64, 2**20 // 4])\nkept = meter.read_mb()\ndel x\nmeter.reset()\n"
            "print('peak MiB', kept, meter.read_mb())")
    proc = run_python(code, env={"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPU_ALLOCATOR_USE_BFC": None}, check=False)
    assert proc.returncode == 0 and "peak MiB" in proc.stdout, proc.stderr[-2000:]
    kept, after_reset = (float(v) for v in proc.stdout.split("peak MiB")[1].split())
    assert 64 <= kept < 80 and after_reset < 16, proc.stdout  # the 64 MiB tensor seen, and gone after reset()


def test_two_workers_split_the_gpus_from_nvidia_smi_when_cuda_visible_devices_is_unset():
    """A fresh 8-GPU machine sets no CUDA_VISIBLE_DEVICES: each worker gets half of nvidia-smi's GPUs, never
    one GPU for both (NCCL with two ranks on one device); one GPU skips the check with the reason."""
    smi = [(i, f"GPU-{i}", "A100", "8.0") for i in range(8)]
    assert gpu_check.worker_gpus({}, smi) == (["0,1,2,3", "4,5,6,7"], None)
    assert gpu_check.worker_gpus({"CUDA_VISIBLE_DEVICES": "1,2,3,4,5,6"}, smi) == (["1,2,3", "4,5,6"], None)
    assert gpu_check.worker_gpus({"CUDA_VISIBLE_DEVICES": "3,5,7"}, smi) == (["3", "5"], None)  # odd: one left out
    assert gpu_check.worker_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi) == (None, None)  # GPUs hidden: CPU towers
    assert gpu_check.worker_gpus({}, []) == (None, None)
    for env, gpus in (({"CUDA_VISIBLE_DEVICES": "2"}, smi), ({}, smi[:1])):
        halves, why = gpu_check.worker_gpus(env, gpus)
        assert halves is None and why.startswith("two workers need a GPU each, and this process may use one")


def test_two_workers_is_skipped_with_its_reason_on_one_gpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpu_check.main(["--only", "two_workers", "--out", str(tmp_path / "c.json")]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == ("[skip] two_workers: skipped: two workers need a GPU each, and this process may use one "
                        "(0)")
    assert shown[-1].startswith("0 of 1 checks passed on ") and "(1 skipped: two_workers)" in shown[-1]


@pytest.mark.parametrize("code, version", [(21903, "2.19.3"), (2804, "2.8.4")])
def test_the_nccl_version_is_what_the_loaded_library_says(code, version, tmp_path):
    """Read through the library's own ncclGetVersion (a stand-in library here: no NCCL on a CPU machine), in
    both of NCCL's version codes (major*10000 since 2.9, major*1000 before)."""
    import shutil

    from bert_mgpu.cli import checks_gpu

    if not shutil.which("cc"):
        pytest.skip("no C compiler (cc) to build the stand-in library")
    source = tmp_path / "nccl.c"
    source.write_text(f"int ncclGetVersion(int *version) {{ *version = {code}; return 0; }}\n")
    library = tmp_path / "libnccl.so.2"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert checks_gpu.nccl_version(str(library)) == version
    assert checks_gpu.nccl_version(str(tmp_path / "missing.so")) is None
