"""The suite's time from pytest's JUnit XML files: each file's total, and the slowest tests of all of them.

    python tests/durations.py output/ci/test.xml output/ci/rest.xml [--slowest 25]

What .ci/run prints after the tiers, so that a regression in the suite's time can be traced to the test that
caused it (the XML files stay in output/ci/ with every test's time).
"""

import argparse
import collections
import xml.etree.ElementTree as ET


def cases(path):
    """[(test id, seconds, outcome)] of one JUnit XML file."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        found.append((f"{case.get('classname')}::{case.get('name')}", float(case.get("time") or 0), outcome))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="+", help="pytest --junitxml files, one a tier")
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args()
    every = []
    for path in args.xml:
        found = cases(path)
        every += found
        print(f"{path}: {len(found)} tests, {sum(s for _, s, _ in found):.0f} s of test time")
    per_file = collections.Counter()
    for name, seconds, _ in every:
        per_file[name.split("::")[0]] += seconds
    print("test time per file (s): " + ", ".join(f"{f.rsplit('.', 1)[-1]} {s:.0f}"
                                                 for f, s in per_file.most_common(12)))
    print(f"the {args.slowest} slowest tests:")
    for name, seconds, outcome in sorted(every, key=lambda c: -c[1])[:args.slowest]:
        print(f"  {seconds:7.1f} s  {name}" + ("" if outcome == "passed" else f"  ({outcome})"))


if __name__ == "__main__":
    main()
