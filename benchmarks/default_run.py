"""The default run's wall time at two commits on this machine, one after the other, and whether their tables agree.

    python benchmarks/default_run.py [--baseline HEAD~1] [--candidate HEAD] [--cores 2] [--configfile F] [--keep DIR]
    python benchmarks/default_run.py --results BASELINE CANDIDATE [--renamed]      # two finished runs' results/<run>

Each commit is cloned fresh from this repository into a scratch folder and runs `snakemake --cores N` on its own
config/config.yaml (with `--configfile F` merged over it, as a user passes one: for example the tests' small
workflow) with this checkout's .venv (the commit's own package first on the path), as `make run` does after its
install. Prints each run's wall time, the ratio, the start-up share of each (report/cost.py), and every table under
results/<run>/tables/ and checklist.json that differs between the two (none: "identical"; the influence table's
cost_ratio rows are timings and left out). With `--results`, it compares two finished runs' folders instead, every
Parquet file under them (scores, metrics, logs and tables; benchmark files and metric caches left out) and
checklist.json;
`--renamed` first gives a baseline from before issue 54 that issue's names (RENAMED), and compares tables whose rows
the new names sort elsewhere as sets of rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import yaml

from behaviortrace.report.cost import fixed_share, read_benchmarks

ROOT = Path(__file__).resolve().parents[1]


def clean_run(ref: str, folder: Path, cores: int, configfile: Path | None) -> float:
    """Wall seconds of a run of `ref` in a fresh clone at `folder` (its default config, `configfile` over it)."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "--quiet", ref], check=True)
    env = {**os.environ, "PYTHONPATH": str(folder / "src")}
    more = ["--configfile", str(configfile.resolve())] if configfile else []
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", str(cores), *more],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"the run of {ref} failed:\n{done.stderr[-3000:]}")
    return wall


# Issue 54's renames, old -> new: string values of every table, file names, and words of the checklist's details.
RENAMED = {
    "ground_truth": "label",
    "paid_per_step": "label",
    "labels": "label",
    "oracle": "label",
    "precision_at_gt": "precision_at_paid_steps",
    "chance_gt": "chance_paid_steps",
    "lift_gt": "lift_paid_steps",
}
RENAMED_FILES = {"oracle_p": "label_p"}
RENAMED_TEXT = {"; oracle at most": "; label set at most", "oracle": "label"}

# Rows that hold a measured time, not a result: the influence job's cost over its forward sweep.
TIMINGS = {"influence.parquet": pl.col("metric").str.starts_with("cost_ratio")}


def read_table(path: Path) -> pl.DataFrame:
    """A results table without its timing rows (TIMINGS)."""
    table = pl.read_parquet(path)
    return table.filter(~TIMINGS[path.name]) if path.name in TIMINGS else table


def differences(a: Path, b: Path) -> list[str]:
    """The tables (their timing rows left out) and checklist entries of two runs' results that are not equal."""
    out = []
    for path in sorted((a / "tables").glob("*.parquet")):
        other = b / "tables" / path.name
        if not other.exists() or not read_table(path).equals(read_table(other)):
            out.append(f"tables/{path.name}")
    out += [
        f"tables/{p.name} (only in the candidate)"
        for p in (b / "tables").glob("*.parquet")
        if not (a / "tables" / p.name).exists()
    ]
    if json.loads((a / "checklist.json").read_text()) != json.loads((b / "checklist.json").read_text()):
        out.append("checklist.json")
    return out


def renamed(table: pl.DataFrame) -> pl.DataFrame:
    """`table` with RENAMED applied to its string columns."""
    strings = [c for c, t in table.schema.items() if t == pl.String]
    return table.with_columns(pl.col(c).replace(RENAMED) for c in strings)


def same_rows(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """Equal as sets of rows (the order of rows and columns aside)."""
    if set(a.columns) != set(b.columns):
        return False
    keys = [c for c, t in a.schema.items() if not isinstance(t, (pl.List, pl.Array, pl.Struct))]
    a = a.select(sorted(a.columns)).sort(keys, nulls_last=True)
    return a.equals(b.select(sorted(b.columns)).sort(keys, nulls_last=True))


def results_differences(a: Path, b: Path, rename: bool) -> tuple[int, list[str]]:
    """How many Parquet files of run `a` equal run `b`'s, and those that do not, with checklist.json; with `rename`,
    `a` is given issue 54's names first. Benchmarks are timings, and the metric caches are named by code digests."""
    same, out = 0, []
    skipped = ("benchmarks", "cache")
    for path in sorted(p for p in a.rglob("*.parquet") if not set(skipped) & set(p.relative_to(a).parts)):
        rel = path.relative_to(a).as_posix()
        for old, new in RENAMED_FILES.items() if rename else ():
            rel = rel.replace(old, new)
        if not (b / rel).exists():
            out.append(f"{rel} (missing in the candidate)")
            continue
        mine, theirs = read_table(path), read_table(b / rel)
        if rename:
            mine = renamed(mine)
        if mine.equals(theirs) or (rename and same_rows(mine, theirs)):
            same += 1
        else:
            out.append(rel)
    text = (a / "checklist.json").read_text()
    for old, new in RENAMED_TEXT.items() if rename else ():
        text = text.replace(old, new)
    if json.loads(text) != json.loads((b / "checklist.json").read_text()):
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
    ap.add_argument("--renamed", action="store_true", help="give the first run issue 54's names before comparing")
    args = ap.parse_args()
    if args.results:
        same, diff = results_differences(*args.results, args.renamed)
        print(f"{same} Parquet files equal; " + ("identical" if not diff else "differ: " + ", ".join(diff)))
        return
    run = yaml.safe_load(args.configfile.read_text()).get("run", "default") if args.configfile else "default"
    scratch = Path(tempfile.mkdtemp(dir=args.keep))
    try:
        walls, runs = {}, {}
        for role, ref in (("baseline", args.baseline), ("candidate", args.candidate)):
            folder = scratch / role
            walls[role] = clean_run(ref, folder, args.cores, args.configfile)
            runs[role] = folder / "results" / run
            jobs = read_benchmarks(runs[role] / "benchmarks")
            startup, share, logged = fixed_share(jobs)
            fixed = f"start-up {startup:.0f} s ({share:.1%} of job wall)" if logged else "start-up not logged"
            print(f"{role} {ref}: {walls[role] / 60:.1f} min wall, {jobs.height} jobs; {fixed}")
        print(f"baseline / candidate: {walls['baseline'] / walls['candidate']:.2f}")
        diff = differences(runs["baseline"], runs["candidate"])
        print("tables: " + ("identical" if not diff else "differ: " + ", ".join(diff)))
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
