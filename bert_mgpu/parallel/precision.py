"""Precision policy: which Keras mixed-precision policy pays on the hardware, and why.

GPUs with fp16 tensor cores (compute capability >= 7.0) gain from mixed_float16 (with dynamic loss
scaling); CPUs with AMX or AVX512-BF16 run bfloat16 matmuls several times faster than float32 and need no
loss scaling (bf16 has float32's exponent range); everything else stays float32.
"""

CHOICES = ("auto", "mixed_float16", "mixed_bfloat16", "float32")
_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def choose_precision(requested, gpu_capabilities, cpu_flags):
    """Pure: (flag value, [(major, minor)] of the tower GPUs or [] for CPU, CPU flag set) -> (policy, why)."""
    if requested not in CHOICES:
        raise ValueError(f"--precision={requested} is not one of {', '.join(CHOICES)}")
    if requested != "auto":
        return requested, "requested by --precision"
    if gpu_capabilities:
        worst = min(gpu_capabilities)
        if worst >= (7, 0):
            return "mixed_float16", f"GPU compute capability {worst[0]}.{worst[1]} has fp16 tensor cores"
        return "float32", f"GPU compute capability {worst[0]}.{worst[1]} < 7.0 has no fp16 tensor cores"
    found = [f for f in _BF16_CPU_FLAGS if f in cpu_flags]
    if found:
        return "mixed_bfloat16", f"CPU has {'/'.join(found)} (fast bfloat16 matmul)"
    return "float32", "CPU has neither AMX nor AVX512-BF16"


def cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The CPU feature flags, or an empty set where they cannot be read."""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def gpu_capabilities(plan):
    """Compute capabilities of the plan's GPUs, [] for a CPU plan."""
    if plan.device_type != "GPU":
        return []
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    caps = []
    for i in plan.physical_ids:
        cap = tf.config.experimental.get_device_details(gpus[i]).get("compute_capability")
        caps.append(tuple(cap) if cap else (0, 0))
    return caps


def resolve_precision(requested, plan):
    """The policy for this plan on this machine, and the reason the log prints."""
    return choose_precision(requested, gpu_capabilities(plan), cpu_flags())
