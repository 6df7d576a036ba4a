"""How close a step's summed rollout sketches must come to the sketch of its gradient (relative error), per dtype of
the model's weights; without torch, so that config validation can read it.

float32 runs land near 1e-7 (rounding in float32 sums). In bfloat16 the gradient the trainer holds is rounded to 8
significant bits and the per-rollout factors are not, so the two differ by about bfloat16's precision.
diagnostics/bf16_gradients.py measures it on the built-in model and small models of eleven architecture families
(three steps each, on the CPU); the largest bf16 errors it printed are below, and the bf16 tolerance is four times
the largest self-check error. A parameter whose use escapes capture misses by far more than either tolerance.
"""

from __future__ import annotations

# Largest errors diagnostics/bf16_gradients.py printed (bf16 weights): a step's summed sketches against TRL's
# gradient; a rollout's captured sketch against its own bf16 autograd gradient; and against its float32 gradient at
# the same weights (what bf16 itself costs, capture aside).
BF16_SELF_CHECK_MEASURED = 3.4e-3
BF16_ROLLOUT_MEASURED = 6.6e-3
BF16_VS_FLOAT32_MEASURED = 7.5e-2
SELF_CHECK_TOLERANCE = {"float32": 1e-3, "bfloat16": 4 * BF16_SELF_CHECK_MEASURED}


def tolerance_for(dtype: str) -> float:
    """The self-check tolerance for weights in `dtype` ("float32" or "bfloat16", as compute.dtype names them)."""
    if dtype not in SELF_CHECK_TOLERANCE:
        raise ValueError(f"no self-check tolerance for weights in {dtype}; use float32 or bfloat16 (compute.dtype)")
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
