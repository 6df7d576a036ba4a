"""Seeds derived from names and numbers, so a random choice never depends on the order of computation."""

from __future__ import annotations

import hashlib


def cell_seed(*parts) -> int:
    """A 64-bit seed from any parts (run, seed, draw, stratum, method, ...)."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest(), "big")
