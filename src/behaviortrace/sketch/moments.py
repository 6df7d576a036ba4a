"""The Gram matrix of a seed's sketches, computed once per seed (rule sketch_gram).

On the smaller side: Phi^T Phi [k, k] (the "features" side) when the width k is at most the number of
rollouts n, else the kernel Phi Phi^T [n, n] (the "rollouts" side). Estimators that solve against it
(trak) would otherwise rebuild it whenever their own code changes: it is the costly part of their
preparation, and it depends on the sketches only.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

ROWS_PER_BLOCK = 8192


def row_blocks(phi: np.ndarray, rows: int = ROWS_PER_BLOCK):
    """Row blocks of phi (a memory-mapped matrix is read block by block, never copied whole)."""
    for start in range(0, phi.shape[0], rows):
        yield np.asarray(phi[start : start + rows])


SIDES = ("features", "rollouts")


def smaller_side(n: int, k: int) -> str:
    return "features" if k <= n else "rollouts"


def squares(phi: np.ndarray) -> np.ndarray:
    """Column sums of squares [k], exact float64 sums (what a ridge scaled by the mean diagonal of
    Phi^T Phi needs to full precision)."""
    out = np.zeros(phi.shape[1])
    for block in row_blocks(phi):
        out += np.square(block, dtype=np.float64).sum(0)
    return out


def gram(phi: np.ndarray, side: str) -> np.ndarray:
    """Phi^T Phi (side "features") or Phi Phi^T (side "rollouts"), float64.

    Products run in Phi's precision. On the features side the row blocks are summed in float64 and rows
    of zeros (rollouts with no gradient) are skipped, as they add nothing.
    """
    if side == "rollouts":
        full = np.asarray(phi)
        return (full @ full.T).astype(np.float64)
    if side != "features":
        raise ValueError(f"Gram side {side!r} is not one of {SIDES}")
    k = phi.shape[1]
    out = np.zeros((k, k))
    for block in row_blocks(phi):
        block = block[np.any(block != 0, axis=1)]
        out += (block.T @ block).astype(np.float64)
    return out


def write_gram(gram: np.ndarray, side: str, squares: np.ndarray, out: Path) -> None:
    """Uncompressed .npz, written under a temporary name and renamed when complete."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.savez(handle, gram=gram, side=np.array(side), squares=squares)
    os.replace(tmp, out)


def read_gram(path: Path, n: int, k: int) -> tuple[np.ndarray, str, np.ndarray]:
    """The saved (gram, side, squares); their shapes must match sketches [n, k]."""
    with np.load(path) as data:
        gram, side, sq = data["gram"], str(data["side"]), data["squares"]
    size = k if side == "features" else n
    if gram.shape != (size, size) or sq.shape != (k,):
        raise ValueError(
            f"{path}: shapes {gram.shape}, {sq.shape} do not match sketches of shape ({n}, {k}); rerun its job"
        )
    return gram, side, sq
