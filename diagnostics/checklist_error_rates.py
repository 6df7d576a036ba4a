"""How often each kind of checklist rule errs, simulated at a run's own sizes (report/error_rates.py): false pass
under a null method, false FAIL under one that truly meets the bar, and power at a stated effect.

Sizes come from a finished run (its checklist.json and config.yaml: seeds, draws, subset sizes, bootstrap
resamples, random replay sets, the family of method cells); `--write` puts the table into docs/evaluation.md
between its error-rates markers.

    .venv/bin/python diagnostics/checklist_error_rates.py [--run results/default] [--trials 2000] [--write]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from behaviortrace.report.error_rates import Sizes, markdown, rates

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "evaluation.md"
BLOCK = re.compile(r"(<!-- error-rates:start -->\n).*?(<!-- error-rates:end -->)", re.S)


def run_sizes(run: Path) -> Sizes:
    """The sizes of a finished run, from its checklist and its record of the config it ran with."""
    for name in ("checklist.json", "config.yaml"):
        if not (run / name).exists():
            raise SystemExit(f"{run / name} not found: give --run a finished run's folder (results/<run>)")
    checklist = json.loads((run / "checklist.json").read_text())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    seeds, draws = len(cfg["seeds"]), cfg["targets"]["draws"]
    placebo = len(cfg["placebo"]["seeds"]) if cfg["placebo"]["enabled"] else 0
    return Sizes(
        threshold_cells=seeds * draws * len(cfg["influence"]["lds_percents"]),
        paired_cells=seeds * draws,
        placebo_cells=max(placebo * draws, 1),
        replay_cells=seeds * len(cfg["replay"]["removal_percent"]),
        family=max(int(checklist["family"]["method_tests"]), 1),
        boot=cfg["evaluation"]["bootstrap"],
        repeats=cfg["replay"]["random_repeats"],
        alpha=cfg["checklist"]["alpha"],
        dense_seeds=seeds,  # its groups and resamples stay the simulation's own (report/error_rates.py)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=ROOT / "results" / "default", help="a finished run's folder")
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write the table into docs/evaluation.md")
    args = ap.parse_args()
    sizes = run_sizes(args.run)
    table = markdown(sizes, rates(sizes, args.trials, args.seed), args.trials, args.seed)
    print(table)
    if args.write:
        DOC.write_text(BLOCK.sub(lambda m: m.group(1) + table + m.group(2), DOC.read_text()))


if __name__ == "__main__":
    main()
