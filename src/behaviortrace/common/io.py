"""Small I/O helpers: atomic writes, so a killed job never leaves a file that looks finished, and scratch folders a
rerun clears."""

from __future__ import annotations

import atexit
import logging
import os
import resource
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import polars as pl


def atomic_write_parquet(df: pl.DataFrame, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    df.write_parquet(tmp)
    os.replace(tmp, path)


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written folder into place, replacing any older one."""
    if final_dir.exists():
        shutil.rmtree(final_dir)
    os.replace(tmp_dir, final_dir)


@contextmanager
def scratch_dir(path: Path):
    """A job's own scratch folder at a fixed `path`: what a killed attempt left there is removed first (a rerun finds
    it by its name), and the folder is removed when the job leaves it, by error or not."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# The first and last lines of every job's log; report/cost.py reads their numbers back (a job's fixed cost and its
# CPU time and peak memory, on the results page; benchmarks/profile_run.py splits a run's CPU time with them).
# Snakemake's benchmark file samples a job every 30 s (workflow/rules/common.smk), so it misses up to 30 s of every
# job's CPU time and any peak between samples: the job's own count at exit does not.
STARTUP_LINE = "job started %.2f s after its process, %.2f CPU s (interpreter, Snakemake's script preamble, imports)"
END_LINE = (
    "job ended %.2f s after its process: %.2f CPU s in all, %.2f of them in child processes; peak resident memory "
    "%.0f MB"
)


def process_age() -> float | None:
    """Seconds since this process began, from Linux's /proc (None elsewhere)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            fields = stat.read().rpartition(")")[2].split()
            began = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks after boot
            return float(uptime.read().split()[0]) - began
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user and system) of this process, every thread, and of its child processes that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def setup_logging(log_file: str | None) -> logging.Logger:
    """Log to the rule's log file (and stderr), with timestamps, for progress on long stages. A job's log (one with a
    file) opens with how long the job took to start and ends with the CPU time it took."""
    age = process_age() if log_file else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w"))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True
    )
    sys.excepthook = _log_failure  # a job's error goes into its own log, not only to the console
    logger = logging.getLogger("behaviortrace")
    if age is not None:
        logger.info(STARTUP_LINE, age, sum(cpu_seconds()))
        atexit.register(_log_end, logger)
    return logger


def _log_end(logger: logging.Logger) -> None:
    own, children = cpu_seconds()
    logger.info(END_LINE, process_age() or 0.0, own + children, children, peak_rss_mb())


def peak_rss_mb() -> float:
    """The largest resident memory of this process, or of one of its ended child processes, in MB: the kernel's
    exact peak, where Snakemake's benchmark file has the largest of its samples."""
    peak_kb = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return peak_kb / 1024


def _log_failure(kind, value, traceback) -> None:
    logging.getLogger("behaviortrace").critical("job failed", exc_info=(kind, value, traceback))
