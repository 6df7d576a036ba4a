"""Where a job runs: CUDA when present (or asked for), the CPU otherwise; the same formats either way."""

from __future__ import annotations

import torch

from behaviortrace.config.sections import Compute


def resolve(compute: Compute) -> dict:
    want = compute.device
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config compute.device is 'cuda' but no CUDA device is visible to this job")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    # bfloat16 is honored on the CPU too (slower there, but the same numerics and the same capture tolerance as
    # on a GPU: sketch/tolerance.py), so a bf16 run can be checked on any machine.
    dtype = compute.dtype
    return {
        "use_cuda": use_cuda,
        "device": "cuda" if use_cuda else "cpu",
        "dtype": dtype,
        "torch_dtype": getattr(torch, dtype),
    }


def set_threads(n: int) -> None:
    """Use the cores Snakemake gave this job, no more."""
    torch.set_num_threads(max(1, n))
