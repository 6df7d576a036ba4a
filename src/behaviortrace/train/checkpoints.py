"""Which steps get a checkpoint, how to tell a finished checkpoint from a half-written one, and the manifest
(`checkpoints.json`) through which every later stage finds a seed's checkpoints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from behaviortrace.common.disk import require_free_disk
from behaviortrace.common.io import atomic_write_text
from behaviortrace.config.sections import Config

COMPLETE = "CHECKPOINT_COMPLETE"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def saved_steps(steps: int, save_every: int, window_end: int) -> list[int]:
    """Step 0, every `save_every` steps, the checkpoint that closes the contamination window (`window_end`,
    Planting.end_checkpoint), and the end of training.

    A checkpoint named N holds the weights after N optimizer steps, i.e. the policy that generated the
    rollouts of step N.
    """
    marks = {0, steps, window_end}
    marks.update(range(0, steps + 1, save_every))
    return sorted(marks)


def config_problems(cfg) -> list[str]:
    """Analysis checkpoints must be among the saved ones (a config rule; `cfg` is a typed Config)."""
    wanted = cfg.targets.checkpoints
    if wanted == "all":
        return []
    saved = saved_steps(cfg.grpo.steps, cfg.grpo.save_every, cfg.planting.end_checkpoint(cfg.grpo.steps))
    missing = sorted(set(wanted) - set(saved))
    if not missing:
        return []
    return [
        f"config key targets.checkpoints = {wanted}: steps {missing} have no saved checkpoint (saved steps: {saved})"
    ]


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


def write_manifest(path: Path, checkpoints: dict[int, Path], adam: dict[int, Path]) -> None:
    """The manifest of a finished training job: each saved checkpoint by step, with AdamW's second moment saved
    right after that step's update where there is one (train/optimizer_log.py)."""
    entries = [
        {"step": s, "path": str(p), "adam": str(adam[s]) if s in adam else None} for s, p in sorted(checkpoints.items())
    ]
    atomic_write_text(json.dumps({"checkpoints": entries}, indent=1) + "\n", path)


def read_manifest(path: Path) -> tuple[dict[int, Path], dict[int, Path]]:
    """The checkpoints a training job saved, by step in ascending order, and the AdamW second moments saved
    with them (the last step has none)."""
    entries = json.loads(Path(path).read_text())["checkpoints"]
    checkpoints = {int(e["step"]): Path(e["path"]) for e in sorted(entries, key=lambda e: e["step"])}
    return checkpoints, {int(e["step"]): Path(e["adam"]) for e in entries if e.get("adam")}


def check_disk(cfg: Config, model, train_dir: Path) -> None:
    """Every checkpoint still to save holds the trainable weights in float32 and AdamW's second moment (8 bytes per
    parameter), and the newest also the whole optimizer state (8 more, twice while it is replaced): refused before
    the first step where the disk cannot hold them."""
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    done = complete_checkpoints(train_dir) if train_dir.exists() else {}
    saves = saved_steps(cfg.grpo.steps, cfg.grpo.save_every, cfg.planting.end_checkpoint(cfg.grpo.steps))
    left = sum(s not in done for s in saves)
    need = 8 * params * left + 16 * params
    what = f"{left} checkpoints of {params:,} trainable parameters (8 bytes each per checkpoint, 16 for the optimizer)"
    require_free_disk(train_dir, need, what, "grpo.save_every (fewer checkpoints)")
