"""f, the function the exact influence differentiates: the forced target's mean log-prob on the probe prompts.

It is the measured effect's function (train/effect.py's ForcedTargetProbe, which builds the probe items)
and the forced target's (targets/gradients.py), so that I_z, the measured per-step effect and the forced
target gradients all speak of one quantity.
"""

from __future__ import annotations

import torch

from behaviortrace.gradients.logprob import logprob_gradient
from behaviortrace.train.effect import EFFECT_CHUNK, ForcedTargetProbe


class ForcedTarget:
    def __init__(self, probe: ForcedTargetProbe):
        self.probe = probe

    def value(self, model) -> float:
        return self.probe(model)

    def gradient(self, model) -> dict[str, torch.Tensor]:
        """d f / d w by parameter name; the model's train/eval mode is kept."""
        was_training = model.training
        p = self.probe
        grads = logprob_gradient(model, p.tokenizer, p.items, p.temperature, EFFECT_CHUNK)
        model.train(was_training)
        return grads
