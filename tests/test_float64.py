"""A model loaded in float64 computes in float64 throughout (model/precision.py), whatever its norm class: the exact
influence's finite-difference checks have no float32 noise floor, and nothing in the code lists norm classes."""

from __future__ import annotations

import copy

import pytest
import torch

from behaviortrace.common.device import resolve
from behaviortrace.config.sections import Compute
from behaviortrace.gradients.batch import completion_logits, pad_batch
from behaviortrace.model import families, models
from behaviortrace.model.precision import Float64Mode, keep_float64


def _rms(module, x, offset=0.0):
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return (offset + module.weight) * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _layer_norm(module, x):
    centered = x - x.mean(-1, keepdim=True)
    return module.weight * centered / torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + module.eps) + module.bias


# Each family's norm class and its formula, written out here (the code under test names none of them).
NORMS = {
    "qwen2": ("Qwen2RMSNorm", _rms),
    "llama": ("LlamaRMSNorm", _rms),
    "granite": ("GraniteRMSNorm", _rms),
    "olmo2": ("Olmo2RMSNorm", _rms),
    "phi3": ("Phi3RMSNorm", _rms),
    "gemma2": ("Gemma2RMSNorm", lambda m, x: _rms(m, x, 1.0)),  # (1 + w)
    "gemma3": ("Gemma3RMSNorm", lambda m, x: _rms(m, x, 1.0)),
    "falcon": ("LayerNorm", _layer_norm),
    "gpt2": ("LayerNorm", _layer_norm),
}


@pytest.mark.parametrize("family", sorted(NORMS))
def test_a_norm_runs_its_own_forward_in_float64(family):
    """Each family's norm module, in float64 with random weights, under Float64Mode equals its formula computed
    here in float64 to 1e-13; without the mode the RMS norms (which cast to float32) are off by float32's rounding."""
    name, formula = NORMS[family]
    f = families.families()[family]
    model = families.build_model(f, families.build_tokenizer(f, "frobnitz", "QZXBT")).double()
    norm = next(m for m in model.modules() if type(m).__name__ == name)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(3, 5, norm.weight.shape[0], generator=gen, dtype=torch.float64) * 3
    with torch.no_grad():
        want = formula(norm, x)
        with Float64Mode(name):
            got = norm(x)
        plain = float((norm(x) - want).abs().max()) / float(want.abs().max())
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) <= 1e-13 * float(want.abs().max())
    assert plain > 1e-9 if "RMSNorm" in name else plain <= 1e-13, plain


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    """Gemma-2 saved small: eager attention, whose softmax runs in float32 (dtype=torch.float32) on padding rows
    masked with float64's most negative number."""
    folder = tmp_path_factory.mktemp("gemma2")
    families.save_family("gemma2", folder, "frobnitz", "QZXBT")
    return folder


def _logits(model, pad_id):
    batch = pad_batch([[5, 6, 7], [8, 9, 10, 11, 12]], [[13, 14], [15, 16, 17]], pad_id)
    return completion_logits(model, batch)


def test_a_model_loaded_in_float64_computes_in_float64_throughout(gemma2):
    cpu = resolve(Compute(device="cpu", dtype="float32"))
    model32, tokenizer = models.load(gemma2, cpu)
    model64, _ = models.load(gemma2, {**cpu, "dtype": "float64", "torch_dtype": torch.float64})
    want, got = _logits(model32, tokenizer.pad_token_id), _logits(model64, tokenizer.pad_token_id)
    assert got.dtype == torch.float64 and torch.isfinite(got).all()
    assert torch.allclose(got.float(), want, rtol=1e-4, atol=1e-4)
    # The same weights cast to float64 without the mode: the fully masked padding rows' float32 softmax is NaN.
    assert torch.isnan(_logits(model32.double(), tokenizer.pad_token_id)).any()
    # A deep copy computes with its own weights, still in float64.
    twin = copy.deepcopy(model64)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.01)
    moved = _logits(twin, tokenizer.pad_token_id)
    assert torch.isfinite(moved).all() and not torch.allclose(moved, got)
    assert torch.equal(_logits(model64, tokenizer.pad_token_id), got)


class _HalvesItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))

    def forward(self, x):
        return (x * self.weight).to(torch.bfloat16).double()


def test_a_cast_below_float64_with_a_gradient_stops_the_forward():
    module = keep_float64(_HalvesItsInput())
    with pytest.raises(
        FloatingPointError, match=r"TensorBase.to returned torch.bfloat16 with a gradient inside _HalvesItsInput"
    ):
        module(torch.ones(2, 4, dtype=torch.float64))
    with torch.no_grad():  # without a gradient the value is a constant of the check: allowed
        assert module(torch.ones(2, 4, dtype=torch.float64)).dtype == torch.float64
