"""The rollout log, written in parts that line up with checkpoints so that training can resume.

Rows are buffered in memory and flushed as one Parquet part just before each checkpoint is saved. On
resume, parts that start at or after the checkpoint being resumed are deleted, so no row is lost or
written twice. `finalize` joins the parts into one file once training has finished.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet

_PART = re.compile(r"^(rollouts|steps)-(\d{8})-(\d{8})\.parquet$")


class RolloutLog:
    def __init__(self, parts_dir: str | Path):
        self.parts_dir = Path(parts_dir)
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.rollouts: list[dict] = []
        self.steps: list[dict] = []
        self.first_unflushed_step = 0

    def discard_from(self, step: int) -> None:
        """Forget every part that starts at or after `step` (work a resumed run will redo)."""
        for path in self.parts_dir.iterdir():
            m = _PART.match(path.name)
            if m is None or int(m.group(2)) >= step:
                path.unlink()
        self.first_unflushed_step = step

    def add_rollouts(self, rows: list[dict]) -> None:
        self.rollouts.extend(rows)

    def add_step(self, row: dict) -> None:
        self.steps.append(row)

    def flush(self, until_step: int) -> None:
        """Write buffered rows of steps before `until_step` as one part per table."""
        start = self.first_unflushed_step
        if until_step <= start:
            return
        for name, rows in (("rollouts", self.rollouts), ("steps", self.steps)):
            keep = [r for r in rows if r["step"] < until_step]
            if keep:
                atomic_write_parquet(
                    pl.DataFrame(keep), self.parts_dir / f"{name}-{start:08d}-{until_step:08d}.parquet"
                )
        self.rollouts = [r for r in self.rollouts if r["step"] >= until_step]
        self.steps = [r for r in self.steps if r["step"] >= until_step]
        self.first_unflushed_step = until_step

    def read(self, name: str) -> pl.DataFrame:
        parts = sorted(p for p in self.parts_dir.glob(f"{name}-*.parquet") if _PART.match(p.name))
        if not parts:
            raise FileNotFoundError(f"no {name} parts in {self.parts_dir}")
        return pl.concat([pl.read_parquet(p) for p in parts]).sort(
            ["step", *(["rollout_id"] if name == "rollouts" else [])]
        )
