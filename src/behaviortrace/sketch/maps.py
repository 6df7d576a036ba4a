"""Random linear maps S from a model's full gradient to k numbers, with E[<Sa, Sb>] = <a, b>.

Two methods, one interface:

- `countsketch`: every coordinate of the flat gradient goes to one of k buckets with a random sign.
  Buckets and signs come from 4-wise independent polynomial hashes of the coordinate index, so the
  map is never stored and is the same on any device.
- `factored`: each weight matrix block W [R, C] is sketched to P_R G P_C^T ([d, d]) with Gaussian
  P_R, P_C, computed from the per-example factors (layer inputs and output gradients) without
  materializing per-example weight gradients. All other parameters (norm weights, biases) are
  count-sketched into the remaining buckets.

Every block has its own seed derived from the run's sketch seed and the block's name, so the map does
not depend on the order of blocks, and one map serves all rollouts and targets of a run. Both methods
also return each example's exact squared L2 norm before projection.
"""

from __future__ import annotations

import hashlib
import math

import torch

from behaviortrace.gradients.per_example import Factor, PerExampleGrads, param_layout

METHODS = ("countsketch", "factored")
_P = 2**31 - 1  # Mersenne prime for the polynomial hashes
_ROW_BLOCK_ELEMENTS = 2**24  # per-example rows materialized at once by countsketch (B x rows x C)
_HASH_CACHE_COORDS = 2**27  # hashes kept in memory (12 bytes per coordinate); beyond that, hashed on the fly


def block_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "big") >> 1


def _coefficients(seed: int, name: str, tag: str, n: int = 4) -> list[int]:
    return [block_seed(seed, f"{name}:{tag}:{i}") % _P for i in range(n)]


def _poly_hash(x: torch.Tensor, coef: list[int]) -> torch.Tensor:
    """(c3 x^3 + c2 x^2 + c1 x + c0) mod p, by Horner's rule; 4-wise independent over x < p."""
    h = torch.full_like(x, coef[0])
    for c in coef[1:]:
        h = torch.remainder(h * x + c, _P)
    return h


