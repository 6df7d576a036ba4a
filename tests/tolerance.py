"""The suite's numeric tolerances, and the audit that finds the ones a processor comes close to.

`BT_TOLERANCE_SCALE=0.5` multiplies every tolerance of the suite by 0.5: the relative and absolute tolerances
of `np.allclose`, `np.testing.assert_allclose`, `torch.allclose`, `torch.testing.assert_close` and
`pytest.approx`, and every bound a test checks with `within`. A test that fails then measured a value within
2x of its bound. Run it under each CPU capability (`ATEN_CPU_CAPABILITY=avx2`, `default`) to see which
tolerances one processor's rounding could break on another (docs/reruns.md). At the default scale of 1 nothing
is patched."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

SCALE = float(os.environ.get("BT_TOLERANCE_SCALE", "1"))

# A replay of a run's training against its saved checkpoints, as a share of training's update
# (replay.retrain.update_error). Not the largest weight difference: AdamW turns the kernels' rounding of a nearly
# cancelling gradient coordinate into a weight difference of up to lr, so that one is set by the processor
# (measured on the 6-step test run: 1.2e-5 float64 replay vs float32 training with AVX2 kernels, 2.8e-5 with
# the default ones). Those coordinates are few, so their share of the update stays small: 2e-6 to 3e-5 measured
# under both kernels, in float32 and float64 replays; leaving out one rollout of 72 moves it by 0.2.
UPDATE_TOLERANCE = 1e-3


def within(value, bound) -> bool:
    """value <= bound, with the bound scaled by the audit (the only way tests state an explicit bound)."""
    return bool(np.all(np.asarray(value) <= np.asarray(bound) * SCALE))


def _scaled(fn, defaults: dict):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for key, default in defaults.items():
            value = kwargs.get(key, default)
            if value is not None:
                kwargs[key] = value * SCALE
        return fn(*args, **kwargs)

    return wrapper


def install_audit() -> None:
    """Scale the tolerances of the comparison functions the suite uses (called once, from conftest)."""
    if SCALE == 1:
        return
    np.allclose = _scaled(np.allclose, {"rtol": 1e-5, "atol": 1e-8})
    np.isclose = _scaled(np.isclose, {"rtol": 1e-5, "atol": 1e-8})
    np.testing.assert_allclose = _scaled(np.testing.assert_allclose, {"rtol": 1e-7, "atol": 0.0})
    torch.allclose = _scaled(torch.allclose, {"rtol": 1e-5, "atol": 1e-8})
    # torch's own defaults depend on the dtype; the audit scales only tolerances a test states.
    torch.testing.assert_close = _scaled(torch.testing.assert_close, {"rtol": None, "atol": None})
    approx = pytest.approx

    @functools.wraps(approx)
    def scaled_approx(expected, rel=None, abs=None, **kwargs):
        if rel is None and abs is None:  # pytest's defaults, which apply only when neither is given
            rel, abs = 1e-6, 1e-12
        rel = None if rel is None else rel * SCALE
        abs = None if abs is None else abs * SCALE
        return approx(expected, rel=rel, abs=abs, **kwargs)

    pytest.approx = scaled_approx
