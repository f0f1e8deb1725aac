"""`--seeds=1,2,3` and `--grid 'learning_rate=2e-5,3e-5 train_batch_size=16,32'`: the same command once per
configuration and seed, one run after another on all the towers, each in a process and a run directory of
its own (OUTPUT_DIR/<configuration>/seed_<n>), then OUTPUT_DIR/sweep_results.md and .tsv: per configuration
the mean, standard deviation, median and maximum of each dev measure over the seeds, and the best
configuration (the BERT paper's pick on dev; HFL's mean and maximum of 10 seeds).

Rerunning the command keeps the runs that finished (their `sweep_run.json`) and resumes the others from their
checkpoints, so a sweep killed anywhere ends with the table an uninterrupted one writes.

Example:
    python run_classifier_mgpu.py ... --do_train --do_eval --output_dir=out --seeds=1,2,3 \
        --grid='learning_rate=2e-5,3e-5,5e-5 num_train_epochs=2,3,4'
"""

import itertools
import json
import logging
import os
import re
import statistics
import sys

from absl import flags

from bert_mgpu.core import storage, supervise
from bert_mgpu.core.errors import Interrupted, UserError

RESULT_FILE = "sweep_run.json"
OWN_FLAGS = ("seeds", "grid", "sweep_member")
log = logging.getLogger("bert_mgpu")


def define_sweep_flags():
    flags.DEFINE_list("seeds", None, "Run once per seed (e.g. 1,2,3), each in OUTPUT_DIR/.../seed_<n>, then "
                      "sweep_results.md/.tsv with the mean, sd, median and maximum of the dev results.")
    flags.DEFINE_string("grid", None, "Run every combination of these flag values, e.g. 'learning_rate=2e-5,3e-5 "
                        "train_batch_size=16,32 num_train_epochs=2,3,4' (with --seeds: each with every seed); "
                        "rerun the command to finish a sweep.")
    flags.DEFINE_bool("sweep_member", False, "(Set by a sweep for each of its runs.)")


def requested(f):
    return bool(f.seeds or f.grid)


def parse_seeds(values):
    seeds = []
    for value in values or []:
        if not value.strip().isdigit():
            raise UserError(f"--seeds: {value!r} is not a seed (a whole number >= 0)")
        seeds.append(int(value))
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds: {','.join(values)} names a seed twice")
    return seeds


