"""The default run at two commits on this machine, one after the other: wall time, every CPU second (as
benchmarks/profile_run.py splits it), and whether their results agree.

    python benchmarks/default_run.py [--baseline HEAD~1] [--candidate HEAD] [--cores 2] [--configfile F] [--keep DIR]
    python benchmarks/default_run.py --results BASELINE CANDIDATE     # two finished runs' results/<run> folders

Each commit is cloned fresh from this repository into a scratch folder and runs `snakemake --cores N` on its own
config/config.yaml (with `--configfile F` merged over it, as a user passes one: for example the tests' small
workflow) with this checkout's .venv (the commit's own package first on the path), as `make run` does after its
install, under profile_run.py's launcher: its wall time, the CPU time of the whole process tree and of Snakemake's
own process. Prints each run's CPU split, the ratios, and every result that differs.

The comparison reads every Parquet file of the two results folders (benchmark files and the evaluation's metric
caches, whose names carry code digests, left out; the influence table's cost_ratio rows are timings) and
checklist.json. A file that differs is described: rows only in one run, or, where the rows match, the largest
relative difference of a float column (rounding), or which columns differ otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.report.cost import read_benchmarks
from behaviortrace.tools.cpu_profile import launch, per_rule, run_name, split

ROOT = Path(__file__).resolve().parents[1]

# Rows that hold a measured time, not a result: the influence job's cost over its forward sweep.
TIMINGS = {"influence.parquet": pl.col("metric").str.starts_with("cost_ratio")}
SKIPPED = ("benchmarks", "cache")


def clean_run(ref: str, folder: Path, cores: int, configfile: Path | None, run: str) -> dict:
    """A run of `ref` in a fresh clone at `folder` (its default config, `configfile` over it): profile_run's record."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "--quiet", ref], check=True)
    os.environ["PYTHONPATH"] = str(folder / "src")  # the commit's own package, in every job Snakemake starts
    try:
        return launch(cores, configfile, folder / "results" / run / "cpu_profile.json", cwd=folder)
    finally:
        del os.environ["PYTHONPATH"]


def read_table(path: Path) -> pl.DataFrame:
    """A results table without its timing rows (TIMINGS)."""
    table = pl.read_parquet(path)
    return table.filter(~TIMINGS[path.name]) if path.name in TIMINGS else table


def describe(a: pl.DataFrame, b: pl.DataFrame) -> str | None:
    """None where the tables are equal; else how they differ."""
    if a.equals(b, null_equal=True):
        return None
    if a.columns != b.columns:
        return f"columns differ: {sorted(set(a.columns) ^ set(b.columns))}"
    if a.height != b.height:
        keys = [c for c, t in a.schema.items() if not t.is_float() and not isinstance(t, (pl.List, pl.Array))]
        only_a = a.select(keys).unique().join(b.select(keys).unique(), on=keys, how="anti", nulls_equal=True)
        only_b = b.select(keys).unique().join(a.select(keys).unique(), on=keys, how="anti", nulls_equal=True)
        return f"{a.height} rows against {b.height}: {only_a.height} keys only in the first, {only_b.height} in the 2nd"
    floats = [c for c, t in a.schema.items() if t.is_float()]
    others = [c for c in a.columns if c not in floats]
    unequal = [c for c in others if not a[c].equals(b[c], null_equal=True)]
    if unequal:
        return f"values differ in {unequal}"
    worst = 0.0
    for c in floats:
        x, y = a[c].to_numpy().astype(float), b[c].to_numpy().astype(float)
        both = ~(np.isnan(x) & np.isnan(y))
        scale = np.maximum(np.maximum(np.abs(x), np.abs(y)), 1e-300)
        worst = max(worst, float(np.nanmax(np.abs(x - y)[both] / scale[both], initial=0.0)))
    return f"rounding: largest relative difference {worst:.1e}"


def results_differences(a: Path, b: Path) -> tuple[int, list[str]]:
    """How many Parquet files of run `a` equal run `b`'s, and a line for each that does not (and checklist.json)."""
    same, out = 0, []
    for path in sorted(p for p in a.rglob("*.parquet") if not set(SKIPPED) & set(p.relative_to(a).parts)):
        rel = path.relative_to(a).as_posix()
        if not (b / rel).exists():
            out.append(f"{rel}: only in the first")
            continue
        found = describe(read_table(path), read_table(b / rel))
        if found is None:
            same += 1
        else:
            out.append(f"{rel}: {found}")
    out += [
        f"{p.relative_to(b).as_posix()}: only in the second"
        for p in b.rglob("*.parquet")
        if not set(SKIPPED) & set(p.relative_to(b).parts) and not (a / p.relative_to(b)).exists()
    ]
    if json.loads((a / "checklist.json").read_text()) != json.loads((b / "checklist.json").read_text()):
        out.append("checklist.json")
    return same, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="HEAD~1")
    ap.add_argument("--candidate", default="HEAD")
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--configfile", type=Path, help="a config merged over config/config.yaml (default: none)")
    ap.add_argument("--keep", type=Path, help="keep both clones under this folder (default: removed)")
    ap.add_argument("--results", nargs=2, type=Path, help="compare two finished runs' results/<run> folders instead")
    args = ap.parse_args()
    if args.results:
        same, diff = results_differences(*args.results)
        print(f"{same} Parquet files equal" + ("; identical" if not diff else "; differ:\n  " + "\n  ".join(diff)))
        return
    run = run_name(args.configfile)
    scratch = Path(tempfile.mkdtemp(dir=args.keep))
    try:
        records, runs = {}, {}
        for role, ref in (("baseline", args.baseline), ("candidate", args.candidate)):
            folder = scratch / role
            records[role] = clean_run(ref, folder, args.cores, args.configfile, run)
            runs[role] = folder / "results" / run
            rules = per_rule(read_benchmarks(runs[role] / "benchmarks"))
            parts = ", ".join(f"{name} {value:.0f}" for name, value in split(rules, records[role]))
            r = records[role]
            print(f"{role} {ref}: {r['wall_s'] / 60:.1f} min wall, {r['total_cpu_s']:.0f} CPU s ({parts})")
        base, cand = records["baseline"], records["candidate"]
        print(
            f"baseline / candidate: wall {base['wall_s'] / cand['wall_s']:.2f}, "
            f"CPU {base['total_cpu_s'] / cand['total_cpu_s']:.2f}"
        )
        same, diff = results_differences(runs["baseline"], runs["candidate"])
        print(f"{same} Parquet files equal" + ("; identical" if not diff else "; differ:\n  " + "\n  ".join(diff)))
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
