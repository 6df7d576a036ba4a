"""Where a finished run's time went, per rule: start-up (interpreter, Snakemake's script preamble, imports), the
job's own work on a CPU, and the time it spent off the CPU.

    python benchmarks/profile_run.py [--run default] [--markdown out.md]

From every job's benchmark file (wall and CPU seconds) and the start-up its log's first line records
(common/io.py):

- start-up: from the job's process start to its first line;
- work: CPU seconds after start-up (computing, and reading and decoding files, which on a local disk with the
  files in the page cache is CPU work too);
- off the CPU: wall minus CPU seconds (waiting for the disk, or for a core where more jobs ran than cores).

benchmarks/time_split.py splits the two largest rules, the replay and the exact influence, further into forward,
backward, optimizer, sampling and I/O.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

from behaviortrace.report.cost import read_benchmarks


def profile(jobs: pl.DataFrame) -> pl.DataFrame:
    """Per rule: jobs, wall, start-up, work and off-CPU seconds (summed over jobs), largest wall first."""
    startup = pl.col("startup_s").fill_null(0.0)
    cpu = pl.col("cpu_s").fill_null(pl.col("wall_s"))
    return (
        jobs.with_columns(
            startup=startup,
            work=(cpu - startup).clip(lower_bound=0.0),
            off_cpu=(pl.col("wall_s") - cpu).clip(lower_bound=0.0),
            logged=pl.col("startup_s").is_not_null(),
        )
        .group_by("rule")
        .agg(
            pl.len().alias("jobs"),
            pl.col("logged").sum(),
            pl.col("wall_s").sum().alias("wall"),
            pl.col("startup").sum(),
            pl.col("work").sum(),
            pl.col("off_cpu").sum(),
        )
        .sort("wall", descending=True)
    )


def to_markdown(table: pl.DataFrame) -> str:
    lines = [
        "| rule | jobs | wall s | start-up s | work s (CPU) | off the CPU s | start-up share | start-up s per job |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in [*table.iter_rows(named=True), {"rule": "all", **table.drop("rule").sum().row(0, named=True)}]:
        per_job = f"{r['startup'] / r['logged']:.2f}" if r["logged"] else "not logged"
        lines.append(
            f"| {r['rule']} | {r['jobs']} | {r['wall']:.0f} | {r['startup']:.0f} | {r['work']:.0f} "
            f"| {r['off_cpu']:.0f} | {r['startup'] / max(r['wall'], 1e-9):.0%} | {per_job} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="default")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    text = to_markdown(profile(read_benchmarks(args.results / args.run / "benchmarks")))
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
