"""system/ metrics on every logging step: the process's CPU use and resident memory, and NVML's view of
each GPU the towers use (a fake NVML here: no GPU on this machine), with their peaks in the summary."""

import types

import numpy as np
import pytest
from test_loop import tiny_trainer

from bert_mgpu.train import system_metrics
from bert_mgpu.train.loop import Loop
from bert_mgpu.train.system_metrics import SystemMetrics


class FakeNVML(types.SimpleNamespace):
    """pynvml's calls the hook makes, for GPUs of PCI bus index 0-3 (and UUIDs GPU-a..d); GPU 3 has no
    power sensor. Each reading goes up by one step, so peaks are the last values."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__(reads=0, asked=[])

    def nvmlDeviceGetHandleByIndex(self, i):
        self.asked.append(("index", i))
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked.append(("uuid", uuid))
        return "abcd".index(uuid[-1])

    def nvmlDeviceGetUtilizationRates(self, h):
        self.reads += 1
        return types.SimpleNamespace(gpu=90 + h + self.reads, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=(20 + h) * 2**30 + self.reads * 2**20, total=40 * 2**30)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 70 + h

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 3:
            raise self.NVMLError("Not Supported")
        return 250_000 + 1000 * h  # milliwatts


def test_gpus_are_found_by_pci_index_or_uuid_and_read_in_their_units():
    nvml = FakeNVML()
    hook = SystemMetrics(["2", "GPU-d"], nvml=nvml)
    assert nvml.asked == [("index", 2), ("uuid", "GPU-d")]
    values = hook.read()
    assert values["system/gpu0_utilization"] == 93.0 and values["system/gpu1_utilization"] == 95.0
    assert values["system/gpu0_memory_used_gib"] == pytest.approx(22 + 1 / 1024)
    assert values["system/gpu0_temperature_c"] == 72.0 and values["system/gpu1_temperature_c"] == 73.0
    assert values["system/gpu0_power_w"] == 252.0 and "system/gpu1_power_w" not in values  # no sensor
    assert 0 <= values["system/cpu_percent"] and 0.1 < values["system/rss_gib"] < 24


def test_an_index_under_another_cuda_order_or_a_mig_instance_is_not_guessed():
    nvml = FakeNVML()
    handles = system_metrics.nvml_handles(nvml, ["1", "MIG-x"], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert handles == [None, None] and nvml.asked == []


def test_every_logged_record_has_the_system_metrics_and_the_summary_prints_their_peaks():
    """Through the loop: each record (TensorBoard's, the history's) carries them; the console line does not."""
    trainer, data = tiny_trainer()
    nvml = FakeNVML()
    loop = Loop(trainer, 8, hooks=[SystemMetrics(["0"], nvml=nvml)], log_every=2, verbose=False)
    loop.run(data, until_step=6)
    assert [r["step"] for r in loop.history] == [2, 4, 6]
    utilization = [r["system/gpu0_utilization"] for r in loop.history]
    assert utilization == [91.0, 92.0, 93.0]
    busy = [r["system/cpu_percent"] for r in loop.history]
    assert all(np.isfinite(busy)) and max(busy) > 10  # it trained: some CPU was used in each interval
    line = system_metrics.describe_peaks(loop.history)
    rss = max(r["system/rss_gib"] for r in loop.history)
    assert line == (f"cpu {max(busy):.0f}%, resident {rss:.2f} GiB; "
                    f"gpu0 93% busy, {20 + 3 / 1024:.1f} GiB, 70 °C, 250 W"), line
    assert system_metrics.describe_peaks([{"step": 1, "loss": 0.5}]) is None


def test_without_nvidia_ml_py_the_gpu_part_is_left_out_with_one_line(monkeypatch, caplog):
    import builtins
    import logging

    real = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with caplog.at_level(logging.INFO, logger="bert_mgpu"):
        hook = SystemMetrics(["0"])
    assert hook.handles == [] and "nvidia-ml-py is not installed" in caplog.text
    assert set(hook.read()) == {"system/cpu_percent", "system/rss_gib"}


def test_nvidia_ml_py_on_a_machine_without_a_driver_says_so_once_and_training_goes_on(caplog):
    """The real pynvml (the test extra has it): here there is no NVIDIA driver, so NVML cannot start."""
    import logging
    import shutil

    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra: make venv installs it")
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver: make gpu-check's nvml check reads NVML for real")
    with caplog.at_level(logging.WARNING, logger="bert_mgpu"):
        hook = SystemMetrics(["0"])
    assert hook.nvml is None and caplog.text.count("no GPU metrics: NVML did not start") == 1
    assert set(hook.read()) == {"system/cpu_percent", "system/rss_gib"}
