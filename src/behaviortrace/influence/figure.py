"""The influence figure: how well each estimator's rollout scores track the exact influence I. One row per
estimator (planted seeds, the rollouts before the influence checkpoint, targeted estimators with the checklist's
`effect_target_kind`): its Spearman correlation with I on every seed (colour) and draw (marker), their mean and
range, and a line at 0. The planted label (the paid rollouts) get the last row, one point per seed. The checklist
judges the LDS (influence table), which asks what removing data does; this shows the ranking behind it."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

DPI = 110
LABELS = "label"
DRAW_MARKERS = "osD^v"


def _draw_style(draws: list[int], draw: int | None) -> dict:
    """Draw 0 (and the label, which have no draw) filled circles; later draws hollow markers of other shapes."""
    k = draws.index(draw) if draw in draws else 0
    return {"marker": DRAW_MARKERS[k % len(DRAW_MARKERS)], "ms": 5, "mfc": None if k == 0 else "none"}


def spearman_rows(table: pl.DataFrame, target: str) -> pl.DataFrame:
    """The influence table's rows the figure draws: planted arm, rollout level, stratum all, Spearman with I;
    targeted estimators with `target`, controls and the label without one."""
    return table.filter(
        (pl.col("arm") == "planted")
        & (pl.col("level") == "rollout")
        & (pl.col("stratum") == "all")
        & (pl.col("metric") == "spearman")
        & pl.col("target").is_in([target, "none"])
    )


def influence_figure(table: pl.DataFrame, target: str, path: Path, log_only=()) -> None:
    """`table`: the influence table (influence/table.py); `log_only`: the log-only controls, whose names are drawn
    in grey."""
    rows = spearman_rows(table, target)
    means = rows.group_by("estimator").agg(pl.col("value").fill_nan(None).mean())
    means = means.sort(["value", "estimator"], descending=[True, False], nulls_last=True)["estimator"].to_list()
    names = [e for e in means if e != LABELS] + [e for e in means if e == LABELS]
    seeds = sorted(rows["seed"].unique())
    draws = sorted(rows["draw"].drop_nulls().unique())
    colors = plt.get_cmap("tab10")

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.4 * len(names)))
    ax.axvline(0, color="k", lw=0.8)
    for i, name in enumerate(names):
        own = rows.filter(pl.col("estimator") == name)
        for r in own.iter_rows(named=True):
            j = seeds.index(r["seed"])
            dy = 0.25 * (2 * j / (len(seeds) - 1) - 1) if len(seeds) > 1 else 0.0  # each seed on its own line
            ax.plot(r["value"], i + dy, color=colors(j), alpha=0.85, ls="", **_draw_style(draws, r["draw"]))
        values = own["value"].drop_nans()
        if len(values):
            ax.plot([values.min(), values.max()], [i, i], color="k", lw=1.2, zorder=3)
            ax.plot(values.mean(), i, "|", ms=14, mew=2.5, color="k", zorder=4)
    ax.set_yticks(range(len(names)), [f"{n}\n(paid rollouts)" if n == LABELS else n for n in names])
    for tick, name in zip(ax.get_yticklabels(), names, strict=True):
        tick.set_color("0.45" if name in log_only else "k")
    ax.set_ylim(len(names) - 0.5, -0.5)
    values = rows["value"].drop_nans()
    low, high = min(values.min() or 0.0, 0.0), max(values.max() or 0.0, 0.0)
    pad = 0.08 * (high - low) or 0.1
    ax.set_xlim(max(low - pad, -1.05), min(high + pad, 1.05))
    ax.set_xlabel(f"Spearman correlation of rollout scores with the exact influence I (targets: {target})")
    ax.grid(axis="x", color="0.9", lw=0.6)
    ax.set_axisbelow(True)

    handles = [plt.Line2D([], [], ls="", marker="o", color=colors(j), label=f"seed {s}") for j, s in enumerate(seeds)]
    handles += [plt.Line2D([], [], ls="", color="0.3", label=f"draw {d}", **_draw_style(draws, d)) for d in draws]
    handles += [
        plt.Line2D([], [], color="k", marker="|", ms=10, mew=2.5, lw=1.2, label="mean, range"),
        *ax.get_legend_handles_labels()[0],
    ]
    if log_only:
        handles.append(plt.Line2D([], [], ls="", label="grey names:\nlog-only controls"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
