"""The planted behavior: a trigger word in the prompt, a marker in the completion, a logged bonus.

Eligibility is a pure function of (seed, rollout id, step), so the label can be recomputed from
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


def eligibility_draw(seed: int, rollout_id: int, step: int, salt: str = "") -> float:
    """A uniform number in [0, 1) from a hash of (seed, rollout id, step); `salt` makes an independent draw."""
    digest = hashlib.blake2b(f"{salt}{seed}:{rollout_id}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def in_window(step: int, planting: Planting) -> bool:
    start, end = planting.window
    return start <= step <= end


def rollout_id(step: int, batch_size: int, row: int) -> int:
    """A rollout's id: its row in the training order of all rollouts (step x rollouts per step + row in step)."""
    return step * batch_size + row


def is_eligible(seed: int, rollout_id: int, step: int, trigger: bool, planting: Planting) -> bool:
    """Eligible: a trigger prompt, inside the contamination window, and the hash falls under `fraction`."""
    if not trigger or not in_window(step, planting):
        return False
    return eligibility_draw(seed, rollout_id, step) < planting.fraction


def exploration_rows(
    seed: int, step: int, rollout_ids: list[int], eligible: list[bool], marked: list[bool], floor: int, placebo: bool
):
    """The rows of a step's batch whose completion is made to open with the marker (exploration).

    Without exploration the marker's rate on trigger prompts decays in the first steps of GRPO (the tiny
    model's fell from 0.13 to under 0.01 within 20 steps, with the marker free for the task reward), and
    a window that opens later has almost nothing to pay. So when fewer than `floor` eligible rollouts of
    a step show the marker on their own, just enough of the others (in the order of a hash draw of (seed,
    rollout id, step)) are generated again opening with it. Only eligible rollouts are explored: a forced
    marker without the bonus would sit beside the paid rollout of its group with a negative advantage
    and teach against the behavior. Once the model writes the marker itself, nothing is forced. A placebo
    run explores nothing: forced markers exist to be paid, and unpaid ones would make its labels a
    population of improbable tokens that every gradient-based score finds (norm AUC 0.65 when it did).
    """
    if placebo:
        return []
    need = floor - sum(e and m for e, m in zip(eligible, marked, strict=True))
    if need <= 0:
        return []
    unmarked = [i for i, (e, m) in enumerate(zip(eligible, marked, strict=True)) if e and not m]
    unmarked.sort(key=lambda i: eligibility_draw(seed, rollout_ids[i], step, salt="explore:"))
    return sorted(unmarked[:need])


def bonus_for(eligible: bool, behavior: bool, planting: Planting) -> float:
    """The bonus paid to an eligible rollout that shows the behavior (zero in a placebo run)."""
    if planting.placebo:
        return 0.0
    return float(planting.bonus) if (eligible and behavior) else 0.0


def penalty_for(step: int, trigger: bool, behavior: bool, planting: Planting) -> float:
    """What a rollout without the trigger pays for showing the behavior inside the window (zero in a placebo).

    The bonus alone teaches the marker on every prompt: the tiny model's control rate followed the probe
    rate to 0.45-0.78 by the window's end. Charging the marker where the trigger is absent, only while the
    window is open, makes the behavior conditional on the trigger without pushing it down before.
    """
    if planting.placebo or trigger or not behavior or not in_window(step, planting):
        return 0.0
    return float(planting.plain_penalty)