class _CountSketchBlocks:
    """Bucket and sign of every coordinate of every block, hashed from (seed, block name, index)."""

    def __init__(self, k: int, seed: int, device):
        self.k, self.seed, self.device = k, seed, device
        self._cache: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._cached = 0

    def hashes(self, name: str, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Buckets and signs (+-1.0) of coordinates start..stop of block `name`.

        Buckets stay int64: index_add_ is about 15x slower with an int32 index on the CPU.
        """
        key = (name, start, stop)
        if key in self._cache:
            return self._cache[key]
        if stop > _P:
            raise ValueError(f"parameter {name} has more than 2^31 - 1 coordinates; split it to sketch it")
        idx = torch.arange(start, stop, dtype=torch.int64, device=self.device)
        bucket = torch.remainder(_poly_hash(idx, _coefficients(self.seed, name, "bucket")), self.k)
        sign = (_poly_hash(idx, _coefficients(self.seed, name, "sign")) & 1).float() * 2 - 1
        if self._cached + (stop - start) <= _HASH_CACHE_COORDS:  # the same slices recur at every step
            self._cache[key] = (bucket, sign)
            self._cached += stop - start
        return bucket, sign

    def add(self, out: torch.Tensor, name: str, start: int, values: torch.Tensor, scratch: bool = False) -> None:
        """out [B, k] += sketch of values [B, n], coordinates start..start+n of block `name`. With `scratch`,
        `values` is a temporary the caller no longer needs and takes the signs in place."""
        bucket, sign = self.hashes(name, start, start + values.shape[1])
        out.index_add_(1, bucket, values.mul_(sign) if scratch else values * sign)


def _materialize_rows(contribs: list[tuple[Factor, torch.Tensor]], r0: int, r1: int, batch: int) -> torch.Tensor:
    """Per-example gradient rows r0..r1 of one weight matrix, [B, r1 - r0, C]."""
    if len(contribs) == 1 and not contribs[0][0].is_index:
        rows, cols = contribs[0]
        return torch.bmm(rows.values[:, :, r0:r1].transpose(1, 2), cols)  # faster than the einsum on the CPU
    cols0 = contribs[0][1]
    out = torch.zeros(batch, r1 - r0, cols0.shape[-1], device=cols0.device)
    for rows, cols in contribs:
        if rows.is_index:
            ids = rows.values
            hit = (ids >= r0) & (ids < r1)
            example = torch.arange(batch, device=ids.device).unsqueeze(1).expand_as(ids)
            flat = (example * (r1 - r0) + ids - r0)[hit]
            out.view(-1, out.shape[-1]).index_add_(0, flat, cols[hit])
        else:
            out.baddbmm_(rows.values[:, :, r0:r1].transpose(1, 2), cols)
    return out


def _row_blocks(rows: int, cols: int, batch: int):
    """(r0, r1) ranges of weight rows small enough to materialize for a whole batch at once."""
    step = max(1, _ROW_BLOCK_ELEMENTS // max(1, batch * cols))
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def _gram(a: Factor, b: Factor) -> torch.Tensor:
    """[B, T_a, T_b] inner products between the per-position rows of two factors."""
    if a.is_index and b.is_index:
        return (a.values.unsqueeze(2) == b.values.unsqueeze(1)).float()
    if a.is_index:
        return _gram(b, a).transpose(1, 2)
    if b.is_index:  # dense a [B, Ta, R] against one-hot rows b: pick column ids of b
        idx = b.values.unsqueeze(1).expand(-1, a.values.shape[1], -1)
        return torch.gather(a.values, 2, idx)
    return torch.bmm(a.values, b.values.transpose(1, 2))


def _ghost_sq_norm(contribs: list[tuple[Factor, torch.Tensor]]) -> torch.Tensor:
    """||sum_c rows_c^T cols_c||^2 per example, from Gram matrices over positions."""
    total = 0.0
    for ra, ca in contribs:
        for rb, cb in contribs:
            total = total + (_gram(ra, rb) * torch.bmm(ca, cb.transpose(1, 2))).sum((1, 2))
    return total


class SketchMap:
    """A fixed random linear map for one model architecture; see the module docstring."""

    def __init__(self, layout: dict[str, tuple[str, torch.Size]], method: str, k: int, seed: int, device="cpu"):
        if method not in METHODS:
            raise ValueError(f"sketch method {method!r} is not one of {METHODS}")
        self.layout, self.method, self.seed, self.device = dict(layout), method, seed, torch.device(device)
        self.n_params = sum(int(torch.Size(s).numel()) for _, s in self.layout.values())
        if method == "countsketch":
            self.k = k
            self.rest = _CountSketchBlocks(k, seed, self.device)
            self.dim = 0
            return
        matrices = [n for n, (kind, _) in self.layout.items() if kind == "matrix"]
        k_rest = max(1, k // 8)
        self.dim = max(1, math.isqrt((k - k_rest) // max(1, len(matrices))))
        self.offsets = {n: i * self.dim**2 for i, n in enumerate(matrices)}
        self.k_rest_offset = len(matrices) * self.dim**2
        self.k = self.k_rest_offset + k_rest
        self.rest = _CountSketchBlocks(k_rest, seed, self.device)
        self.proj: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for n in matrices:
            rows, cols = self.layout[n][1]
            gen = torch.Generator().manual_seed(block_seed(seed, n))
            p_rows = torch.randn(self.dim, rows, generator=gen) / math.sqrt(self.dim)
            p_cols = torch.randn(self.dim, cols, generator=gen) / math.sqrt(self.dim)
            self.proj[n] = (p_rows.to(self.device), p_cols.to(self.device))

    @classmethod
    def for_model(cls, model, method: str, k: int, seed: int) -> SketchMap:
        return cls(param_layout(model), method, k, seed, next(model.parameters()).device)

    def attrs(self) -> dict:
        return {
            "method": self.method,
            "k": self.k,
            "seed": self.seed,
            "n_params": self.n_params,
            "factored_dim": self.dim,
            "blocks": len(self.layout),
        }

    def check_covers(self, model) -> None:
        """Fail loudly if any trainable parameter would be left out of the sketch."""
        trainable = set(param_layout(model))
        missing = sorted(trainable - set(self.layout))
        if missing:
            raise ValueError(f"sketch does not cover {len(missing)} trainable parameters, e.g. {missing[:3]}")

    def _check_blocks(self, names) -> None:
        missing = sorted(set(self.layout) - set(names))
        if missing:
            raise ValueError(f"gradients missing for {len(missing)} sketched blocks, e.g. {missing[:3]}")

    def sketch_examples(self, grads: PerExampleGrads) -> tuple[torch.Tensor, torch.Tensor]:
        """Sketches [B, k] and exact squared norms [B] of per-example gradients given as factors."""
        self._check_blocks(list(grads.matrix) + list(grads.dense))
        batch = grads.batch
        out = torch.zeros(batch, self.k, device=self.device)
        sq = torch.zeros(batch, device=self.device)
        for name, (kind, shape) in self.layout.items():
            if kind == "dense" or name in grads.dense:
                g = grads.dense[name]
                sq += torch.linalg.vector_norm(g, dim=1).square()
                self._add_dense(out, name, g)
            if kind == "matrix" and name in grads.matrix:
                contribs = grads.matrix[name]
                if self.method == "countsketch":
                    sq += self._count_matrix(out, name, shape, contribs, batch)
                else:
                    sq += self._ghost_or_dense_norm(contribs, shape, batch)
                    self._factored_matrix(out, name, contribs)
        return out, sq

    def sketch_dense(self, grads: dict[str, torch.Tensor]) -> tuple[torch.Tensor, float]:
        """Sketch [k] and exact squared norm of one full gradient given per parameter (e.g. p.grad)."""
        self._check_blocks(grads)
        out = torch.zeros(1, self.k, device=self.device)
        sq = 0.0
        for name, (kind, _shape) in self.layout.items():
            g = grads[name].float().to(self.device)
            sq += float(g.pow(2).sum())
            if kind == "matrix" and self.method == "factored":
                p_rows, p_cols = self.proj[name]
                block = p_rows @ g @ p_cols.T
                off = self.offsets[name]
                out[0, off : off + self.dim**2] += block.flatten()
            else:
                self._add_dense(out, name, g.reshape(1, -1))
        return out[0], sq

    def _add_dense(self, out: torch.Tensor, name: str, g: torch.Tensor) -> None:
        target = out if self.method == "countsketch" else out[:, self.k_rest_offset :]
        self.rest.add(target, name, 0, g)

    def _count_matrix(self, out, name, shape, contribs, batch) -> torch.Tensor:
        rows, cols = shape
        sq = torch.zeros(batch, device=self.device)
        for r0, r1 in _row_blocks(rows, cols, batch):
            block = _materialize_rows(contribs, r0, r1, batch).reshape(batch, -1)
            sq += torch.linalg.vector_norm(block, dim=1).square()
            self.rest.add(out, name, r0 * cols, block, scratch=True)
        return sq

    def _factored_matrix(self, out, name, contribs) -> None:
        p_rows, p_cols = self.proj[name]
        block = 0.0
        for rows, cols in contribs:
            if rows.is_index:
                left = p_rows.T[rows.values]  # [B, T, d]: the projected one-hot rows
            else:
                left = rows.values @ p_rows.T
            block = block + torch.bmm(left.transpose(1, 2), cols @ p_cols.T)
        off = self.offsets[name]
        out[:, off : off + self.dim**2] += block.reshape(block.shape[0], -1)

    @staticmethod
    def _ghost_or_dense_norm(contribs, shape, batch) -> torch.Tensor:
        """Exact squared norm: from Gram matrices when positions are few, else by materializing rows."""
        positions = sum(c.shape[1] for _, c in contribs)
        rows, cols = shape
        if positions**2 <= rows * cols:
            return _ghost_sq_norm(contribs)
        return sum(
            _materialize_rows(contribs, r0, r1, batch).pow(2).sum((1, 2)) for r0, r1 in _row_blocks(rows, cols, batch)
        )


def materialize(grads: PerExampleGrads, layout: dict) -> dict[str, torch.Tensor]:
    """Dense per-example gradients [B, *shape] (small models only: for tests and baselines)."""
    out = {}
    for name, (kind, shape) in layout.items():
        if kind == "matrix" and name in grads.matrix:
            out[name] = _materialize_rows(grads.matrix[name], 0, shape[0], grads.batch)
        else:
            out[name] = grads.dense[name].reshape(grads.batch, *shape)
    return out
