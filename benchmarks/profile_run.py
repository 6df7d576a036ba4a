"""Where a run's CPU time went: every CPU second of the run, as /usr/bin/time counts it, split into the jobs' own
work, their start-up, Snakemake's own process, and what is left, named.

    python benchmarks/profile_run.py --launch [--cores N] [--configfile F] [--markdown out.md]   # run, then split
    python benchmarks/profile_run.py [--run default] [--markdown out.md]                        # a finished run

`--launch` runs `snakemake --cores N` (with `--configfile F`) in this checkout through a wrapper that records
Snakemake's own process's CPU time at its exit, and counts the CPU time of the whole process tree as the kernel
reports it for ended children (what /usr/bin/time prints); it writes both to results/{run}/cpu_profile.json. Run it on
a fresh or cleaned run folder: a resumed run counts only the jobs that ran.

Every job's log holds its own count (common/io.py): the CPU seconds of its process and children at exit, and those
spent before its first line (start-up: interpreter, Snakemake's script preamble, imports). So

    total = Snakemake's process + jobs' start-up + jobs' work + launchers

where "launchers" is every process of the tree outside Snakemake and the jobs' own Python: the shell Snakemake starts
each job's script in, and a job killed before it logged its end. Without `--launch`, the total is unknown and the
split covers the jobs alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import yaml

from behaviortrace.report.cost import read_benchmarks

ROOT = Path(__file__).resolve().parents[1]
RECORD = "cpu_profile.json"

# Runs Snakemake's command line in this process and writes this process's own CPU time (not its children's) when it
# exits, however it exits (Snakemake ends with sys.exit).
WRAPPER = """
import atexit, json, resource, sys
def record(path):
    own = resource.getrusage(resource.RUSAGE_SELF)
    with open(path, "w") as f:
        json.dump({"snakemake_cpu_s": own.ru_utime + own.ru_stime}, f)
atexit.register(record, sys.argv[1])
sys.argv = ["snakemake", *sys.argv[2:]]
from snakemake.cli import main
main()
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(cores: int, configfile: Path | None, out: Path) -> dict:
    """Run the workflow once under the wrapper; the record: wall seconds, the tree's CPU seconds, Snakemake's own."""
    more = ["--configfile", str(configfile.resolve())] if configfile else []
    own = out.with_suffix(".snakemake.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    before, started = children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(own), "--cores", str(cores), *more], cwd=ROOT)
    record = {"wall_s": time.perf_counter() - started, "total_cpu_s": children_cpu() - before}
    if done.returncode:
        sys.exit(f"the run failed (exit {done.returncode}); nothing recorded")
    record.update(json.loads(own.read_text()), cores=cores, configfile=str(configfile) if configfile else None)
    own.unlink()
    out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def per_rule(jobs: pl.DataFrame) -> pl.DataFrame:
    """Per rule: jobs, wall seconds, start-up and work CPU seconds (summed over jobs), largest CPU first."""
    startup = pl.col("startup_cpu_s").fill_null(0.0)
    return (
        jobs.with_columns(startup=startup, work=(pl.col("cpu_s").fill_null(0.0) - startup).clip(lower_bound=0.0))
        .group_by("rule")
        .agg(
            pl.len().alias("jobs"),
            (pl.col("cpu_source") == "log").sum().alias("logged"),
            pl.col("wall_s").sum().alias("wall"),
            pl.col("startup").sum(),
            pl.col("work").sum(),
        )
        .with_columns(cpu=pl.col("startup") + pl.col("work"))
        .sort("cpu", descending=True)
    )


def split(rules: pl.DataFrame, record: dict | None) -> list[tuple[str, float]]:
    """The run's CPU seconds by part; with a launch record, the parts add up to its total."""
    parts = [("jobs' work", float(rules["work"].sum())), ("jobs' start-up", float(rules["startup"].sum()))]
    if record:
        parts.append(("Snakemake's process", record["snakemake_cpu_s"]))
        rest = record["total_cpu_s"] - sum(v for _, v in parts)
        parts.append(("launchers: the shell of each job, jobs that did not log their end", rest))
    return parts


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
    run = (
        args.run or (yaml.safe_load(args.configfile.read_text()) or {}).get("run", "default")
        if args.configfile
        else (args.run or "default")
    )
    folder = args.results / run
    record = launch(args.cores, args.configfile, folder / RECORD) if args.launch else None
    if record is None and (folder / RECORD).exists():
        record = json.loads((folder / RECORD).read_text())
    text = to_markdown(per_rule(read_benchmarks(folder / "benchmarks")), record)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