def parse_grid(text, flag_values):
    """'name=v1,v2 other=v3' -> [{name: v1, other: v3}, {name: v2, other: v3}] (values parsed as the flags
    parse them), in the order the BERT paper's tables list them; [{}] for no grid."""
    axes = []
    for part in (text or "").split():
        name, eq, values = part.partition("=")
        if not eq or not values:
            raise UserError(f"--grid: {part!r} is not name=value1,value2,...")
        if name not in flag_values or name in (*OWN_FLAGS, "output_dir", "seed"):
            raise UserError(f"--grid: {name!r} is not a flag this script varies"
                            + (" (use --seeds)" if name == "seed" else ""))
        if _canonical(name, flag_values) in (n for n, _ in axes):
            raise UserError(f"--grid: {name} is given twice")
        parsed = []
        for value in values.split(","):
            try:
                flag_values[name].parser.parse(value)
            except (ValueError, TypeError) as e:
                raise UserError(f"--grid: {name}={value}: {e}") from None
            parsed.append(value)
        axes.append((_canonical(name, flag_values), parsed))
    return [dict(zip([n for n, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def label(config):
    """A configuration's name and directory: 'learning_rate=2e-5,num_train_epochs=3', or 'default'."""
    return ",".join(f"{k}={v}" for k, v in config.items()) or "default"


def runs(output_dir, configs, seeds):
    """[(configuration, seed or None, run directory)] in the order they run: configurations, then seeds."""
    out = []
    for config in configs:
        base = os.path.join(output_dir, label(config)) if config else output_dir
        for seed in seeds or [None]:
            out.append((config, seed, os.path.join(base, f"seed_{seed}") if seed is not None else base))
    return out


def child_argv(config, seed, directory, flag_values):
    """The command's own flags (those given), with this run's directory, seed and configuration."""
    replaced = {*OWN_FLAGS, "output_dir", *config, *(["seed"] if seed is not None else [])}
    argv = [flag_values[name].serialize() for name in sorted(_given(flag_values)) if name not in replaced]
    argv += [f"--output_dir={directory}", "--sweep_member"]
    argv += [f"--seed={seed}"] if seed is not None else []
    return argv + [f"--{k}={v}" for k, v in config.items()]


def _canonical(name, flag_values):
    """The flag an alias stands for (absl's DEFINE_alias says it in the help: "Alias for --name."), else the
    name itself. test_sweep gives an alias: it fails if absl words it otherwise."""
    found = re.fullmatch(r"Alias for --(\w+)\.", flag_values[name].help or "")
    return found.group(1) if found and found.group(1) in flag_values else name


def _given(flag_values):
    """The flags given on the command line, each once (an alias under its flag's name)."""
    return {_canonical(name, flag_values) for name in flag_values
            if flag_values[name].present and name != "flagfile"}


def write_member(output_dir, measures, main):
    """A sweep's run, once it has its dev results: {measure: value} and the measures that rank runs."""
    storage.write_atomic(os.path.join(output_dir, RESULT_FILE),
                         json.dumps({"measures": measures, "main": list(main)}, indent=1, sort_keys=True) + "\n")


def read_member(directory):
    path = os.path.join(directory, RESULT_FILE)
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def run_sweep(f, script):
    """Run every configuration and seed of the flags' sweep not yet finished, then write the tables."""
    if f.sweep_member:
        raise UserError("--sweep_member is set by a sweep for its runs; with --seeds/--grid, leave it out")
    if not f.output_dir:
        raise UserError("--output_dir is required")
    if getattr(f, "worker_hosts", None):
        raise UserError("--seeds/--grid run on one machine's towers; with several workers, start each "
                        "configuration as a command of its own")
    if "do_eval" in f and not f.do_eval:
        raise UserError("--seeds/--grid compare dev results: add --do_eval")
    seeds, configs = parse_seeds(f.seeds), parse_grid(f.grid, f)
    planned = runs(f.output_dir, configs, seeds)
    for i, (config, seed, directory) in enumerate(planned, 1):
        what = f"run {i} of {len(planned)}: {label(config)}" + (f", seed {seed}" if seed is not None else "")
        if read_member(directory) is not None:
            log.info("%s: done before (%s)", what, directory)
            continue
        log.info("%s -> %s", what, directory)
        # The run hears the sweep's signals and dies with it: SIGTERM to the sweep stops the run as it stops
        # one (a checkpoint, Interrupted's exit code), and no run goes on without its sweep to hold its directory.
        code, stopped_by = supervise.call_forwarding([sys.executable, script, *child_argv(config, seed, directory, f)])
        stopped = Interrupted(f"sweep: {what} interrupted by {stopped_by}; its checkpoint is in {directory}: rerun "
                              "the same command to resume the sweep", stopped_by)
        if stopped_by is not None and code == stopped.exit_code and read_member(directory) is None:
            raise stopped
        if read_member(directory) is None:
            raise UserError(f"{what} {'stopped' if code == 0 else f'failed (exit status {code})'} in "
                            f"{directory}; rerun the same command to resume the sweep")
    rows = [(config, seed, read_member(directory)) for config, seed, directory in planned]
    md, tsv = tables(rows)
    storage.write_atomic(os.path.join(f.output_dir, "sweep_results.md"), md)
    storage.write_atomic(os.path.join(f.output_dir, "sweep_results.tsv"), tsv)
    print(md)
    print(f"sweep: {len(planned)} runs -> {f.output_dir}/sweep_results.md and sweep_results.tsv")


def _larger_is_better(measure):
    return "loss" not in measure


def tables(rows):
    """(markdown, tsv) of [(configuration, seed, member result)]: a row per configuration and measure."""
    measures, main, by_config = [], [], {}
    for config, seed, result in rows:
        for name in result["measures"]:
            if name not in measures:
                measures.append(name)
        main += [m for m in result["main"] if m not in main]
        by_config.setdefault(label(config), []).append((seed, result["measures"]))
    header = ["configuration", "measure", "runs", "mean", "sd", "median", "max", "values (by seed)"]
    lines, best = [], {}
    for name in measures:
        for config, members in by_config.items():
            values = [m[name] for _, m in members if isinstance(m.get(name), (int, float))]
            if not values:
                continue
            mean = statistics.fmean(values)
            sd = statistics.stdev(values) if len(values) > 1 else float("nan")
            lines.append([config, name, len(values), mean, sd, statistics.median(values), max(values),
                          " ".join(f"{v:.6g}" for v in values)])
            if name in main:
                better = (lambda a, b: a > b) if _larger_is_better(name) else (lambda a, b: a < b)
                if name not in best or better(mean, best[name][1]):
                    best[name] = (config, mean)
    number = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    md = ["| " + " | ".join(header[:-1]) + " |", "|" + "---|" * (len(header) - 1)]
    md += ["| " + " | ".join(number(v) for v in row[:-1]) + " |" for row in lines]
    md += [""] + [f"best configuration by mean {name}: {config} ({mean:.4f})" for name, (config, mean) in best.items()]
    tsv = ["\t".join(header)] + ["\t".join(repr(v) if isinstance(v, float) else str(v) for v in row) for row in lines]
    tsv += [f"# best by mean {name}\t{config}\t{mean!r}" for name, (config, mean) in best.items()]
    return "\n".join(md) + "\n", "\n".join(tsv) + "\n"
