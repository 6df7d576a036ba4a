"""Float64 end to end, for the finite-difference checks of the exact influence.

A model loaded in float64 still rounds to float32 inside its RMS norms (transformers casts their input to
float32), which puts a float32 noise floor under every finite difference. `full_precision` makes those
norms compute in the input's dtype (the same formula); other norm classes are refused by name, so a
check never runs silently at float32 precision.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# RMS norm classes whose forward is weight * x / sqrt(mean(x^2) + variance_epsilon) with x cast to float32.
PLAIN_RMS_NORMS = ("Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen3RMSNorm")


def _rms_norm(module, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return module.weight * (hidden_states * torch.rsqrt(variance + module.variance_epsilon))


@contextmanager
def full_precision(model):
    """While open, the RMS norms of a float64 model keep float64 inputs in float64 (no-op for a model in
    another dtype); nests."""
    patched = []
    for module in model.modules() if next(model.parameters()).dtype == torch.float64 else ():
        name = type(module).__name__
        if not name.endswith("RMSNorm") or "forward" in module.__dict__:  # not a norm, or patched by an outer call
            continue
        if name not in PLAIN_RMS_NORMS:
            raise NotImplementedError(
                f"float64 checks do not know the norm {name}; known: {', '.join(PLAIN_RMS_NORMS)}"
            )
        original = module.forward

        def forward(hidden_states, module=module, original=original):
            if hidden_states.dtype != torch.float64:
                return original(hidden_states)
            return _rms_norm(module, hidden_states)

        module.forward = forward
        patched.append(module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward
