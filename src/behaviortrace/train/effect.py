"""The measured effect: the forced target's mean log-prob on the probe prompts, measured at the weights of
every training step (before its update) and after the last, so that each step's measured change
f(w_{t+1}) - f(w_t) can be set against what the estimators' step scores predict (evaluate/effect.py).

f is exactly the function whose gradient the targets stage sketches as the forced target
(targets/gradients.py): the mean over probes of the summed log-probs of the marker tokens appended
after the probe, at the sampling temperature.
"""

from __future__ import annotations

from behaviortrace.common.device import autocast
from behaviortrace.gradients.logprob import forced_items, mean_logprob
from behaviortrace.model.prompt_format import prompt_ids
from behaviortrace.plant.markers import marker_token_ids

# Probes per forward pass: a forward of a few dozen short sequences per step, no backward.
EFFECT_CHUNK = 64


class ForcedTargetProbe:
    """Measures f(w) of the current weights without touching the gradient or the model's mode; in `device`'s
    precision (common/device.py: bf16 autocast for compute.dtype bfloat16, as training's forward passes; the
    influence's own dtype where it passes none)."""

    def __init__(
        self, tokenizer, probe_prompts: list[str], marker: str, temperature: float, device: dict | None = None
    ):
        if not probe_prompts:
            raise ValueError("no probe prompts to measure the forced target on (probes.n_probes)")
        self.tokenizer, self.temperature = tokenizer, temperature
        self.device = device or {"dtype": "float32"}
        # Formatted as in training (model/prompt_format.py: the tokenizer carries the run's prompt format).
        self.items = forced_items(prompt_ids(tokenizer, probe_prompts), marker_token_ids(tokenizer, marker))

    def __call__(self, model) -> float:
        with autocast(self.device):
            return mean_logprob(model, self.tokenizer, self.items, self.temperature, EFFECT_CHUNK)


def values_after_and_changes(target_logprob: list[float], final: float) -> tuple[list[float], list[float]]:
    """Per step: the value after its update (the next step's value; `final` after the last) and the change."""
    after = [*target_logprob[1:], final]
    return after, [a - b for a, b in zip(after, target_logprob, strict=True)]
