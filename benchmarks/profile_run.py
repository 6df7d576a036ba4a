"""Where a run's CPU time went: every CPU second of the run, as /usr/bin/time counts it, split into the jobs' own
work, their start-up, Snakemake's own process, and what is left, named (src/behaviortrace/tools/cpu_profile.py).

    python benchmarks/profile_run.py --launch [--cores N] [--configfile F] [--markdown out.md]   # run, then split
    python benchmarks/profile_run.py [--run default] [--markdown out.md]                        # a finished run

`--launch` runs `snakemake --cores N` (with `--configfile F`) in this checkout under the wrapper that counts every CPU
second, and writes the count to results/{run}/cpu_profile.json, which a later call without `--launch` reads. Run it
on a fresh or cleaned run folder: a resumed run counts only the jobs that ran. Without a record, the total is unknown
and the split covers the jobs alone (their start-up and work, from each job's own count in its log).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import polars as pl

from behaviortrace.report.cost import read_benchmarks
from behaviortrace.tools.cpu_profile import RECORD, launch, per_rule, run_name, split

ROOT = Path(__file__).resolve().parents[1]


def to_markdown(rules: pl.DataFrame, record: dict | None) -> str:
    lines = []
    parts = split(rules, record)
    total = record["total_cpu_s"] if record else sum(v for _, v in parts)
    if record:
        lines.append(
            f"Wall {record['wall_s']:.0f} s on {record['cores']} cores; CPU {total:.0f} s in all "
            f"(the whole process tree, as /usr/bin/time counts it).\n"
        )
    lines += ["| part | CPU s | share |", "|---|---|---|"]
    lines += [f"| {name} | {value:.0f} | {value / total:.1%} |" for name, value in parts]
    lines.append(f"| all | {total:.0f} | 100% |")
    unlogged = int((rules["jobs"] - rules["logged"]).sum())
    lines += [
        "",
        f"Per rule ({int(rules['jobs'].sum())} jobs, {unlogged} without their own CPU count: Snakemake's sample "
        "instead):",
        "",
        "| rule | jobs | wall s | start-up CPU s | work CPU s | CPU s | share | start-up CPU s per job |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rules.iter_rows(named=True):
        lines.append(
            f"| {r['rule']} | {r['jobs']} | {r['wall']:.0f} | {r['startup']:.0f} | {r['work']:.0f} | {r['cpu']:.0f} "
            f"| {r['cpu'] / total:.1%} | {r['startup'] / r['jobs']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", help="the run's name (default: the config's `run`)")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--launch", action="store_true", help="run the workflow first, counting every CPU second")
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--configfile", type=Path, help="a config merged over config/config.yaml, as a user passes one")
    ap.add_argument("--markdown", help="also write the tables here")
    args = ap.parse_args()
    folder = args.results / (args.run or run_name(args.configfile))
    record = launch(args.cores, args.configfile, folder / RECORD) if args.launch else None
    if record is None and (folder / RECORD).exists():
        record = json.loads((folder / RECORD).read_text())
    text = to_markdown(per_rule(read_benchmarks(folder / "benchmarks")), record)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
