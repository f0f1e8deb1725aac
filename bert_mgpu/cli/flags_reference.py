"""docs/flags.md: every script's flags, written from the flags' own definitions (their --helpshort), so the
reference never drifts from the help (`tests/test_readmes.py` checks that the file is current).

    python -m bert_mgpu.cli.flags_reference > docs/flags.md
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def scripts(root=ROOT):
    """Every script a user runs, found as setup.py finds its entry points (no list to keep): a top-level .py
    file with a `_console()`; the fine-tuning scripts first, each as it sorts."""
    found = [f for f in os.listdir(root) if f.endswith(".py") and f != "setup.py"
             and "\ndef _console(" in open(os.path.join(root, f), encoding="utf-8").read()]
    return sorted(found, key=lambda f: (not f.startswith("run_"), f))


def adopted(script, root=ROOT):
    """The scripts whose flags `script` takes as its own (`import run_classifier_mgpu as classifier`)."""
    return tuple(re.findall(r"^import (\w+) as \w+$", open(os.path.join(root, script), encoding="utf-8").read(),
                            re.M))


SCRIPTS = tuple(scripts())


def flags_of(script):
    """[(flag, default, help)] of a script: its own and bert_mgpu's, as its --helpfull lists them (absl's
    and TensorFlow's left out)."""
    env = {**os.environ, "COLUMNS": "100000"}  # one line a flag: the same text whatever the terminal
    text = subprocess.run([sys.executable, script, "--helpfull"], capture_output=True, text=True, cwd=ROOT,
                          env=env).stdout  # absl exits 1 after the help
    out, current, ours, seen = [], None, False, set()
    own = (script, *adopted(script))
    for line in text.splitlines():
        module = re.match(r"^([A-Za-z_][\w.]*(?:\.py)?):$", line)
        if module:
            ours = module.group(1) in own or module.group(1).startswith("bert_mgpu")
            current = None
            continue
        m = re.match(r"^  --(?:\[no\])?([a-z0-9_]+): ?(.*)$", line)
        if m and ours and m.group(1) not in seen:
            seen.add(m.group(1))
            current = [m.group(1), "", m.group(2)]
            out.append(current)
        elif m:
            current = None
        elif line.startswith("    ") and current is not None:
            current[2] += " " + line.strip()
    rows = []
    for name, _, words in out:
        # absl quotes a default ('128'); a help text's own "(default: ...)" is left in the help
        default = re.search(r"\(default: '(.*?)'\)\s*(?:\(an? [a-z ]+\)|\(a comma separated list\))?\s*$", words)
        kind = re.search(r"\((an? [a-z ]+|a comma separated list)\)\s*$", words)
        help_text = words[:default.start()] if default else words[:kind.start()] if kind else words
        rows.append((name, default.group(1) if default else "", help_text.strip()))
    return rows


def reference():
    parts = ["# Flags of every script", "", "[README](../README.md) · [all pages](README.md)", "",
             "Written by `python -m bert_mgpu.cli.flags_reference > docs/flags.md` from the flags' own help; "
             "`python SCRIPT --helpfull` lists absl's own flags too.", ""]
    for script in SCRIPTS:
        parts.append(f"- [{script}](#{script.replace('.', '')})")
    parts.append("")
    for script in SCRIPTS:
        parts += [f"## {script}", "", "| flag | default | what it does |", "|---|---|---|"]
        for name, default, text in sorted(flags_of(script)):
            cell = text.replace("|", "\\|")
            parts.append(f"| `--{name}` | {f'`{default}`' if default else ''} | {cell} |")
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.stdout.write(reference())
