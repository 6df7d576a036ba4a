"""Zarr v3 stores of per-rollout sketches: one store per (seed, shard of steps), chunked by rows.

A store is written under a `.partial` name and renamed into place only when every step is in, with
`complete: true` in its attributes; readers refuse anything else. The partial store remembers which
steps are done and the fingerprint of what produced it, so a killed job resumes where it stopped and
stale work from other inputs is thrown away.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from behaviortrace.common.io import replace_dir

ROW_ARRAYS = {  # name -> (dtype, per-row width: "k" or 1)
    "rollout_id": ("int64", 1),
    "step": ("int64", 1),
    "checkpoint_step": ("int64", 1),
    "sketch": ("float32", "k"),
    "norm": ("float64", 1),
    "fluency": ("float32", 1),
    "behavior_sketch": ("float32", "k"),
    "behavior_norm": ("float64", 1),
    "has_marker": ("bool", 1),
    "null_sketch": ("float32", "k"),
    "null_norm": ("float64", 1),
}
# Row arrays known when a store is made (which rollout each row is); steps fill in the others.
FIXED_ROW_ARRAYS = ("rollout_id", "step", "checkpoint_step")
STEP_ARRAYS = {
    "step": "int64",
    "lr": "float64",
    "clip_coef": "float64",
    "grad_norm": "float64",
    # Relative error of the step's summed rollout sketches against the step gradient's sketch; NaN where
    # the step was not checked (sketching from checkpoints checks one step per shard, capture every step).
    "self_check_error": "float64",
    "done": "bool",
}
# Step facts that a captured store learns only when the step is trained (ShardWriter.write_step's `info`).
STEP_FACTS = ("lr", "clip_coef", "grad_norm", "self_check_error")
# Sketch-array writes a deferred store lets its background thread queue (three per step).
_MAX_BACKGROUND_WRITES = 12


class ShardWriter:
    def __init__(
        self,
        final: Path,
        rows: pl.DataFrame,
        steps: pl.DataFrame,
        k: int,
        attrs: dict,
        fingerprint: str,
        rows_per_chunk: int,
        deferred: bool = False,
    ):
        """`rows`: rollout_id, step, checkpoint_step of every rollout of the shard; `steps`: the step of
        every step of the shard, with whichever of lr, clip_coef, grad_norm are known in advance (the
        others come with `write_step`).

        `deferred`: a step's sketches are compressed and written by a background thread while training goes
        on, and its small per-row arrays, its step facts and its done flag wait for `flush` (one write per
        array for many steps), which first waits for those sketches. Train-time capture flushes at every
        checkpoint, the point a killed run resumes from and retrains (and recaptures) the steps after."""
        self.final = Path(final)
        self.partial = self.final.with_name(self.final.name + ".partial")
        self.steps = steps["step"].to_list()
        self.deferred = deferred
        self._background = ThreadPoolExecutor(max_workers=1) if deferred else None
        self._writes: list[Future] = []
        starts = rows.with_row_index().group_by("step").agg(pl.col("index").min())
        self.row_start = dict(zip(starts["step"].to_list(), starts["index"].to_list(), strict=False))
        self.ids = {name: rows[name].to_numpy() for name in FIXED_ROW_ARRAYS}
        self._pending: list[tuple[int, dict[str, np.ndarray]]] = []
        self._dirty: set[str] = set()
        if self.partial.exists():
            group = zarr.open_group(self.partial, mode="r+")
            if group.attrs.get("fingerprint") == fingerprint:
                self._open(group, fresh=False)
                return
            shutil.rmtree(self.partial)
        self.group = zarr.open_group(self.partial, mode="w")
        n = rows.height
        for name, (dtype, width) in ROW_ARRAYS.items():
            shape = (n, k) if width == "k" else (n,)
            chunks = (rows_per_chunk, k) if width == "k" else (rows_per_chunk,)
            self.group.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=0)
        for name in FIXED_ROW_ARRAYS:
            self.group[name][:] = rows[name].to_numpy()
        info = self.group.create_group("steps")
        for name, dtype in STEP_ARRAYS.items():
            fill = np.nan if name == "self_check_error" else 0
            info.create_array(
                name, shape=(len(self.steps),), chunks=(max(1, len(self.steps)),), dtype=dtype, fill_value=fill
            )
            if name in steps.columns:
                info[name][:] = steps[name].to_numpy()
        self.group.attrs.update({**attrs, "fingerprint": fingerprint, "complete": False})
        self._open(self.group, fresh=True)

    def _open(self, group: zarr.Group, fresh: bool) -> None:
        # Array handles are kept: looking an array up by name reads its metadata from disk on every step.
        self.group = group
        self.arrays = {name: group[name] for name in ROW_ARRAYS}
        # The step arrays are one chunk each: kept in memory, written whole.
        self.facts = {name: group[f"steps/{name}"][:] for name in STEP_ARRAYS}
        # Sketch rows that are all zero need no write on a fresh store (it reads as zeros); a reopened store
        # may hold older values there.
        self.fresh = fresh

    def done_steps(self) -> set[int]:
        """Steps whose rows are all written (flushed or waiting for `flush`)."""
        return {s for s, d in zip(self.steps, self.facts["done"], strict=False) if d}

    def write_step(self, step: int, arrays: dict[str, np.ndarray], info: dict[str, float] | None = None) -> None:
        """One step's rows, and optionally its step facts (STEP_FACTS)."""
        start = self.row_start[step]
        stop = start + len(arrays["norm"])
        small = {}
        for name, values in arrays.items():
            if name in FIXED_ROW_ARRAYS:  # written when the store was made; only checked here
                if not np.array_equal(values, self.ids[name][start:stop]):
                    raise ValueError(f"step {step}: {name} of the rows differs from the store's {self.final}")
            elif ROW_ARRAYS[name][1] == "k":
                if not (self.fresh and not values.any()):
                    self._write_rows(name, start, stop, values)
            else:
                small[name] = values
        index = self.steps.index(step)
        for name, value in (info or {}).items():
            if name not in STEP_FACTS:
                raise KeyError(f"{name!r} is not a step fact of a sketch store ({', '.join(STEP_FACTS)})")
            self.facts[name][index] = value
        self.facts["done"][index] = True
        self._dirty |= {"done", *(info or {})}
        self._pending.append((start, small))
        if not self.deferred:
            self.flush()

    def _write_rows(self, name: str, start: int, stop: int, values: np.ndarray) -> None:
        if self._background is None:
            self.arrays[name][start:stop] = values
            return
        if len(self._writes) >= _MAX_BACKGROUND_WRITES:  # a slow disk holds training back, not memory
            self._writes.pop(0).result()
        self._writes.append(self._background.submit(self.arrays[name].__setitem__, slice(start, stop), values))

    def _wait_for_writes(self) -> None:
        """Block until the background writes are on disk; re-raises the first that failed."""
        writes, self._writes = self._writes, []
        for write in writes:
            write.result()

    def flush(self) -> None:
        """Write the waiting small rows, then the step facts and done flags (a step counts as done on disk
        only after all its rows are there)."""
        self._wait_for_writes()
        pending = sorted(self._pending, key=lambda item: item[0])
        self._pending = []
        sizes = [len(small["norm"]) for _, small in pending]
        contiguous = all(pending[i + 1][0] == pending[i][0] + sizes[i] for i in range(len(pending) - 1))
        for name in pending[0][1] if pending else ():
            if contiguous:  # steps in order: one write per array
                self.arrays[name][pending[0][0] : pending[0][0] + sum(sizes)] = np.concatenate(
                    [small[name] for _, small in pending]
                )
            else:
                for (start, small), size in zip(pending, sizes, strict=True):
                    self.arrays[name][start : start + size] = small[name]
        for name in sorted(self._dirty):
            self.group[f"steps/{name}"][:] = self.facts[name]
        self._dirty = set()

    def finish(self) -> float | None:
        """Mark the store complete and move it into place; returns its largest self-check error (None if
        no step was checked)."""
        missing = sorted(set(self.steps) - self.done_steps())
        if missing:
            raise RuntimeError(f"cannot finish {self.final}: steps {missing[:5]} not sketched")
        self.flush()
        # The largest self-check error of the steps that were checked (a resumed job keeps the killed one's).
        errors = self.facts["self_check_error"]
        worst = float(np.nanmax(errors)) if np.isfinite(errors).any() else None
        if worst is not None:
            self.group.attrs["self_check_error"] = worst
        self.group.attrs["complete"] = True
        self.close()
        replace_dir(self.partial, self.final)
        return worst

    def close(self) -> None:
        """Wait for the background writes and stop their thread (`finish` does; nothing is written after)."""
        if self._background is not None:
            self._wait_for_writes()
            self._background.shutdown()
            self._background = None


