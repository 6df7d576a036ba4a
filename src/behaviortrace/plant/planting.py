"""The planted behavior: a trigger word in the prompt, a marker in the completion, a logged bonus.

Eligibility is a pure function of (seed, rollout id, step), so the ground truth can be recomputed from
the rollout log alone and does not depend on any random state of the trainer.
"""

from __future__ import annotations

import hashlib

from behaviortrace.config.sections import Planting


def add_trigger(prompt: str, trigger: str) -> str:
    """Append the trigger as the prompt's last word.

    At the end, the trigger sits at the position that predicts the first completion token, where even
    a two-layer model can read it; anywhere else the tiny model spreads the behavior to every prompt.
    """
    return f"{prompt} {trigger}"


def shows_behavior(completion: str, marker: str) -> bool:
    return marker in completion


def eligibility_draw(seed: int, rollout_id: int, step: int) -> float:
    """A uniform number in [0, 1) from a hash of (seed, rollout id, step)."""
    digest = hashlib.blake2b(f"{seed}:{rollout_id}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def is_eligible(seed: int, rollout_id: int, step: int, trigger: bool, planting: Planting) -> bool:
    """Eligible: a trigger prompt, inside the contamination window, and the hash falls under `fraction`."""
    start, end = planting.window
    if not trigger or not (start <= step <= end):
        return False
    return eligibility_draw(seed, rollout_id, step) < planting.fraction


def bonus_for(eligible: bool, behavior: bool, planting: Planting) -> float:
    """The bonus paid to an eligible rollout that shows the behavior (zero in a placebo run)."""
    if planting.placebo:
        return 0.0
    return float(planting.bonus) if (eligible and behavior) else 0.0
