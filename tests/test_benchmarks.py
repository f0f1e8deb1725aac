"""The benchmark's arithmetic: model FLOPs per sequence and the GPU scaling model's sizes."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import common  # noqa: E402
import gpu_scaling  # noqa: E402


def test_case_a_sequence_is_8_6_gflop_and_padding_counts_nothing():
    minilm = common.SHAPES["minilm"]
    per_sequence = common.model_flops(minilm, [128], "train")
    assert abs(per_sequence / 1e9 - 8.6) < 0.05  # the figure quoted for case (a)
    assert common.model_flops(minilm, [128], "predict") * 3 == per_sequence
    short = common.model_flops(minilm, [20], "train")
    assert short < per_sequence / 6  # real tokens only: a 20-token sentence is not charged 128


def test_bert_base_and_large_sizes_and_allreduce_time():
    assert abs(gpu_scaling.params(*gpu_scaling.SHAPES["BERT-base"]) / 1e6 - 109.5) < 0.5
    assert abs(gpu_scaling.params(*gpu_scaling.SHAPES["BERT-large"]) / 1e6 - 335) < 1
    # ring all-reduce moves 2(N-1)/N of the buffer: 1 GB on 8 GPUs at 100 GB/s is 17.5 ms (+ latency)
    t = gpu_scaling.allreduce_seconds(1e9, 8, 100e9)
    assert 0.0175 <= t < 0.0177
    assert gpu_scaling.allreduce_seconds(1e9, 1, 100e9) == 0.0


def test_every_system_computes_in_the_precision_the_cpu_has_hardware_for(monkeypatch):
    from bert_mgpu.parallel import precision

    monkeypatch.delenv("BENCH_PRECISION", raising=False)
    for flags, expected in (({"avx2", "amx_bf16"}, "bf16"), ({"avx512_bf16"}, "bf16"), ({"avx2"}, "fp32")):
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: flags)
        assert common.precision() == expected
    monkeypatch.setenv("BENCH_PRECISION", "fp32")  # what bench.py hands each system's process
    assert common.precision() == "fp32"
    scripts = {name: open(os.path.join(os.path.dirname(common.__file__), name)).read()
               for name in ("bench_bert_mgpu.py", "bench_keras_hub.py", "bench_transformers.py")}
    for name, text in scripts.items():  # each system reads the shared choice; none fixes its own
        assert "common.precision()" in text and '"mixed_bfloat16")' not in text, name


def test_every_name_the_benchmarks_import_from_bert_mgpu_exists():
    """The benchmarks import inside their functions, so a moved name breaks them only when run: `make bench`
    once failed on a name the objective seam had moved. Every `from bert_mgpu... import name` is resolved."""
    import ast
    import glob
    import importlib

    missing = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "*.py"))):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_mgpu"):
                module = importlib.import_module(node.module)
                missing += [f"{os.path.basename(path)}: {node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name) and not importlib.util.find_spec(f"{node.module}.{a.name}")]
    assert not missing, missing
