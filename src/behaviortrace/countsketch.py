"""CountSketch of a model's full gradient: every coordinate hashed into k buckets with a random sign.

The map is linear and unbiased for inner products, E[<Sa, Sb>] = <a, b>, with variance about
(|a|^2 |b|^2 + <a, b>^2) / k. Each parameter block gets its own hash and signs, drawn from a seed
derived from the run's sketch seed and the block's name, so the map does not depend on the order in
which blocks are visited and one map serves every rollout and target of a run. Groundwork for the
sketch stage (not yet wired into the workflow).
"""

from __future__ import annotations

import hashlib

import torch


def block_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "big") >> 1


class CountSketch:
    def __init__(self, named_shapes: dict[str, torch.Size], k: int, seed: int):
        self.k, self.seed = k, seed
        self.names = list(named_shapes)
        self.buckets: dict[str, torch.Tensor] = {}
        self.signs: dict[str, torch.Tensor] = {}
        for name, shape in named_shapes.items():
            gen = torch.Generator().manual_seed(block_seed(seed, name))
            n = int(torch.Size(shape).numel())
            self.buckets[name] = torch.randint(0, k, (n,), generator=gen)
            self.signs[name] = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1

    @classmethod
    def for_model(cls, model, k: int, seed: int) -> "CountSketch":
        return cls({n: p.shape for n, p in model.named_parameters() if p.requires_grad}, k, seed)

    def check_covers(self, model) -> None:
        """Fail loudly if any trainable parameter would be left out of the sketch."""
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        missing = sorted(trainable - set(self.names))
        if missing:
            raise ValueError(f"sketch does not cover {len(missing)} trainable parameters, e.g. {missing[:3]}")

    def apply(self, grads: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sketch a batch of per-example gradients, given per block as [batch, *shape]; returns [batch, k]."""
        missing = [n for n in self.names if n not in grads]
        if missing:
            raise ValueError(f"gradients missing for {len(missing)} sketched blocks, e.g. {missing[:3]}")
        first = next(iter(grads.values()))
        out = torch.zeros(first.shape[0], self.k, dtype=torch.float32, device=first.device)
        for name in self.names:
            g = grads[name].reshape(first.shape[0], -1).float()
            out.index_add_(1, self.buckets[name].to(g.device), g * self.signs[name].to(g.device))
        return out
