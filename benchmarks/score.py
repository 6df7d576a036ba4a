"""What a score job costs, as ratios against the previous way measured in the same run.

On synthetic sketch stores shaped like one seed of the default run (seeded; 4 shards, k = 4096, by
default 25,600 rollouts, half the default's 51,200 to keep it short):

- reading the sketches: decompressing every shard's Zarr `sketch` array (each score job did this) vs
  memory-mapping the seed's stacked `sketch/matrix.npy` (written once per seed by `sketch_matrix`);
- trak: one job computing the Gram matrix and solving in it for both its rollout and its step scores
  (as each of a seed's trak jobs did) vs the per-seed Gram matrix (`sketch_gram`) and Cholesky factor
  (`prepare`) once plus a job that only solves two triangular systems and multiplies; and rerunning trak
  after a change of its code: its prepare jobs recomputing the Gram matrix and inverting (as before) vs
  only factoring the saved Gram matrix;
- step sums (gas, tracincp, norm): numpy's reduceat over the matrix vs per-step float64 sums.

Each path's result is checked against the other (same sketches; trak to 1e-3 relative, the two
lambdas differ by the float64 fix).

    python benchmarks/score.py [--rows 25600] [--k 4096]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.estimators import trak  # noqa: E402
from behaviortrace.sketch import moments  # noqa: E402
from behaviortrace.sketch.store import ROW_ARRAYS, ShardWriter, open_matrix, read_rows, write_matrix  # noqa: E402

ROLLOUTS_PER_STEP = 256


def write_stores(folder: Path, rows: int, k: int, shards: int, seed: int) -> list[Path]:
    """Shards of synthetic sketches (a fifth of the rows zero, as rollouts with advantage 0)."""
    rng = np.random.default_rng(seed)
    steps_per_shard = rows // ROLLOUTS_PER_STEP // shards
    paths = []
    for shard in range(shards):
        steps = np.arange(shard * steps_per_shard, (shard + 1) * steps_per_shard)
        step_of_row = np.repeat(steps, ROLLOUTS_PER_STEP)
        frame = pl.DataFrame(
            {"rollout_id": step_of_row * 1000 + np.tile(np.arange(ROLLOUTS_PER_STEP), len(steps))}
        ).with_columns(step=pl.Series(step_of_row), checkpoint_step=pl.Series(step_of_row // 20 * 20))
        info = pl.DataFrame({"step": steps, "lr": 1e-3, "clip_coef": 1.0, "grad_norm": 1.0})
        path = folder / f"shard{shard:03d}.zarr"
        writer = ShardWriter(path, frame, info, k, {"method": "countsketch", "k": k}, "bench", ROLLOUTS_PER_STEP)
        for step in steps:
            sketch = rng.normal(size=(ROLLOUTS_PER_STEP, k)).astype(np.float32)
            sketch[rng.random(ROLLOUTS_PER_STEP) < 0.2] = 0
            arrays = {
                name: np.zeros((ROLLOUTS_PER_STEP, k) if width == "k" else ROLLOUTS_PER_STEP, dtype=dtype)
                for name, (dtype, width) in ROW_ARRAYS.items()
                if name not in ("rollout_id", "step", "checkpoint_step")
            }
            arrays["sketch"] = sketch
            writer.write_step(int(step), arrays)
        writer.finish()
        paths.append(path)
    return paths


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def report(name: str, old: float, new: float) -> None:
    print(f"{name:<38} before {old:7.2f} s   now {new:7.2f} s   before/now {old / new:6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=25_600)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shards = write_stores(folder, args.rows, args.k, 4, args.seed)
        matrix_path = folder / "matrix.npy"
        _, stack_s = timed(lambda: write_matrix(shards, matrix_path))
        print(f"{args.rows} rollouts x k={args.k}; stacking the matrix once per seed: {stack_s:.2f} s")

        decoded, old_read = timed(lambda: read_rows(shards)[0]["sketch"])
        mapped, new_read = timed(lambda: np.asarray(open_matrix(matrix_path, len(decoded))).sum(dtype=np.float64))
        assert np.isclose(mapped, decoded.sum(dtype=np.float64))
        report("read the sketches (per score job)", old_read, new_read)

        phi = open_matrix(matrix_path, len(decoded))
        targets = np.random.default_rng(args.seed + 1).normal(size=(11, args.k)).astype(np.float32)
        idx = np.arange(len(decoded)) % len(targets)

        def old_trak():
            lam = 0.1 * float(np.linalg.norm(decoded).astype(np.float64) ** 2) / args.k
            out = []
            for _ in range(2):  # rollout scores, then step scores: each solved in its own Gram matrix
                gram = (decoded.T @ decoded).astype(np.float64) + lam * np.eye(args.k)
                weights = np.linalg.solve(gram, targets.astype(np.float64).T)
                out.append((decoded @ weights.astype(np.float32))[np.arange(len(idx)), idx])
            return out[0]

        def new_trak_job(prepared):
            return trak.solve_scores(phi, targets, idx, prepared)

        old_scores, old_trak_s = timed(old_trak)
        (gram, squares), gram_s = timed(lambda: (moments.gram(phi, "features"), moments.squares(phi)))
        lam = trak.ridge(squares, 0.1)
        prepared, factor_s = timed(lambda: trak.factor(gram, lam, "primal"))
        _, inverse_s = timed(lambda: np.linalg.inv(gram + lam * np.eye(len(gram))))
        new_scores, job_s = timed(lambda: (new_trak_job(prepared), new_trak_job(prepared))[0])
        np.testing.assert_allclose(new_scores, old_scores, rtol=1e-3, atol=1e-3 * np.abs(old_scores).max())
        report("trak, one job (Gram inside)", old_trak_s, job_s)
        jobs = 4  # a seed's trak jobs: 2 target kinds x 2 draws
        report(f"trak, a seed's {jobs} jobs (+ Gram, prepare)", jobs * old_trak_s, gram_s + factor_s + jobs * job_s)
        report("trak rerun, a seed's prepare (Gram + inverse vs factor)", gram_s + inverse_s, factor_s)

        starts = np.arange(0, len(decoded), ROLLOUTS_PER_STEP)
        old_sums, old_sum_s = timed(lambda: np.add.reduceat(np.asarray(phi), starts, axis=0))
        new_sums, new_sum_s = timed(
            lambda: np.stack([np.asarray(phi[a : a + ROLLOUTS_PER_STEP], dtype=np.float64).sum(0) for a in starts])
        )
        np.testing.assert_allclose(new_sums, old_sums, rtol=1e-4, atol=1e-4)
        report("per-step sums of the sketches", old_sum_s, new_sum_s)


if __name__ == "__main__":
    main()
