"""The influence figure: each estimator's rollout score against the exact influence, one row of panels per
planted seed (rollouts of the steps before T; ground-truth rollouts in red). The x axis is symmetric-log:
most rollouts move f by almost nothing and a few by a lot."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from behaviortrace.influence.table import spearman  # noqa: E402

DPI = 110


def influence_figure(
    influence: dict[int, Path], rollouts: dict[int, Path], scores: dict[tuple[int, str, str], Path], path: Path
) -> None:
    """`scores`: rollout score files by (seed, estimator, target); one column per (estimator, target)."""
    seeds = sorted(influence)
    columns = sorted({(e, t) for _, e, t in scores}, key=lambda k: (k[1] == "none", k[0]))
    fig, axes = plt.subplots(
        len(seeds), len(columns), figsize=(2.6 * len(columns), 2.4 * len(seeds)), squeeze=False, sharex="row"
    )
    for row, seed in enumerate(seeds):
        infl = pl.read_parquet(influence[seed])
        log = pl.read_parquet(rollouts[seed]).select("rollout_id", "boosted")
        base = infl.join(log, on="rollout_id", how="left")
        scale = float(np.quantile(np.abs(base["influence"].to_numpy()), 0.5)) or 1e-12
        for col, (estimator, target) in enumerate(columns):
            ax = axes[row][col]
            frame = base.join(
                pl.read_parquet(scores[(seed, estimator, target)]).select("rollout_id", "score"),
                on="rollout_id",
                how="left",
            )
            x, y, gt = frame["influence"].to_numpy(), frame["score"].to_numpy(), frame["boosted"].to_numpy()
            ax.scatter(x[~gt], y[~gt], s=2, alpha=0.3, color="0.4", rasterized=True, label="other")
            ax.scatter(x[gt], y[gt], s=3, alpha=0.5, color="tab:red", rasterized=True, label="GT (boosted)")
            ax.set_xscale("symlog", linthresh=scale)
            top = 10.0 ** np.ceil(np.log10(max(float(np.abs(x).max()), scale)))
            ax.set_xticks(
                [-top, -scale, 0, scale, top], [f"{-top:.0e}", f"{-scale:.0e}", "0", f"{scale:.0e}", f"{top:.0e}"]
            )
            ax.axvline(0, color="0.8", lw=0.6, zorder=0)
            ax.set_title(
                f"{estimator} ({target})\nSpearman {spearman(y, x):+.2f}"
                if target != "none"
                else f"{estimator}\nSpearman {spearman(y, x):+.2f}",
                fontsize=8,
            )
            ax.tick_params(labelsize=6)
            if col == 0:
                ax.set_ylabel(f"seed {seed}\nscore", fontsize=8)
            if row == len(seeds) - 1:
                ax.set_xlabel("exact influence I", fontsize=8)
    axes[0][-1].legend(fontsize=6, loc="best", markerscale=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
