"""What a finished run cost, per rule: jobs, wall time (sum, and share of all jobs), start-up, CPU time and peak
memory, read from the `benchmark:` file Snakemake writes for every job (results/{run}/benchmarks/) and the first
and last lines of the job's log (results/{run}/logs/, the same path: common/io.py's setup_logging writes how long its
process took to start, and its CPU time when it ends).

Wall times add up jobs that ran side by side, so their sum exceeds the run's elapsed time on more than one
core; the share column says where the work goes.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

# The rules of an estimator instance's jobs, whose benchmark files are named {arm}{seed}_{estimator}[_draw{d}_{target}].
ESTIMATOR_RULES = ("score", "score_target_free", "score_model")
_JOB = re.compile(
    r"^(?:planted|placebo)\d+_(?P<estimator>[a-z][a-z0-9_]*?)(?:_draw\d+_(?:in_context|forced|none))?\.tsv$"
)


def _rss(value: str | None) -> float | None:
    """Peak resident MB; None where Snakemake took no sample (NA, or 0 for a job that ended before its first)."""
    mb = float(value) if value not in (None, "") else 0.0
    return mb if mb > 0 else None


# The numbers of STARTUP_LINE and END_LINE (common/io.py). A job of a version before the CPU count logged its start-up
# alone ("job started 1.23 s after its process (...)"): read too, so that older runs still compare.
_STARTUP = re.compile(r"job started ([0-9.]+) s after its process(?:, ([0-9.]+) CPU s)?")
_END = re.compile(
    r"job ended ([0-9.]+) s after its process: ([0-9.]+) CPU s in all, ([0-9.]+) of them in child processes"
    r"(?:; peak resident memory ([0-9.]+) MB)?"
)


def logged_times(log: Path) -> dict:
    """What a job logged of its own times (common/io.py): start-up seconds and the CPU seconds spent in them, and
    its CPU seconds in all (children included) and its peak resident memory at exit; None for what its log lacks (a
    job of an older version, or one killed before it ended)."""
    found = {"startup_s": None, "startup_cpu_s": None, "logged_cpu_s": None, "logged_rss_mb": None}
    try:
        with open(log, "rb") as f:
            head = f.read(4096).decode(errors="replace")
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return found
    if start := _STARTUP.search(head):
        found.update(startup_s=float(start[1]), startup_cpu_s=None if start[2] is None else float(start[2]))
    if ends := _END.findall(tail):
        found["logged_cpu_s"] = float(ends[-1][1])
        found["logged_rss_mb"] = float(ends[-1][3]) if ends[-1][3] else None
    return found


def read_benchmarks(folder: Path) -> pl.DataFrame:
    """One row per job: its rule (the first folder under `folder`), wall seconds, start-up seconds and their CPU
    seconds (from its log in the `logs` folder beside `folder`), CPU seconds, peak RSS, and when it ended (the
    benchmark file's time).

    CPU seconds are the job's own count at exit where its log has it (`cpu_source` "log"); else Snakemake's last
    sample ("sampled"), which misses what the job did after it: up to 30 s per job. Peak RSS likewise: the job's own
    peak where logged, else the largest of Snakemake's samples."""
    rows = []
    logs = folder.parent / "logs"
    for path in sorted(folder.rglob("*.tsv")):
        job = path.relative_to(folder)
        rule = job.parts[0].removesuffix(".tsv")
        table = pl.read_csv(path, separator="\t", null_values=["-", "NA"], infer_schema_length=0)
        last = table.row(-1, named=True)  # one row per repeat; jobs here run once
        times = logged_times(logs / job.with_suffix(".log"))
        sampled = float(last["cpu_time"]) if last.get("cpu_time") not in (None, "") else None
        logged, logged_rss = times.pop("logged_cpu_s"), times.pop("logged_rss_mb")
        rows.append(
            {
                "rule": rule,
                "job": job.as_posix(),
                "wall_s": float(last["s"]),
                **times,
                "cpu_s": sampled if logged is None else logged,
                "cpu_source": "sampled" if logged is None else "log",
                "max_rss_mb": _rss(last.get("max_rss")) if logged_rss is None else logged_rss,
                "ended": path.stat().st_mtime,
            }
        )
    if not rows:
        raise FileNotFoundError(f"no benchmark files under {folder}; run the workflow first")
    return pl.DataFrame(
        rows,
        schema_overrides={name: pl.Float64 for name in ("startup_s", "startup_cpu_s", "cpu_s", "max_rss_mb")},
    )


def configured(jobs: pl.DataFrame, estimators: set[str]) -> pl.DataFrame:
    """The jobs of the configured estimator instances and of every other rule: a run folder keeps the benchmark
    files of instances an earlier config named, which would otherwise count in this run's cost."""

    def keep(rule: str, job: str) -> bool:
        match = _JOB.match(Path(job).name)
        return rule not in ESTIMATOR_RULES or match is None or match["estimator"] in estimators

    mask = [keep(rule, job) for rule, job in zip(jobs["rule"], jobs["job"], strict=True)]
    return jobs.filter(pl.Series(mask, dtype=pl.Boolean))


def elapsed_seconds(jobs: pl.DataFrame) -> float:
    """From the first job's start to the last job's end (each benchmark file is written as its job ends): the run's
    wall time when one invocation ran every job."""
    return float((jobs["ended"].max() - (jobs["ended"] - jobs["wall_s"]).min()) if jobs.height else 0.0)


def fixed_share(jobs: pl.DataFrame) -> tuple[float, float, int]:
    """The start-up of the jobs that logged it, in seconds and as a share of their wall time, and how many did."""
    logged = jobs.filter(pl.col("startup_s").is_not_null())
    startup = float(logged["startup_s"].sum())
    return startup, startup / float(logged["wall_s"].sum()) if logged.height else 0.0, logged.height


def per_rule(jobs: pl.DataFrame) -> pl.DataFrame:
    total = jobs["wall_s"].sum()
    return (
        jobs.group_by("rule")
        .agg(
            pl.len().alias("jobs"),
            pl.col("wall_s").sum().alias("wall_s"),
            pl.col("startup_s").sum().alias("startup_s"),
            pl.col("wall_s").max().alias("longest_job_s"),
            pl.col("cpu_s").sum().alias("cpu_s"),
            pl.col("max_rss_mb").max().alias("peak_rss_mb"),
        )
        .with_columns(share=pl.col("wall_s") / total)
        .sort("wall_s", descending=True)
    )


def per_estimator(jobs: pl.DataFrame) -> pl.DataFrame:
    """The estimator instances' own jobs (preparation and scoring), summed per instance: what rerunning one costs."""
    rows = []
    for r in jobs.filter(pl.col("rule").is_in(ESTIMATOR_RULES)).iter_rows(named=True):
        match = _JOB.match(Path(r["job"]).name)
        if match:
            rows.append({**r, "estimator": match["estimator"]})
    if not rows:
        return pl.DataFrame(schema={"estimator": pl.Utf8, "jobs": pl.UInt32, "wall_s": pl.Float64})
    return (
        pl.DataFrame(rows)
        .group_by("estimator")
        .agg(
            pl.col("rule").unique().sort().str.join(", ").alias("rules"),
            pl.len().alias("jobs"),
            pl.col("wall_s").sum().alias("wall_s"),
            pl.col("wall_s").max().alias("longest_job_s"),
            pl.col("cpu_s").sum().alias("cpu_s"),
            pl.col("max_rss_mb").max().alias("peak_rss_mb"),
        )
        .sort("wall_s", descending=True)
    )


def estimator_markdown(table: pl.DataFrame) -> str:
    lines = [
        "| estimator | rules | jobs | wall s (sum) | longest job s | CPU s | peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True):
        cpu = "–" if r["cpu_s"] is None else f"{r['cpu_s']:.0f}"
        rss = "–" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
        lines.append(
            f"| {r['estimator']} | {r['rules']} | {r['jobs']} | {r['wall_s']:.0f} | {r['longest_job_s']:.0f} | {cpu} "
            f"| {rss} |"
        )
    return "\n".join(lines) + "\n"


def to_markdown(table: pl.DataFrame) -> str:
    lines = [
        "| rule | jobs | wall s (sum) | share | start-up s (sum) | longest job s | CPU s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True):
        cpu = "–" if r["cpu_s"] is None else f"{r['cpu_s']:.0f}"
        rss = "–" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
        lines.append(
            f"| {r['rule']} | {r['jobs']} | {r['wall_s']:.0f} | {r['share']:.1%} | {r['startup_s']:.0f} "
            f"| {r['longest_job_s']:.0f} | {cpu} | {rss} |"
        )
    lines.append(
        f"| all | {table['jobs'].sum()} | {table['wall_s'].sum():.0f} | 100% | {table['startup_s'].sum():.0f} "
        f"| {table['longest_job_s'].max():.0f} | {table['cpu_s'].sum():.0f} | {table['peak_rss_mb'].max():.0f} |"
    )
    return "\n".join(lines) + "\n"
