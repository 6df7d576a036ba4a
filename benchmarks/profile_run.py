"""Where a finished run's time went, per rule: start-up (interpreter, Snakemake's script preamble, imports), I/O
and compute.

    python benchmarks/profile_run.py [--run default] [--sample 3] [--markdown out.md]

- wall and start-up: every job's benchmark file and the start-up its log's first line records (common/job.py);
- I/O: for up to `--sample` jobs of each rule (Snakemake's record of the job under .snakemake/metadata names its
  inputs and outputs), reading every input in full with the reader the package uses (Parquet with polars, Zarr
  arrays, safetensors, .npz, .pt) and writing every output again to a scratch folder, times the rule's jobs;
  a job that reads only part of an input spends less, so this is an upper bound;
- compute: the rest of the wall time.

Run it from the folder the run was made in (the one holding results/ and .snakemake/).
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.report.cost import read_benchmarks


def read_fully(path: Path) -> None:
    """Read a file or folder as a job would: decoded, every value."""
    if path.is_dir():
        if path.suffix == ".zarr":
            import zarr

            group = zarr.open_group(str(path), mode="r")
            for _, array in group.arrays():
                array[...]
            for _, sub in group.groups():
                for _, array in sub.arrays():
                    array[...]
            return
        for child in sorted(path.iterdir()):
            read_fully(child)
    elif path.suffix == ".parquet":
        pl.read_parquet(path)
    elif path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        load_file(path)
    elif path.suffix == ".npz":
        with np.load(path) as data:
            [data[k] for k in data.files]
    elif path.suffix == ".pt":
        import torch

        torch.load(path, weights_only=False)
    elif path.exists():
        path.read_bytes()


def write_again(path: Path, scratch: Path) -> None:
    """Write an output again in scratch: a Parquet table re-encoded, anything else copied."""
    target = scratch / "out"
    if path.is_dir():
        shutil.copytree(path, target)
    elif path.suffix == ".parquet":
        pl.read_parquet(path).write_parquet(target)  # the read is small beside the writing of the same table
    elif path.exists():
        shutil.copyfile(path, target)
    shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)


def recorded_jobs(workdir: Path, out: Path) -> dict[str, list[dict]]:
    """Snakemake's record of each job whose outputs lie under `out`, by rule: its inputs and outputs."""
    jobs: dict[tuple, dict] = {}
    for record in sorted((workdir / ".snakemake" / "metadata").iterdir()):
        output = base64.urlsafe_b64decode(record.name + "=" * (-len(record.name) % 4)).decode()
        if not (workdir / output).resolve().is_relative_to(out.resolve()):
            continue
        meta = json.loads(record.read_text())
        key = (meta["rule"], meta.get("starttime"), tuple(meta.get("input", [])))
        job = jobs.setdefault(key, {"rule": meta["rule"], "inputs": list(key[2]), "outputs": []})
        job["outputs"].append(output)
    by_rule = defaultdict(list)
    for job in jobs.values():
        by_rule[job["rule"]].append(job)
    return by_rule


def io_seconds(job: dict, workdir: Path) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        for name in job["inputs"]:
            read_fully(workdir / name)
        for name in job["outputs"]:
            write_again(workdir / name, Path(scratch))
        return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="default")
    ap.add_argument("--sample", type=int, default=3, help="jobs per rule whose I/O is timed")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    workdir, out = Path.cwd(), Path("results") / args.run
    jobs = read_benchmarks(out / "benchmarks")
    recorded = recorded_jobs(workdir, out)
    lines = [
        "| rule | jobs | wall s | start-up s | I/O s (at most) | compute s | start-up share | I/O share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    totals = defaultdict(float)
    for rule, part in sorted(jobs.group_by("rule"), key=lambda kv: -kv[1]["wall_s"].sum()):
        rule = rule[0]
        n, wall = part.height, float(part["wall_s"].sum())
        startup = float(part["startup_s"].fill_null(0).sum())
        sampled = [io_seconds(job, workdir) for job in recorded.get(rule, [])[: args.sample]]
        io = statistics.mean(sampled) * n if sampled else 0.0
        compute = max(wall - startup - io, 0.0)
        for name, value in (("wall", wall), ("startup", startup), ("io", io), ("compute", compute)):
            totals[name] += value
        lines.append(
            f"| {rule} | {n} | {wall:.0f} | {startup:.0f} | {io:.0f} | {compute:.0f} | {startup / wall:.0%} "
            f"| {io / wall:.0%} |"
        )
    t = totals
    lines.append(
        f"| all | {jobs.height} | {t['wall']:.0f} | {t['startup']:.0f} | {t['io']:.0f} | {t['compute']:.0f} "
        f"| {t['startup'] / t['wall']:.0%} | {t['io'] / t['wall']:.0%} |"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
