"""Refuse a job whose files cannot fit on its disk before it starts the work that writes them, rather than
failing hours in with a full disk (and possibly a half-written checkpoint)."""

from __future__ import annotations

import shutil
from pathlib import Path


def require_free_disk(folder: Path, need: int, what: str, keys: str) -> None:
    """Raise unless the disk holding `folder` (or its nearest existing parent) has `need` bytes free."""
    folder = Path(folder).absolute()
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if need > free:
        raise OSError(
            f"{what} need {need / 1e9:,.1f} GB on the disk of {folder}, which has {free / 1e9:,.1f} GB free; "
            f"free some space, or change {keys}"
        )
