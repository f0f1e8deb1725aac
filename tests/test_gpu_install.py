"""A machine with GPUs installs TensorFlow's CUDA libraries: setup.py's gpu extra, pinned, chosen by make."""

import os
import re
import stat
import subprocess
from importlib import metadata

from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_plan(tmp_path, nvidia_smi_output=None):
    """The commands `make venv` would run (dry run, forced), with a fake nvidia-smi on PATH or none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if nvidia_smi_output is not None:
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{nvidia_smi_output}'\n")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    elif fake.exists():
        fake.unlink()
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["make", "-n", "-B", "venv"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout


def test_make_installs_the_gpu_extra_only_where_nvidia_smi_lists_a_gpu(tmp_path):
    gpus = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d3c0a9e-0000-0000-0000-000000000000)"
    assert "-e '.[test,gpu]'" in make_plan(tmp_path, gpus)
    assert "-e '.[test,reference]'" in make_plan(tmp_path, "No devices were found")
    assert "-e '.[test,reference]'" in make_plan(tmp_path, None)


def test_a_gpu_install_plans_no_cuda_13_library_and_no_pytorch(tmp_path):
    """PyTorch's CUDA wheels (torch 2.13 needs nvidia-nccl-cu13, nvidia-cudnn-cu13) write the same
    nvidia/nccl and nvidia/cudnn files TensorFlow's cu12 wheels own: the GPU plan's extras must not hold
    it, and nothing they pull or pin may be a CUDA 13 wheel."""
    gpus = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d3c0a9e-0000-0000-0000-000000000000)"
    extras = make_plan(tmp_path, gpus).split("-e '.[", 1)[1].split("]'", 1)[0].split(",")
    assert extras == ["test", "gpu"]
    ours = [Requirement(r) for r in metadata.requires("bert_mgpu")]
    planned = [r for r in ours if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras)]
    names = {r.name for r in planned}
    assert not names & {"torch", "transformers", "peft"}, names
    cuda = [Requirement(r).name for r in metadata.requires("tensorflow") if 'extra == "and-cuda"' in r]
    assert cuda and all(name.endswith("-cu12") for name in cuda if name.startswith("nvidia-")), cuda
    pinned = re.findall(r"^(nvidia-[A-Za-z0-9_.-]+)==", open(os.path.join(ROOT, "constraints.txt")).read(), re.M)
    assert pinned and not [p for p in pinned if p.endswith("-cu13")], pinned
    reference = [r for r in ours if r.marker is not None and r.marker.evaluate({"extra": "reference"})
                 and not r.marker.evaluate({"extra": "gpu"})]
    assert {r.name for r in reference} == {"torch", "transformers", "peft"}  # PEFT pulls PyTorch too


def test_the_gpu_extra_is_tensorflow_and_cuda_and_every_cuda_wheel_is_pinned_in_its_range():
    extra = [Requirement(r) for r in metadata.requires("bert_mgpu") if 'extra == "gpu"' in r]
    assert [(r.name, r.extras) for r in extra] == [("tensorflow", {"and-cuda"}), ("nvidia-ml-py", set())]
    tensorflow_needs = {Requirement(r).name: Requirement(r).specifier for r in metadata.requires("tensorflow")
                        if 'extra == "and-cuda"' in r}
    assert len(tensorflow_needs) >= 10 and "nvidia-nccl-cu12" in tensorflow_needs
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", open(os.path.join(ROOT, "constraints.txt")).read(), re.M))
    for name, specifier in tensorflow_needs.items():
        assert name in pins, f"constraints.txt does not pin {name}"
        assert specifier.contains(pins[name]), f"{name}=={pins[name]} is outside TensorFlow's {specifier}"
