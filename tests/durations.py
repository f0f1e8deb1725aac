"""The suite's time from pytest's JUnit XML files: each tier's and each file's total, and the slowest tests.

    python tests/durations.py output/ci/all.xml [more.xml ...] [--slowest 25]

What .ci/run prints after the suite, so that a regression in the suite's time can be traced to the test that
caused it (the XML files stay in output/ci/ with every test's time). Each test's tier is the `tier` property
tests/conftest.py records (make test's `test`, `learning`, `process`).
"""

import argparse
import collections
import xml.etree.ElementTree as ET


def cases(path):
    """[(test id, seconds, outcome, tier)] of one JUnit XML file (tier None in files written without it)."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        tier = next((p.get("value") for p in case.iter("property") if p.get("name") == "tier"), None)
        found.append((f"{case.get('classname')}::{case.get('name')}", float(case.get("time") or 0), outcome, tier))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="+", help="pytest --junitxml files")
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args()
    every = []
    for path in args.xml:
        found = cases(path)
        every += found
        print(f"{path}: {len(found)} tests, {sum(c[1] for c in found):.0f} s of test time")
    per_tier, count = collections.Counter(), collections.Counter()
    for _, seconds, _, tier in every:
        per_tier[tier] += seconds
        count[tier] += 1
    if None not in per_tier:
        names = {"test": "make test's", "learning": "the learning tier's", "process": "the process tier's"}
        print("test time per tier: " + ", ".join(f"{names.get(t, t)} {count[t]} tests {per_tier[t]:.0f} s"
                                                 for t in ("test", "learning", "process") if t in per_tier))
    per_file = collections.Counter()
    for name, seconds, _, _ in every:
        per_file[name.split("::")[0]] += seconds
    print("test time per file (s): " + ", ".join(f"{f.rsplit('.', 1)[-1]} {s:.0f}"
                                                 for f, s in per_file.most_common(12)))
    print(f"the {args.slowest} slowest tests:")
    for name, seconds, outcome, _ in sorted(every, key=lambda c: -c[1])[:args.slowest]:
        print(f"  {seconds:7.1f} s  {name}" + ("" if outcome == "passed" else f"  ({outcome})"))


if __name__ == "__main__":
    main()
