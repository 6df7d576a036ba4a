"""The metrics of each score set of an evaluation, kept between runs, so that rerunning one estimator
re-evaluates its own scores only.

An evaluate job covers every estimator of a seed and draw (the bootstrap cells are shared), so a change
of one estimator reruns it whole. The metrics of one (estimator, target) depend only on its two score
files and on what every score set shares: the label, fluency and probe rates, the token cosines, the
config sections the job was given and the evaluation code. A cache entry is keyed by all of them: score
files and input files by content, the arrays read from the sketch stores by their bytes, the code by the
digest of every project module the evaluation runs. Entries are written atomically; a missing or
unreadable one is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.common.imports import code_digest, dependency_files
from behaviortrace.common.io import atomic_write_parquet

log = logging.getLogger(__name__)
EVALUATION_MODULE = "behaviortrace.jobs.evaluate"


def _file_digest(h, path: Path) -> None:
    h.update(str(Path(path).name).encode() + b"\0")
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)


def context_digest(config: dict, files: list[Path], arrays: list[np.ndarray]) -> str:
    """What every score set's metrics depend on besides its scores."""
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    h.update(code_digest(dependency_files([EVALUATION_MODULE])).encode())
    for path in files:
        _file_digest(h, path)
    for array in arrays:
        h.update(str(array.dtype).encode() + str(array.shape).encode() + np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


class MetricCache:
    """One Parquet file per (estimator, target) under `folder`, named with the key of what made it."""

    def __init__(self, folder: Path, context: str):
        self.folder, self.context = Path(folder), context

    def key(self, name: tuple[str, str], files: tuple[Path, ...]) -> str:
        h = hashlib.sha256(self.context.encode() + "\0".join(name).encode())
        for path in files:
            _file_digest(h, path)
        return h.hexdigest()[:32]

    def _path(self, name: tuple[str, str], key: str) -> Path:
        return self.folder / f"{name[0]}__{name[1]}__{key}.parquet"

    def load(self, name: tuple[str, str], key: str) -> pl.DataFrame | None:
        path = self._path(name, key)
        if not path.exists():
            return None
        try:
            return pl.read_parquet(path)
        except Exception as err:  # a damaged entry costs a recomputation, never a wrong table
            log.warning("ignoring unreadable metric cache entry %s: %s", path, err)
            return None

    def save(self, name: tuple[str, str], key: str, table: pl.DataFrame) -> None:
        path = self._path(name, key)
        for old in self.folder.glob(f"{name[0]}__{name[1]}__*.parquet"):
            if old != path:
                old.unlink(missing_ok=True)
        atomic_write_parquet(table, path)


def assemble(fresh: pl.DataFrame, cached: dict[tuple[str, str], pl.DataFrame], keys: list) -> pl.DataFrame:
    """The table `evaluate` would have made for every key at once: per stratum, the label's count row, each
    score set's rows in the order of `keys` (from `cached` where there, else from `fresh`), then the rest (the
    label's effect rows among them)."""
    parts = []
    own = pl.concat_str(["estimator", "target"], separator="\0")
    count = (pl.col("estimator") == "label") & (pl.col("level") == "rollout")
    names = [f"{e}\0{t}" for e, t in keys]
    for stratum in fresh["stratum"].unique(maintain_order=True).to_list():
        rows = fresh.filter(pl.col("stratum") == stratum)
        parts.append(rows.filter(count))
        for key in keys:
            source = cached.get(key, rows)
            parts.append(
                source.filter(
                    (pl.col("stratum") == stratum) & (pl.col("estimator") == key[0]) & (pl.col("target") == key[1])
                )
            )
        parts.append(rows.filter(~count & ~own.is_in(names)))
    return pl.concat(parts) if parts else fresh
