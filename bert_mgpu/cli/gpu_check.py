"""`make gpu-check`: what the first person with GPUs runs to check bert_mgpu on them, in one command.

Each check runs in a process of its own, under a time limit, so that one that fails, crashes or hangs
never hides the others; `output/gpu_check.json` is rewritten after each. The checks: GPU numbering
(CUDA's against nvidia-smi's), the CUDA libraries TensorFlow loaded (and no CUDA 13 wheel beside them),
training steps with BERT-base-sized gradients (several packs) in mixed_float16, mixed_bfloat16 and
float32 with bit-equal towers after them, two towers per GPU (RING collectives), a tower made to run out
of memory (the run must end in one line, not hang), --auto_batch_size, the fused encoder against
keras-hub's, an XLA step, two worker processes on this machine, and the training loop's throughput on
1..N GPUs beside docs/gpu_scaling.md's model.

Without GPUs the same checks run on logical CPU devices with the objects a GPU run builds (the GPU plan,
NCCL collectives, which TensorFlow runs as RING there), and the report says so.

Usage: python -m bert_mgpu.cli.gpu_check [--out output/gpu_check.json] [--only step_mixed_float16,...]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

CHECKS = ("devices", "libraries", "step_mixed_float16", "step_mixed_bfloat16", "step_float32", "heads_mixed_float16",
          "two_towers_per_gpu", "failing_tower", "auto_batch_size", "fused_matches_keras_hub", "xla_step",
          "two_workers", "scaling")
LIMIT_S = {"scaling": 1800, "two_workers": 600}  # each check's time limit; others 600 s
PREFIX = "GPU_CHECK_RESULT "


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="output/gpu_check.json")
    ap.add_argument("--only", help="comma-separated checks to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="the tiny model in packs of 4 KiB instead of BERT-base "
                    "in packs of 32 MiB, and 10 timed steps (the test suite's run on CPU)")
    ap.add_argument("--check", help=argparse.SUPPRESS)  # a child: run this one check
    ap.add_argument("--task_index", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker_hosts", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.check:
        return child(args)
    names = args.only.split(",") if args.only else list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        ap.error(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    report = {"checks": {}}
    for name in names:
        start = time.monotonic()
        quick = ["--quick"] if args.quick else []
        result = two_workers() if name == "two_workers" else run_child(["--check", name, *quick],
                                                                        LIMIT_S.get(name, 600))
        result["seconds"] = round(time.monotonic() - start, 1)
        report["checks"][name] = result
        report.setdefault("device_type", result.get("device_type"))
        mark = "skip" if result.get("skipped") else "ok" if result["ok"] else "FAIL"
        print(f"[{mark}] {name}: {result.get('summary') or result.get('error')}", flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if "scaling" in report["checks"] and report["checks"]["scaling"].get("rows"):
        print_scaling(report["checks"]["scaling"]["rows"])
    failed = [n for n, c in report["checks"].items() if not c["ok"]]
    where = "GPUs" if report.get("device_type") == "GPU" else \
        "logical CPU devices, with the GPU run's own strategy and NCCL collectives (run there as RING)"
    skipped = [n for n, c in report["checks"].items() if c.get("skipped")]
    print(f"\n{len(names) - len(failed) - len(skipped)} of {len(names)} checks passed on {where}"
          f"{f' ({len(skipped)} skipped: ' + ', '.join(skipped) + ')' if skipped else ''}"
          f"{': FAILED ' + ', '.join(failed) if failed else ''}; JSON: {args.out}")
    return 1 if failed else 0


def run_child(extra, limit, env=None):
    """One check in a fresh process -> its result, or why there is none (a crash, or no answer in time)."""
    cmd = [sys.executable, "-m", "bert_mgpu.cli.gpu_check", *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no answer within {limit} s: hung"}
    for line in proc.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    tail = (proc.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
    return {"ok": False, "error": f"exit {proc.returncode} without a result: {tail}"}


class Setup:
    """A child's devices: every GPU TensorFlow sees, or, without GPUs, logical CPU devices standing in for
    `cpu_gpus` GPUs with the GPU plan's objects built on them."""

    def __init__(self, towers_per_gpu=1, cpu_gpus=2, per_tower=16):
        import tensorflow as tf

        from bert_mgpu.parallel import devices

        devices.keep_cpu_memory_statistics()  # before TensorFlow's first op, as Towers does (auto_batch_size)
        self.gpu, self.per_tower = bool(tf.config.list_physical_devices("GPU")), per_tower
        if self.gpu:
            visible = devices.discover_visible_gpus()
            self.plan = devices.plan_devices(len(visible), towers_per_gpu, visible)
            self.gpus = devices.gpu_memory(self.plan)
            devices.configure_devices(self.plan, gpus=self.gpus)
            self.devices = None
        else:
            gpus = cpu_gpus if towers_per_gpu == 1 else 1
            self.plan = devices.plan_devices(gpus, towers_per_gpu, tuple(str(i) for i in range(gpus)))
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * self.plan.towers)
            self.devices, self.gpus = [f"/cpu:{i}" for i in range(self.plan.towers)], []

    def strategy(self, plan=None, timeout_seconds=None):
        """The checks' strategy, with no collective timeout (it holds a thread per collective,
        benchmarks/NOTES.md item 67): each check runs under its process's time limit. failing_tower sets one."""
        from bert_mgpu.parallel import distribute

        return distribute.make_strategy(plan or self.plan, devices=None if self.gpu else
                                        self.devices[:(plan or self.plan).towers], timeout_seconds=timeout_seconds)