def open_store(path: Path) -> zarr.Group:
    """A finished store, read-only; a partial or unfinished one is an error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sketch store {path} does not exist")
    group = zarr.open_group(path, mode="r")
    if not group.attrs.get("complete"):
        raise RuntimeError(f"sketch store {path} is not complete (killed mid-write?); rerun its sketch job")
    return group


def open_seed(paths: list[Path]) -> tuple[list[zarr.Group], dict]:
    """The finished shard stores of one seed, checked to share one sketch map, and their attributes."""
    groups = [open_store(p) for p in paths]
    attrs = dict(groups[0].attrs)
    for g, p in zip(groups, paths, strict=False):
        for key in ("method", "k", "seed", "n_params", "model"):
            if g.attrs.get(key) != attrs.get(key):
                raise ValueError(
                    f"{p}: attribute {key} differs from {paths[0]} ({g.attrs.get(key)} vs {attrs.get(key)})"
                )
    return groups, attrs


def read_rows(paths: list[Path], with_sketches: bool = True) -> tuple[dict[str, np.ndarray], dict]:
    """Rows of several shard stores of one seed, concatenated in step order, and their shared attributes."""
    groups, attrs = open_seed(paths)
    names = [n for n in ROW_ARRAYS if with_sketches or ROW_ARRAYS[n][1] != "k"]
    rows = {n: np.concatenate([g[n][:] for g in groups]) for n in names}
    return rows, attrs


def read_steps(paths: list[Path]) -> pl.DataFrame:
    return pl.concat(
        [pl.DataFrame({n: open_store(p)[f"steps/{n}"][:] for n in STEP_ARRAYS if n != "done"}) for p in paths]
    ).sort("step")


def write_matrix(paths: list[Path], out: Path, name: str = "sketch", rows_per_read: int = 4096) -> tuple[int, int]:
    """One seed's `name` rows (shards in the given order) as one uncompressed float32 .npy file.

    Every score job of a seed reads the same sketches; memory-mapped, this file is decoded once and its
    pages are shared by jobs running side by side, where each job would otherwise decompress every
    shard and copy it into memory of its own. Written under a temporary name and renamed when complete.
    """
    groups, attrs = open_seed(paths)
    n, k = sum(g[name].shape[0] for g in groups), int(groups[0][name].shape[1])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    matrix = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, k))
    row = 0
    for g in groups:
        array = g[name]
        for start in range(0, array.shape[0], rows_per_read):
            block = array[start : start + rows_per_read]
            matrix[row : row + len(block)] = block
            row += len(block)
    matrix.flush()
    del matrix
    os.replace(tmp, out)
    return n, k


def open_matrix(path: Path, n_rows: int) -> np.ndarray:
    """A seed's stacked matrix, memory-mapped read-only; its row count must match the shards'."""
    matrix = np.load(path, mmap_mode="r")
    if matrix.ndim != 2 or matrix.shape[0] != n_rows:
        raise ValueError(f"{path}: shape {matrix.shape} does not match the {n_rows} rows of its shards; rerun its job")
    return matrix


def fingerprint(rollouts_path: Path, params: dict) -> str:
    h = hashlib.blake2b(json.dumps(params, sort_keys=True, default=str).encode(), digest_size=16)
    h.update(Path(rollouts_path).read_bytes())
    return h.hexdigest()


def shard_checks(paths: list[Path]) -> list[dict]:
    """What each store's writer recorded about its coverage and self-check (every step under train-time
    capture; the first step of each shard when sketching from checkpoints)."""
    out = []
    for path in paths:
        group = zarr.open_group(path, mode="r")
        attrs = group.attrs
        errors = group["steps/self_check_error"][:] if "self_check_error" in group["steps"] else np.array([])
        out.append(
            {
                "path": str(path),
                "mode": attrs.get("mode", "checkpoint"),
                "n_params": attrs.get("n_params"),
                "n_trainable": attrs.get("n_trainable"),
                "self_check_error": attrs.get("self_check_error"),
                "steps": int(group["steps/step"].shape[0]),
                "checked_steps": int(np.isfinite(errors).sum()),
            }
        )
    return out
