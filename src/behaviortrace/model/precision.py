"""Float64 end to end, for the finite-difference checks of the exact influence (and `influence.dtype: float64`).

A model loaded in float64 still rounds to float32 where its own code casts: transformers' RMS norms cast their
input to float32 (`.to(torch.float32)`, `.float()`), eager attention takes its softmax with `dtype=torch.float32`
(where Gemma-2's fully masked padding rows, -1.8e308 in float64, become -inf and then NaN), rotary embeddings
compute in float32. Each puts a float32 noise floor under every finite difference. So a model loaded in float64
(models.py) runs its forward under a torch function mode that reads every request for float32 as one for
float64: the model's own modules and formulas, whatever the norm class, in float64. A value that still leaves
float64 inside the forward with a gradient (a cast to bf16 or half, say) raises FloatingPointError naming the
operation, so a check never runs silently below float64 precision.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_LOWER = (torch.float32, torch.float16, torch.bfloat16)


class Float64Mode(TorchFunctionMode):
    """Inside it, float32 means float64: `Tensor.float()` is `Tensor.double()`, and a float32 dtype given to any
    torch function or method (`.to`, `.type`, `softmax(dtype=...)`, factories) is float64. An operation that still
    returns a lower-precision float tensor carrying a gradient raises FloatingPointError."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif any(a is torch.float32 for a in args) or kwargs.get("dtype") is torch.float32:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs = {**kwargs, "dtype": torch.float64}
        out = func(*args, **kwargs)
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor) and value.dtype in _LOWER and value.requires_grad:
                raise FloatingPointError(
                    f"float64 checks: {getattr(func, '__qualname__', func)} returned {value.dtype} with a gradient "
                    f"inside {self.where}'s forward; the exact influence's finite-difference checks need float64 "
                    "throughout"
                )
        return out


def keep_float64(model):
    """`model` (in float64), its forward from now on under `Float64Mode`: a hook enters the mode before each call
    and one that runs even when the forward raises leaves it. Hooks, not a replaced forward, so that a deep copy of
    the model keeps computing with its own weights. Once per model."""
    if getattr(model, "_keeps_float64", False):
        return model
    where, open_modes = type(model).__name__, []

    def enter(module, args):
        open_modes.append(Float64Mode(where))
        open_modes[-1].__enter__()

    def leave(module, args, output):
        open_modes.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
    model._keeps_float64 = True
    return model
