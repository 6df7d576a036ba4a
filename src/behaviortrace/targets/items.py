"""A target's items, kept beside its sketch so that an estimator that needs the model can take the target's
gradient itself (score/model_run.py): for the in-context target, each sampled completion that shows the marker, with
its prompt and the marker's positions, at each analysis checkpoint (a target of your own, api.py, keeps its own)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

ITEMS_FILE = "{kind}_items.parquet"
SCHEMA = {
    "step": pl.Int64,
    "prompt_ids": pl.List(pl.Int64),
    "completion_ids": pl.List(pl.Int64),
    "positions": pl.List(pl.Int64),
}


def save_items(items_by_step: dict[int, list], store: Path, kind: str = "in_context") -> None:
    """Items (prompt ids, completion ids, marker positions) by analysis checkpoint, into a target store folder."""
    rows = [
        {"step": step, "prompt_ids": p, "completion_ids": c, "positions": pos}
        for step, items in items_by_step.items()
        for p, c, pos in items
    ]
    pl.DataFrame(rows, schema=SCHEMA).write_parquet(Path(store) / ITEMS_FILE.format(kind=kind))


def load_items(store: Path, steps: list[int], kind: str = "in_context") -> dict[int, list]:
    path = Path(store) / ITEMS_FILE.format(kind=kind)
    if not path.exists():
        raise FileNotFoundError(f"{path}: this target store has no {kind} items; rerun its targets job")
    saved = pl.read_parquet(path)
    return {
        step: [
            (r["prompt_ids"], r["completion_ids"], r["positions"])
            for r in saved.filter(pl.col("step") == step).to_dicts()
        ]
        for step in steps
    }
