"""What the machine does while it trains, on every logging step, under `system/` in each record: this
process's CPU use (percent of one core, so 2 busy cores read 200) and resident memory, and for each GPU
the towers use, NVML's utilisation, memory used, temperature and power (nvidia-ml-py, the `gpu` extra;
without it, or without a driver, the GPU part is left out with one line saying why).

The summary block at the end of a script prints the peak of each (`peaks`).

Example:
    loop = Loop(trainer, 32, hooks=[SystemMetrics(towers.plan.visible_names)])
    # records then hold e.g. system/cpu_percent, system/rss_gib, system/gpu0_utilization, ...
"""

import logging
import os
import time

from bert_mgpu.train.loop import Hook

log = logging.getLogger("bert_mgpu")

PREFIX = "system/"
GIB = 2**30


def _resident_bytes():
    """This process's resident memory now (Linux's /proc), or None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _nvml():
    """The pynvml module (nvidia-ml-py), initialised, or None with the reason logged once."""
    try:
        import pynvml
    except ImportError:
        log.info("no GPU metrics: nvidia-ml-py is not installed (pip install 'bert_mgpu[gpu]')")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.warning("no GPU metrics: NVML did not start (%s)", e)
        return None
    return pynvml


def nvml_handles(nvml, names, environ=None):
    """NVML handles of the GPUs named as CUDA_VISIBLE_DEVICES names them (`DevicePlan.visible_names`): an
    index is NVML's own when CUDA numbers GPUs in PCI bus order (bert_mgpu sets that; NVML always uses it),
    a `GPU-` UUID is looked up. A MIG instance, or an index under another CUDA order, gets None."""
    env = os.environ if environ is None else environ
    by_bus = env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") == "PCI_BUS_ID"
    handles = []
    for name in names:
        if name.isdigit() and by_bus:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(name)))
        elif name.startswith("GPU-"):
            handles.append(nvml.nvmlDeviceGetHandleByUUID(name))
        else:
            handles.append(None)
    return handles


class SystemMetrics(Hook):
    """Adds `system/...` values to every training record (so TensorBoard, the loggers and the history
    get them).

    Args:
        gpus: the GPUs the towers use, as CUDA_VISIBLE_DEVICES names them (`towers.plan.visible_names`);
            () on CPU towers.
        nvml: the pynvml module to ask (a test gives a fake); by default nvidia-ml-py's, when there are GPUs.
    """

    def __init__(self, gpus=(), nvml=None):
        self.gpus = tuple(gpus)
        self.nvml = nvml if nvml is not None or not self.gpus else _nvml()
        self.handles = nvml_handles(self.nvml, self.gpus) if self.nvml is not None else []
        self._last = (time.monotonic(), time.process_time())

    def on_log(self, loop, record):
        record.update(self.read())

    def read(self) -> dict:
        """{"system/cpu_percent": ..., "system/rss_gib": ..., "system/gpu<i>_<what>": ...} now; CPU use
        is over the time since the last read."""
        wall, cpu = time.monotonic(), time.process_time()
        (wall0, cpu0), self._last = self._last, (wall, cpu)
        values = {f"{PREFIX}cpu_percent": 100.0 * (cpu - cpu0) / max(1e-9, wall - wall0)}
        rss = _resident_bytes()
        if rss is not None:
            values[f"{PREFIX}rss_gib"] = rss / GIB
        for i, handle in enumerate(self.handles):
            if handle is not None:
                values.update(self._gpu(i, handle))
        return values

    def _gpu(self, i, handle):
        nvml, out = self.nvml, {}
        queries = {  # what NVML answers -> (our name, unit conversion)
            "utilization": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,  # percent
            "memory_used_gib": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / GIB,
            "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # milliwatts
        }
        for name, query in queries.items():
            try:
                out[f"{PREFIX}gpu{i}_{name}"] = float(query())
            except nvml.NVMLError:  # a GPU that does not report it (power on some boards)
                pass
        return out


FORMATS = {  # a value's name without its device -> how the summary prints its peak
    "cpu_percent": "cpu {:.0f}%", "rss_gib": "resident {:.2f} GiB", "utilization": "{:.0f}% busy",
    "memory_used_gib": "{:.1f} GiB", "temperature_c": "{:.0f} °C", "power_w": "{:.0f} W"}


def peaks(history) -> dict:
    """{"system/...": the largest value logged} over a run's records."""
    top = {}
    for record in history:
        for key, value in record.items():
            if key.startswith(PREFIX):
                top[key] = max(value, top.get(key, value))
    return top


def describe_peaks(history) -> str | None:
    """The summary block's line: "cpu 195%, resident 2.31 GiB; gpu0 98% busy, 30.1 GiB, 79 °C, 250 W", or None."""
    devices = {}
    for key, value in peaks(history).items():
        name = key[len(PREFIX):]
        device, _, what = name.partition("_") if name.startswith("gpu") else ("", "", name)
        if what in FORMATS:
            devices.setdefault(device, []).append(FORMATS[what].format(value))
    return "; ".join((f"{d} " if d else "") + ", ".join(v) for d, v in devices.items()) or None
