"""Whether the same evidence gives the same verdicts: two finished runs' checklists side by side.

Two runs of one config on one machine must write byte-identical checklists (and score files). Two training-noise
twins (the same config with other training seeds, or on another processor) must not flip any method verdict
between pass and FAIL: a flip means an interval left training noise out. Prints the comparison; exits 1 on a
pass <-> FAIL flip, or, with --identical, on any byte difference.

    .venv/bin/python diagnostics/verdict_flips.py results/default results/twin [--identical]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def compare(a: dict, b: dict) -> dict:
    """Every (row, item) verdict of both checklists' methods and references: how many agree, which flip between
    pass and FAIL, and the other changes (to or from inconclusive or n/a) by kind."""
    judged = [name for name, role in a["roles"].items() if role in ("method", "reference")]
    pairs = [
        (name, item, a["estimators"][name][item]["verdict"], b["estimators"][name][item]["verdict"])
        for name in judged
        if name in b["estimators"]
        for item in a["items"]
    ]
    flips = [(n, i, x, y) for n, i, x, y in pairs if {x, y} == {"pass", "fail"}]
    changed = Counter(f"{x} -> {y}" for _, _, x, y in pairs if x != y and {x, y} != {"pass", "fail"})
    return {
        "compared": len(pairs),
        "same": sum(x == y for _, _, x, y in pairs),
        "decided_in_both": sum({x, y} <= {"pass", "fail"} for _, _, x, y in pairs),
        "flips": flips,
        "other_changes": dict(changed),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="a finished run's folder (results/<run>)")
    ap.add_argument("b", type=Path, help="the other run's folder")
    ap.add_argument("--identical", action="store_true", help="the two runs share config and seeds: bytes must match")
    args = ap.parse_args()
    paths = [run / "checklist.json" for run in (args.a, args.b)]
    for path in paths:
        if not path.exists():
            raise SystemExit(f"{path} not found: give finished runs' folders (results/<run>)")
    raw = [path.read_bytes() for path in paths]
    found = compare(*(json.loads(r) for r in raw))
    identical = raw[0] == raw[1]
    print(f"checklist.json byte-identical: {'yes' if identical else 'no'}")
    print(f"verdicts compared: {found['compared']}, the same: {found['same']}, pass or FAIL in both: "
          f"{found['decided_in_both']}, pass <-> FAIL flips: {len(found['flips'])}")  # fmt: skip
    for name, item, x, y in found["flips"]:
        print(f"  flip: {name} {item}: {x} -> {y}")
    for kind, n in sorted(found["other_changes"].items()):
        print(f"  {kind}: {n}")
    sys.exit(1 if found["flips"] or (args.identical and not identical) else 0)


if __name__ == "__main__":
    main()
