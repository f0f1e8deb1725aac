"""`make bench`: bert_mgpu vs keras-hub vs Hugging Face transformers, same machine, shapes, data, batch.

Runs every (case, system) in its own process, one after another, `--rounds` times over (round by round),
then prints one table of each one's best run and writes every run to JSON. Best of rounds, because runs
of the same code differed by up to 4x here: TensorFlow can stall for seconds when an input iterator is
dropped (benchmarks/NOTES.md, item 11), in anchors' `fit`/`predict` as in ours. Ratios are
bert_mgpu / anchor from this run. Every system computes in the same precision, chosen for the machine
(`common.precision()`: bf16 only on CPUs with bf16 hardware), and the table says which.

Case (q), a question answerer at run_squad's length, and cases (t) and (et), a token classifier on make
ner-demo's sentences, have no keras-hub row: keras-hub has no span head and no token classifier.

Usage: python benchmarks/bench.py [--cases a,b,c,d,ea,eb,q,t,et] [--rounds 2] [--out benchmarks/results.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

SYSTEMS = {
    "bert_mgpu": ["bench_bert_mgpu.py"],
    "keras_hub": ["bench_keras_hub.py"],
    "transformers": ["bench_transformers.py"],
}
ANCHORS = ("keras_hub", "transformers")


def matmul_peak():
    """The machine's TF matmul peak now (2048^3, best of 10), bf16 and fp32, in FLOP/s."""
    code = ("import time, tensorflow as tf\n"
            "for dt in (tf.bfloat16, tf.float32):\n"
            "    a = tf.cast(tf.random.normal([2048, 2048]), dt); f = tf.function(lambda a: tf.matmul(a, a))\n"
            "    f(a).numpy(); best = 1e9\n"
            "    for _ in range(10):\n"
            "        t = time.perf_counter(); f(a).numpy(); best = min(best, time.perf_counter() - t)\n"
            "    print('PEAK', dt.name, 2 * 2048 ** 3 / best)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {line.split()[1]: float(line.split()[2]) for line in out.splitlines() if line.startswith("PEAK")}


def run(script_args, case, timeout=1800):
    cmd = [sys.executable, os.path.join(HERE, script_args[0]), case, *script_args[1:]]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", BENCH_PRECISION=common.precision())
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"exit {p.returncode}: {tail[0][:300]}"}


def best_of(runs):
    """Per (case, system): its fastest run, with every run's ex/s under "runs"; an error if all failed."""
    groups = {}
    for r in runs:
        groups.setdefault((r["case"], r["system"]), []).append(r)
    best = []
    for group in groups.values():
        ok = [r for r in group if "error" not in r]
        best.append(dict(max(ok, key=lambda r: r["examples_per_s"]), runs=[r["examples_per_s"] for r in ok])
                    if ok else group[0])
    return best


def table(results, peak):
    lines = ["| case | system | ex/s | runs (ex/s) | tokens/s | peak RSS MB | model TFLOP/s | % bf16 peak |"
             " % fp32 peak | bert_mgpu / this |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for case in common.CASES:
        rows = [r for r in results if r.get("case") == case]
        ours = next((r for r in rows if r.get("system") == "bert_mgpu" and "error" not in r), None)
        for r in rows:
            if "error" in r:
                lines.append(f"| {case} | {r['system']} | error: {r['error']} ||||||||")
                continue
            ratio = f"{ours['examples_per_s'] / r['examples_per_s']:.2f}x" if ours else "-"
            lines.append(
                f"| {case} | {r['system']} | {r['examples_per_s']:.1f} | "
                f"{', '.join(f'{x:.1f}' for x in r.get('runs', []))} | {r['tokens_per_s']:.0f} | "
                f"{r['peak_rss_mb']:.0f} | {r['model_flops_per_s'] / 1e12:.3f} | "
                f"{100 * r['model_flops_per_s'] / peak['bfloat16']:.0f}% | "
                f"{100 * r['model_flops_per_s'] / peak['float32']:.0f}% | {ratio} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(common.CASES))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = ap.parse_args()
    cases = args.cases.split(",")
    started = time.time()
    peak = matmul_peak()
    print(f"matmul peak: bf16 {peak['bfloat16'] / 1e12:.2f} TFLOP/s, fp32 {peak['float32'] / 1e12:.2f}; "
          f"every system in {common.precision()}", flush=True)
    jobs = [(c, s, SYSTEMS[s]) for c in cases for s in args.systems.split(",")
            if not (s == "keras_hub" and (common.CASES[c]["mode"] == "span" or common.CASES[c].get("head") == "tag"))
            and not (c == "l" and s != "bert_mgpu")]  # (l) compares bert_mgpu with and without --recompute
    if "l" in cases:
        jobs.append(("l", "bert_mgpu_recompute", ["bench_bert_mgpu.py", "1", "--recompute"]))
    for c in ("b", "t"):  # real lengths: the default batches in shuffled order; --length_buckets, what it gives up
        if c in cases:
            jobs.append((c, "bert_mgpu_buckets", ["bench_bert_mgpu.py", "1", "--length_buckets"]))
    if "a" in cases:  # the cost of replication (2 towers on the same 2 cores), and of keras-hub's own layers
        jobs.append(("a", "bert_mgpu_2towers", ["bench_bert_mgpu.py", "2"]))
        jobs.append(("a", "bert_mgpu_unfused", ["bench_bert_mgpu.py", "1", "--no-fused"]))
    runs = []
    for round_ in range(1, args.rounds + 1):
        for case, name, script in jobs:
            r = run(script, case)
            r.setdefault("system", name)
            r.update(case=case, round=round_)
            runs.append(r)
            shown = r.get("error") or f"{r['examples_per_s']:.1f} ex/s"
            print(f"  round {round_}  {case:3s} {name:20s} {shown}", flush=True)
    results = best_of(runs)
    report = f"every system in {common.precision()} on this CPU\n\n" + table(results, peak)
    one = next((r for r in results if r.get("system") == "bert_mgpu" and r.get("case") == "a"), {})
    two = next((r for r in results if r.get("system") == "bert_mgpu_2towers"), {})
    for c in ("b", "t"):
        plain = next((r for r in results if r.get("system") == "bert_mgpu" and r.get("case") == c), {})
        bucketed = next((r for r in results if r.get("system") == "bert_mgpu_buckets" and r.get("case") == c), {})
        if "examples_per_s" in plain and "examples_per_s" in bucketed:
            report += (f"\n\nshuffled batches (the default) / --length_buckets, case ({c}): "
                       f"{plain['examples_per_s'] / bucketed['examples_per_s']:.2f}")
    if "examples_per_s" in one and "examples_per_s" in two:
        report += (f"\n\n2 towers / 1 tower on the same cores, case (a): "
                   f"{two['examples_per_s'] / one['examples_per_s']:.2f}")
    print("\n" + report)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "precision": common.precision(),
            "matmul_peak_flops": peak, "minutes": (time.time() - started) / 60, "rounds": args.rounds,
            "cases": {k: v["title"] for k, v in common.CASES.items()}}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results, "runs": runs}, f, indent=1)
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
