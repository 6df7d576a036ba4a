"""Where a job runs: CUDA when present (or asked for), the CPU otherwise; the same formats either way.

`compute.dtype: bfloat16` is mixed precision, as transformers' Trainer trains with `bf16=True`: the weights stay
float32 (master weights, which AdamW updates) and the forward and backward passes run under bf16 autocast. TRL's
training gets it from accelerate, which wraps the trained model's forward in autocast; every job that recomputes
what training computed (capture, the sketch, targets, behavior and replay jobs, the SFT warm-up) runs its passes
inside `autocast(device)`, which is the same `torch.autocast`. Pure bf16 weights would lose most updates: at a
learning rate of 5e-6 AdamW's step is below bf16's 8 significant bits for most weights (tests/test_mixed_precision.py).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from behaviortrace.config.sections import Compute


def resolve(compute: Compute) -> dict:
    """`device` ("cuda" or "cpu"), `use_cuda`, `dtype` (compute.dtype: "float32", or "bfloat16" for bf16 autocast)
    and `torch_dtype`, the dtype the weights are loaded in (float32 for both; the influence stage sets its own)."""
    want = compute.device
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config compute.device is 'cuda' but no CUDA device is visible to this job")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    # bfloat16 is honored on the CPU too (slower there, but the same numerics and the same capture tolerance as
    # on a GPU: sketch/tolerance.py), so a bf16 run can be checked on any machine.
    return {
        "use_cuda": use_cuda,
        "device": "cuda" if use_cuda else "cpu",
        "dtype": compute.dtype,
        "torch_dtype": torch.float32,
    }


def autocast(device: dict):
    """A context in which the model's forward (and a backward started in it) runs as training ran it: bf16 autocast
    on the job's device when `device["dtype"]` is "bfloat16", nothing otherwise (float32 and the influence's
    float64). The same context accelerate puts around the trained model's forward (`bf16=True`, train/trl_surface.py).
    """
    if device["dtype"] != "bfloat16":
        return nullcontext()
    return torch.autocast(device_type=device["device"], dtype=torch.bfloat16)


def set_threads(n: int) -> None:
    """Use the cores Snakemake gave this job, no more."""
    torch.set_num_threads(max(1, n))
