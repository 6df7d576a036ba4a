"""What the exact influence holds: its saved training states on disk and one segment of them in memory, each
checked before the sweep starts."""

from __future__ import annotations

from pathlib import Path

# The influence job's saved training states, beside its outputs while it runs.
STATES = ".states"


def state_bytes(params: int, dtype: str) -> int:
    """One saved training state: the weights and Adam's two moments, 3 numbers per trained parameter in `dtype`."""
    return 3 * params * (8 if dtype == "float64" else 4)


def check_disk(model, end: int, keep: set[int], inf, folder: Path) -> None:
    """The forward sweep's states on disk, every segment start and every step in `keep`, 3P numbers each (weights
    and Adam's two moments, in `influence.dtype`): refused before the sweep where the disk cannot hold them."""
    from behaviortrace.common.disk import require_free_disk
    from behaviortrace.influence.metagradient import segment_starts

    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    states = len(set(segment_starts(end, max(1, inf.segment_steps))) | keep)
    need = states * state_bytes(params, inf.dtype)
    what = f"the exact influence's {states} saved training states (3 x {params:,} numbers each, {inf.dtype})"
    keys = (
        "influence.segment_steps (fewer states, more recomputation), influence.leave_step_out or influence.fd_rollouts"
    )
    require_free_disk(folder, need, what, keys)


def check_memory(model, end: int, inf) -> None:
    """The backward sweep holds one segment's states in host memory, min(T, segment_steps) of them, 3P numbers
    each: refused before the sweep where this job cannot take them (with the model already loaded)."""
    from behaviortrace.common.memory import require_memory

    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    states = min(end, max(1, inf.segment_steps))
    need = states * state_bytes(params, inf.dtype)
    what = f"the exact influence's {states} training states of a segment (3 x {params:,} numbers each, {inf.dtype})"
    require_memory(need, what, "influence.segment_steps (fewer states in memory, more on disk)")