def child(args):
    from bert_mgpu.cli import checks_gpu

    name = args.check
    setup_args = {"two_towers_per_gpu": {"towers_per_gpu": 2}, "worker": {"cpu_gpus": 1}}.get(name, {})
    try:
        if name == "worker":
            result = checks_gpu.worker(args.task_index, args.worker_hosts)
        else:
            setup = Setup(**setup_args)
            setup.quick = args.quick
            result = checks_gpu.step(setup, name[5:]) if name.startswith("step_") else getattr(checks_gpu, name)(setup)
            result["device_type"] = "GPU" if setup.gpu else "CPU"
    except Exception as e:  # noqa: BLE001  (a check that raises has failed; say how, in one line)
        result = {"ok": False, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"}
    print(PREFIX + json.dumps(result, default=lambda o: o.item() if isinstance(o, np.generic) else str(o)),
          flush=True)
    return 0


def worker_gpus(environ, smi_gpus):
    """(each worker's CUDA_VISIBLE_DEVICES, None), the GPUs this process may use in two disjoint halves: those
    CUDA_VISIBLE_DEVICES lists, else (a fresh machine sets none) every GPU nvidia-smi lists. (None, None)
    without GPUs: one CPU tower each. (None, why) with one GPU, where two workers would give NCCL two ranks on
    one device (a false failure, or a hang to the time limit)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    visible = [g.strip() for g in listed.split(",") if g.strip()] if listed is not None else \
        [str(gpu[0]) for gpu in smi_gpus]
    if not visible:
        return None, None
    if len(visible) < 2:
        return None, f"two workers need a GPU each, and this process may use one ({', '.join(visible)})"
    half = len(visible) // 2
    return [",".join(visible[:half]), ",".join(visible[half:2 * half])], None


def two_workers():
    """Two worker processes on this machine (loopback ports), each on its own half of the GPUs
    (`worker_gpus`; one CPU tower each without GPUs): they must train, evaluate and end with the same weights."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    hosts = ",".join(f"localhost:{p}" for p in ports)
    from bert_mgpu.parallel import devices

    halves, why = worker_gpus(os.environ, devices.nvidia_smi_gpus())
    if why:
        return {"ok": True, "skipped": True, "summary": f"skipped: {why}"}
    procs = []
    for i in range(2):
        env = dict(os.environ)
        if halves:
            env["CUDA_VISIBLE_DEVICES"] = halves[i]
        cmd = [sys.executable, "-m", "bert_mgpu.cli.gpu_check", "--check", "worker", f"--task_index={i}",
               f"--worker_hosts={hosts}"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=LIMIT_S["two_workers"])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return {"ok": False, "error": f"no answer within {LIMIT_S['two_workers']} s: hung"}
        line = next((x for x in out.splitlines() if x.startswith(PREFIX)), None)
        results.append(json.loads(line[len(PREFIX):]) if line else
                       {"ok": False, "error": (err.strip().splitlines() or ["?"])[-1]})
    same = all(r.get("checksum") == results[0].get("checksum") for r in results)
    ok = all(r["ok"] for r in results) and same
    summary = (f"2 workers, {results[0].get('policy')}: losses {results[0].get('losses')}, evaluation loss "
               f"{results[0].get('eval_loss')}; weights {'equal' if same else 'DIFFER'} on both")
    return {"ok": ok, "workers": results, "summary": summary if all(r["ok"] for r in results) else None,
            "error": None if ok else "; ".join(r.get("error") or "weights differ" for r in results),
            "device_type": results[0].get("device_type")}


def print_scaling(rows):
    print("\n| shape | towers | ex/s | speed-up | efficiency |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['towers']} | {r['examples_per_s']:.1f} | {r['speedup']:.2f}x | "
              f"{100 * r['efficiency']:.0f}% |")
    print("docs/gpu_scaling.md's model for BERT-base, batch 32 per GPU, 2..8 GPUs: NVLink 88-95% (serial to "
          "overlapped all-reduce), PCIe 4.0 39-76%, PCIe 3.0 45-80%")


if __name__ == "__main__":
    sys.exit(main())
