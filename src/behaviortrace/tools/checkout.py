"""The repository checkout the tools run from: its Snakefile and config/ are not part of the installed package."""

from __future__ import annotations

from pathlib import Path

from behaviortrace.common.imports import PACKAGE_ROOT


def checkout() -> Path:
    """The root of the checkout the package is installed from (`pip install -e .`)."""
    root = PACKAGE_ROOT.parents[1]
    if not (root / "Snakefile").exists():
        raise RuntimeError(f"{PACKAGE_ROOT} is not inside a BehaviorTrace checkout; the tools run from one")
    return root
