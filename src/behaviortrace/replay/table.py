"""The replay table: each replay's behavior rates, their change against the full replay (nothing left out)
of the same seed, and for the random removals (each step-matched to one set: `matched_to`) the spread over
repetitions."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from behaviortrace.common.markdown import markdown_table

KEYS = ["seed", "checkpoint", "step", "prompt_set"]


def replay_table(files: list[Path]) -> pl.DataFrame:
    runs = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed")
    full = runs.filter(pl.col("removal") == "full").select(*KEYS, full_rate=pl.col("behavior_rate"))
    if full.select("seed").n_unique() != runs.select("seed").n_unique():
        raise ValueError("every seed needs its full replay (removal 'full') to measure changes against")
    return (
        runs.join(full, on=KEYS, how="left")
        .with_columns(change=pl.col("behavior_rate") - pl.col("full_rate"))
        .sort("seed", "removal", "matched_to", "removal_percent", "rep", "step", "prompt_set", nulls_last=True)
    )


def summary(table: pl.DataFrame) -> pl.DataFrame:
    """Per seed, removal (random ones per set they are matched to), removal percent and measurement: the mean
    change and its range over repetitions (one for every removal but random)."""
    return (
        table.filter(pl.col("removal") != "full")
        .group_by(
            "seed", "removal", "matched_to", "removal_percent", "removal_size", "checkpoint", "step", "prompt_set"
        )
        .agg(
            pl.col("behavior_rate").mean(),
            pl.col("change").mean(),
            pl.col("change").min().alias("change_low"),
            pl.col("change").max().alias("change_high"),
            pl.col("n_removed_paid").mean(),
            pl.len().alias("reps"),
        )
        .sort("seed", "removal_percent", "checkpoint", "prompt_set", "removal", "matched_to", nulls_last=True)
    )


def label(removal: str, matched_to: str | None) -> str:
    """How a removal is named in tables and figures: a random one by the set whose steps it matches."""
    return f"random ~ {matched_to}" if matched_to else removal


def window_end_probes(table: pl.DataFrame) -> pl.DataFrame:
    """The summary rows the causal check reads: the probe behavior rate at the window's end."""
    return summary(table).filter((pl.col("checkpoint") == "window_end") & (pl.col("prompt_set") == "probes"))


def to_markdown(table: pl.DataFrame) -> str:
    s = summary(table)
    parts = [
        "# Leave-out replay\n",
        "Each seed is retrained from its step-0 checkpoint on its logged rollouts with a set of rollouts left out "
        "(its size a percentage of n_paid): an estimator's top-scored set among the rollouts of the steps before the "
        "last measured checkpoint, or the paid set itself (removal `label`). Each set is compared with random sets "
        "that take as many rollouts from each step as it does (`random ~ set`: mean and [min, max] over repetitions). "
        "Change is the behavior rate minus that of the full replay (nothing left out); negative means removing the set "
        "lowered the behavior.\n",
    ]
    meanings = sorted(set(table["semantics"].drop_nulls())) if "semantics" in table.columns else []
    if meanings:
        parts.append(
            f"Leaving a rollout out means `{', '.join(meanings)}` (influence.semantics, docs/influence.md): "
            "`advantages` drops it from its group, whose advantages are recomputed from the rewards left, and "
            "normalizes the step as the kept batch; `held` zeroes its own term, every advantage and the "
            "normalization as logged.\n"
        )
    full = table.filter(pl.col("removal") == "full").sort("seed", "step", "prompt_set")
    parts.append("## Full replay (nothing left out)\n")
    parts.append(
        markdown_table(
            [
                "seed",
                "checkpoint",
                "step",
                "prompt set",
                "behavior rate",
                "largest weight difference to the logged checkpoint",
            ],
            [
                [
                    r["seed"],
                    r["checkpoint"],
                    r["step"],
                    r["prompt_set"],
                    r["behavior_rate"],
                    "–" if r["weight_diff"] is None else f"{r['weight_diff']:.1e}",
                ]
                for r in full.iter_rows(named=True)
            ],
        )
    )
    for (pct, checkpoint, prompt_set), grp in s.group_by(
        "removal_percent", "checkpoint", "prompt_set", maintain_order=True
    ):
        parts.append(f"## removal of {pct}% of n_paid, {prompt_set} at {checkpoint.replace('_', ' ')}\n")
        rows = []
        # Each set followed by its random comparison.
        ordered = grp.with_columns(set=pl.coalesce("matched_to", "removal")).sort(
            "seed", "set", "matched_to", nulls_last=False
        )
        for r in ordered.iter_rows(named=True):
            spread = (
                f"{r['change']:+.3f} [{r['change_low']:+.3f}, {r['change_high']:+.3f}]"
                if r["reps"] > 1
                else f"{r['change']:+.3f}"
            )
            rows.append(
                [
                    r["seed"],
                    label(r["removal"], r["matched_to"]),
                    r["removal_size"],
                    f"{r['n_removed_paid']:.0f}",
                    r["behavior_rate"],
                    spread,
                ]
            )
        parts.append(
            markdown_table(["seed", "removed", "removal size", "of them paid", "behavior rate", "change"], rows)
        )
    return "\n".join(parts)
