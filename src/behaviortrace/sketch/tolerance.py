"""How close a step's summed rollout sketches must come to the sketch of its gradient (relative error), per
compute.dtype (the run's precision; the weights are float32 for both); without torch, so that config validation can
read it.

float32 runs land near 1e-7 (rounding in float32 sums). `compute.dtype: bfloat16` is mixed precision (float32
weights, forward and backward under bf16 autocast, common/device.py): each layer's weight gradient in TRL's `.grad`
is a product of bf16-rounded activations and output gradients, rounded to bf16, while the per-rollout factors are
multiplied in float32, so the two differ by about bfloat16's precision.
diagnostics/bf16_gradients.py measures it on the built-in model and small models of eleven architecture families
(three steps each, on the CPU); the largest bf16 errors it printed are below, and the bf16 tolerance is four times
the largest self-check error. A parameter whose use escapes capture misses by far more than either tolerance.
"""

from __future__ import annotations

# Largest errors diagnostics/bf16_gradients.py printed for compute.dtype bfloat16 (mixed precision), over the
# built-in model and eleven families: a step's summed sketches against TRL's gradient (OLMo2; every family 1.6e-3
# to 2.1e-3); a rollout's captured sketch against its own autograd gradient under bf16 autocast (Gemma2); and
# against its float32 gradient, without autocast, at the same weights (OPT: what bf16 itself costs, capture aside).
# With bf16 weights, before compute.dtype bfloat16 meant mixed precision, they were 3.4e-3, 6.6e-3 and 7.5e-2.
BF16_SELF_CHECK_MEASURED = 2.13e-3
BF16_ROLLOUT_MEASURED = 9.4e-3
BF16_VS_FLOAT32_MEASURED = 4.4e-2
SELF_CHECK_TOLERANCE = {"float32": 1e-3, "bfloat16": 4 * BF16_SELF_CHECK_MEASURED}


def tolerance_for(dtype: str) -> float:
    """The self-check tolerance for a run in `dtype` ("float32" or "bfloat16", as compute.dtype names them)."""
    if dtype not in SELF_CHECK_TOLERANCE:
        raise ValueError(f"no self-check tolerance for {dtype}; use float32 or bfloat16 (compute.dtype)")
    return SELF_CHECK_TOLERANCE[dtype]


def config_problems(cfg) -> list[str]:
    """A self-check limit below what capture reaches in the run's dtype would fail every run (a config rule)."""
    dtype, limit = cfg.compute.dtype, cfg.checklist.max_self_check_error
    reachable = tolerance_for(dtype)
    if dtype == "float32" or limit >= reachable:
        return []
    return [
        f"config key checklist.max_self_check_error = {limit}: below what capture reaches with compute.dtype = "
        f"{dtype} (a step's rollout sketches add up to its gradient within {reachable:.1e} there, "
        f"sketch/tolerance.py); set it to {reachable:.1e} or more"
    ]
