"""`make gpu-check` on a machine without GPUs: the same checks on logical CPU devices, and it says so."""

import json
import os
import subprocess
import sys


def test_gpu_check_runs_every_check_on_logical_cpu_devices(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "-m", "bert_mgpu.gpu_check", "--steps=2", f"--out={out}"],
                          capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no GPU visible to TensorFlow: the same checks on 2 logical CPU devices" in proc.stdout
    assert "3 of 3 checks passed on 2 CPU tower(s)" in proc.stdout
    report = json.load(open(out))
    checks = report["checks"]
    assert report["device_type"] == "CPU" and report["towers"] == 2 and report["policy"] == "mixed_float16"
    assert checks["towers_bit_equal"]["differ"] == [] and checks["towers_bit_equal"]["applied"] == 3
    assert checks["fused_matches_keras_hub"]["gradient_error"] < 0.02
    assert checks["fused_matches_keras_hub"]["output_error"] < 0.05
    assert [r["towers"] for r in report["scaling"]] == [1, 2]
    assert all(r["examples_per_s"] > 0 for r in report["scaling"]) and report["scaling"][0]["speedup"] == 1.0
