"""Every CPU second of a workflow run: the run launched under a wrapper that records Snakemake's own process's CPU
time, the whole process tree's CPU time as the kernel counts it for ended children (what /usr/bin/time prints), and
each job's own count from its log (common/io.py). benchmarks/profile_run.py prints the split, benchmarks/default_run.py
compares two commits' splits.

    total = Snakemake's process + jobs' start-up + jobs' work + launchers

"launchers" is every process of the tree outside Snakemake and the jobs' own Python: the shell Snakemake starts each
job's script in, and a job killed before it logged its end (or one of a version that did not log it, whose CPU
Snakemake's benchmark file undercounts: it samples every 30 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import yaml

from behaviortrace.common.io import cpu_seconds
from behaviortrace.tools.checkout import checkout

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


def run_name(configfile: Path | None) -> str:
    """The `run` a config file merged over config/config.yaml names (the default's: "default")."""
    return (yaml.safe_load(Path(configfile).read_text()) or {}).get("run", "default") if configfile else "default"


def launch(cores: int, configfile: Path | None, out: Path, cwd: Path | None = None) -> dict:
    """Run `snakemake --cores N` (with `--configfile`) in `cwd` (this checkout by default) under the wrapper, and write
    its record to `out`: wall seconds, the tree's CPU seconds, Snakemake's own, the cores and config file."""
    more = ["--configfile", str(Path(configfile).resolve())] if configfile else []
    own = Path(out).with_suffix(".snakemake.json")
    own.parent.mkdir(parents=True, exist_ok=True)
    before, started = cpu_seconds()[1], time.perf_counter()
    argv = [sys.executable, "-c", WRAPPER, str(own.resolve()), "--cores", str(cores), *more]
    done = subprocess.run(argv, cwd=cwd or checkout())
    record = {"wall_s": time.perf_counter() - started, "total_cpu_s": cpu_seconds()[1] - before}
    if done.returncode:
        sys.exit(f"the run failed (exit {done.returncode}); nothing recorded")
    record.update(json.loads(own.read_text()), cores=cores, configfile=str(configfile) if configfile else None)
    own.unlink()
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    return record


def per_rule(jobs: pl.DataFrame) -> pl.DataFrame:
    """Per rule (from report/cost.py's read_benchmarks): jobs, those with their own CPU count, wall seconds, start-up
    and work CPU seconds, summed over jobs, largest CPU first."""
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
        parts.append(("launchers: each job's shell, jobs without their own CPU count", rest))
    return parts
