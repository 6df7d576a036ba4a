"""Which steps get a checkpoint, and how to tell a finished checkpoint from a half-written one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

COMPLETE = "CHECKPOINT_COMPLETE"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def saved_steps(steps: int, save_every: int, window_end: int) -> list[int]:
    """Step 0, every `save_every` steps, the end of the contamination window, and the end of training.

    A checkpoint named N holds the weights after N optimizer steps, i.e. the policy that generated the
    rollouts of step N.
    """
    marks = {0, steps, min(window_end + 1, steps)}
    marks.update(range(0, steps + 1, save_every))
    return sorted(marks)


def checkpoint_for_step(step: int, saved: list[int]) -> int:
    """The nearest saved checkpoint at or before `step`."""
    return max(s for s in saved if s <= step)


def checkpoint_dir(train_dir: Path, step: int) -> Path:
    return Path(train_dir) / f"checkpoint-{step}"


def mark_complete(path: Path) -> None:
    (Path(path) / COMPLETE).write_text("ok\n")


def complete_checkpoints(train_dir: Path) -> dict[int, Path]:
    """Finished checkpoints by step; unfinished ones (killed mid-save) are removed."""
    found = {}
    train_dir = Path(train_dir)
    if not train_dir.exists():
        return found
    for path in train_dir.iterdir():
        m = _NAME.match(path.name)
        if m is None or not path.is_dir():
            continue
        if (path / COMPLETE).exists():
            found[int(m.group(1))] = path
        else:
            shutil.rmtree(path)
    return dict(sorted(found.items()))
