"""Read-only views of one seed's sketches and one target, the inputs of every estimator.

Arrays are loaded on first use (a norm-only estimator never reads the sketches) and are not writeable,
so an estimator cannot change what the next one sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from behaviortrace.sketch import moments
from behaviortrace.sketch.store import open_matrix, open_store, read_steps

ROLLOUT_COLUMNS = [
    "seed",
    "rollout_id",
    "step",
    "group_id",
    "gen_index",
    "paid",
    "advantage",
    "reward",
    "behavior",
    "trigger",
    "eligible",
    "lr",
    "checkpoint_step",
]


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class SeedView:
    """One seed: the rollout log (in sketch-row order) and the per-rollout arrays of its sketch shards.

    With `sketch_matrix` (the seed's stacked sketches, sketch/store.py `write_matrix`) the sketches are
    memory-mapped from it instead of decompressed from every shard; with `sketch_gram` (sketch/moments.py)
    their Gram matrix is read instead of computed.
    """

    def __init__(
        self,
        shard_paths: list[Path],
        rollouts_path: Path,
        sketch_matrix: Path | None = None,
        sketch_gram: Path | None = None,
    ):
        self.gram_path = Path(sketch_gram) if sketch_gram is not None else None
        self.shard_paths = [Path(p) for p in shard_paths]
        self.stores = [open_store(p) for p in self.shard_paths]
        ids = np.concatenate([g["rollout_id"][:] for g in self.stores])
        log = pl.scan_parquet(rollouts_path).select(ROLLOUT_COLUMNS).collect()
        self.rollouts = pl.DataFrame({"rollout_id": ids}).join(log, on="rollout_id", how="left", maintain_order="left")
        if self.rollouts["step"].null_count():
            raise ValueError(f"{rollouts_path}: sketched rollouts missing from the rollout log")
        self.attrs = dict(self.stores[0].attrs)
        if sketch_matrix is not None:
            self._arrays["sketch"] = open_matrix(sketch_matrix, len(ids))

    @classmethod
    def from_arrays(
        cls,
        rollouts: pl.DataFrame,
        arrays: dict[str, np.ndarray],
        steps: pl.DataFrame,
        sketch_gram: Path | None = None,
    ) -> SeedView:
        """A view of in-memory data (for estimator tests and notebooks): same interface; nothing on disk
        but an optional saved Gram matrix."""
        view = cls.__new__(cls)
        view.shard_paths, view.stores, view.attrs = [], [], {}
        view.gram_path = Path(sketch_gram) if sketch_gram is not None else None
        view.rollouts = rollouts
        view._arrays = {name: _frozen(np.array(a)) for name, a in arrays.items()}
        view.__dict__["steps"] = steps
        return view

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = _frozen(np.concatenate([g[name][:] for g in self.stores]))
        return self._arrays[name]

    @cached_property
    def _arrays(self) -> dict:
        return {}

    @property
    def sketches(self) -> np.ndarray:
        return self.array("sketch")

    @cached_property
    def _saved_gram(self) -> tuple[np.ndarray | None, str | None, np.ndarray | None]:
        if self.gram_path is None:
            return None, None, None
        gram, side, squares = moments.read_gram(self.gram_path, *self.sketches.shape)
        return _frozen(gram), side, _frozen(squares)

    def gram(self, side: str) -> np.ndarray:
        """Phi^T Phi ("features") or Phi Phi^T ("rollouts") of the sketches, float64 (sketch/moments.py):
        read where the workflow computed that side once per seed, else computed here."""
        saved, saved_side, _ = self._saved_gram
        if saved is not None and saved_side == side:
            return saved
        return _frozen(moments.gram(self.sketches, side))

    def scaled_moments(self, scale: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
        """The Gram matrix and column sums of squares of the sketches with row i times scale[i] (never saved: a
        scale is an estimator's own choice)."""
        phi = self.sketches * scale[:, None].astype(self.sketches.dtype)
        return moments.gram(phi, side), moments.squares(phi)

    @cached_property
    def squares(self) -> np.ndarray:
        """Column sums of squares of the sketches [k], float64."""
        saved = self._saved_gram[2]
        return saved if saved is not None else _frozen(moments.squares(self.sketches))

    @property
    def norms(self) -> np.ndarray:
        return self.array("norm")

    @property
    def fluency(self) -> np.ndarray:
        return self.array("fluency")

    @cached_property
    def steps(self) -> pl.DataFrame:
        """Per step: learning rate and the clip coefficient the optimizer applied."""
        return read_steps(self.shard_paths)


@dataclass(frozen=True)
class Target:
    """One kind of target of one draw, at every analysis checkpoint."""

    kind: str
    draw: int
    checkpoint_steps: np.ndarray
    vectors: np.ndarray  # [checkpoints, k]
    norms: np.ndarray
    n: np.ndarray  # samples behind each vector (0: no target at that checkpoint)
    # Each vector divided by AdamW's denominator at its checkpoint, before sketching (targets/gradients.py),
    # where the training run saved one (`has_adam`), with the optimizer's betas and eps; None in older stores.
    preconditioned: np.ndarray | None = None
    has_adam: np.ndarray | None = None
    adam: dict | None = None

    @classmethod
    def load(cls, store: Path, kind: str, draw: int) -> Target:
        g = zarr.open_group(store, mode="r")
        if not g.attrs.get("complete"):
            raise RuntimeError(f"target store {store} is not complete; rerun its targets job")
        adam = f"{kind}_adam" in g
        return cls(
            kind,
            draw,
            _frozen(g["checkpoint_step"][:]),
            _frozen(g[kind][:]),
            _frozen(g[f"{kind}_norm"][:]),
            _frozen(g[f"{kind}_n"][:]),
            _frozen(g[f"{kind}_adam"][:]) if adam else None,
            _frozen(g["has_adam"][:]) if adam else None,
            dict(g.attrs["adam"]) if adam else None,
        )

    def index_for(self, checkpoint_steps: np.ndarray) -> np.ndarray:
        """For each row, the analysis checkpoint at or before the checkpoint that generated it."""
        idx = np.searchsorted(self.checkpoint_steps, checkpoint_steps, side="right") - 1
        if (idx < 0).any():
            raise ValueError(f"no analysis checkpoint at or before step {int(checkpoint_steps[idx < 0][0])}")
        return idx

    def for_rows(self, view: SeedView) -> tuple[np.ndarray, np.ndarray]:
        """Target vector [n, k] (as an index into vectors) and whether one exists, for each rollout."""
        idx = self.index_for(view.rollouts["checkpoint_step"].to_numpy())
        return idx, self.n[idx] > 0
