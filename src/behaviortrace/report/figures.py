"""Figures of a run (PNG): behavior rates over training, lift, within-group AUC, raw against matched metrics,
token alignment, the leave-out replay, and step scores against the measured behavior change.

Every panel plots one point per seed and draw with its 95% cluster-bootstrap interval, so the spread
between seeds and draws is visible rather than averaged away. Estimators are rows (one line each, however many
there are), so their names never overlap; every saved figure records the tick labels that collide, if any, in
its PNG metadata (`label_collisions`), which the tests read.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from behaviortrace.replay.table import label, window_end_probes  # noqa: E402
from behaviortrace.report.tables import PLANTED, judged  # noqa: E402

DPI = 110
ROW_INCHES = 0.26  # height of one estimator's row
log = logging.getLogger(__name__)
# Step scores drawn against the measured change (those in the run's effect_steps table).
EFFECT_FIGURE_ESTIMATORS = ["adam_tracin", "tracincp", "gas", "norm", "behavior_advantage"]
# Rollout-level metrics side by side: raw, then those the log-only controls cannot win by construction.
MATCHED_PANELS = [
    ("auroc", "AUROC, raw"),
    ("within_group_auc", "within-group AUC, raw"),
    ("advantage_matched_auc", "advantage-matched AUC"),
    ("behavior_matched_auc", "behavior-matched AUC"),
]


def label_collisions(fig) -> list[str]:
    """Pairs of tick labels of one axis whose drawn boxes overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            boxes = [t.get_window_extent(renderer) for t in labels]
            for (a, box_a), (b, box_b) in itertools.combinations(zip(labels, boxes, strict=True), 2):
                if box_a.overlaps(box_b):
                    found.append(f"{a.get_text()} / {b.get_text()}")
    return found


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    collisions = label_collisions(fig)
    if collisions:
        log.warning("%s: tick labels overlap: %s", path.name, "; ".join(collisions))
    fig.savefig(tmp, dpi=DPI, bbox_inches="tight", metadata={"Label collisions": "; ".join(collisions) or "none"})
    plt.close(fig)
    tmp.replace(path)


def behavior_rates(behavior: list[tuple[str, pl.DataFrame]], window: list[int], path: Path) -> None:
    """One panel per seed: probe and control behavior rate at each checkpoint, planted and placebo."""
    seeds = sorted({int(df["seed"][0]) for _, df in behavior})
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.2 * len(seeds), 3.2), sharey=True, squeeze=False)
    for ax, seed in zip(axes[0], seeds, strict=False):
        ax.axvspan(window[0], window[1] + 1, color="0.9", label="contamination window")
        for arm, df in behavior:
            if int(df["seed"][0]) != seed:
                continue
            style = "-" if arm == PLANTED else ":"
            for prompt_set, color in (("probes", "tab:red"), ("plain", "tab:blue")):
                d = df.filter(pl.col("prompt_set") == prompt_set).sort("step")
                ax.plot(
                    d["step"], d["behavior_rate"], style, marker="o", ms=3, color=color, label=f"{prompt_set} ({arm})"
                )
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("training step (checkpoint)")
        ax.set_ylim(-0.03, 1.03)
    axes[0][0].set_ylabel("behavior rate")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    _save(fig, path)


def _rows_figure(panels: int, rows: int, width: float = 4.6):
    """A figure of `panels` side by side, each with `rows` estimator rows (top to bottom), sharing the rows."""
    fig, axes = plt.subplots(
        1, panels, figsize=(width * panels, ROW_INCHES * max(rows, 4) + 1.3), sharey=True, squeeze=False
    )
    return fig, axes


def _estimator_points(ax, rows: pl.DataFrame, estimators: list[str]) -> None:
    """Per estimator (a row, top to bottom): one point per seed (colour) and draw (offset), with its interval."""
    seeds = sorted(rows["seed"].unique().to_list())
    draws = sorted(rows["draw"].unique().to_list())
    colors = plt.get_cmap("tab10")
    width = 0.8 / max(1, len(seeds) * len(draws))
    for i, est in enumerate(estimators):
        for j, seed in enumerate(seeds):
            for k, draw in enumerate(draws):
                r = rows.filter((pl.col("estimator") == est) & (pl.col("seed") == seed) & (pl.col("draw") == draw))
                if not r.height:
                    continue
                y = i - 0.4 + width * (j * len(draws) + k + 0.5)
                v, lo, hi = r["value"][0], r["ci_low"][0], r["ci_high"][0]
                ax.errorbar(
                    [v],
                    [y],
                    xerr=[[max(v - lo, 0)], [max(hi - v, 0)]],
                    fmt="o",
                    ms=3,
                    color=colors(j),
                    label=f"seed {seed}" if i == 0 and k == 0 else None,
                )
    ax.set_yticks(range(len(estimators)), estimators)
    ax.set_ylim(len(estimators) - 0.5, -0.5)


def _estimators(rows: pl.DataFrame) -> list[str]:
    order = [
        "gas",
        "tracincp",
        "adam_tracin",
        "trak",
        "token_alignment",
        "norm",
        "fluency",
        "random",
        "advantage",
        "reward",
        "behavior",
        "behavior_advantage",
    ]
    names = rows["estimator"].unique().to_list()
    return [e for e in order if e in names] + sorted(set(names) - set(order))


def lift(metrics: pl.DataFrame, target: str, path: Path) -> None:
    """Lift at step and rollout level, with chance (1) and each seed's ceiling marked."""
    rows = judged(metrics, target)
    lifts = rows.filter(pl.col("metric") == "lift")
    ests = _estimators(lifts)
    fig, axes = _rows_figure(2, len(ests), 6)
    for ax, level in zip(axes[0], ("step", "rollout"), strict=False):
        lv = lifts.filter(pl.col("level") == level)
        _estimator_points(ax, lv, ests)
        ax.axvline(1.0, color="k", lw=1, ls="--", label="chance (lift 1)")
        ceil = rows.filter((pl.col("level") == level) & (pl.col("metric") == "ceiling_lift"))
        for j, (seed, grp) in enumerate(sorted(ceil.group_by("seed"), key=lambda g: g[0])):
            ax.axvline(
                float(grp["value"].mean()),
                color=plt.get_cmap("tab10")(j),
                lw=1,
                ls=":",
                label=f"ceiling, seed {seed[0]}",
            )
        band = rows.filter((pl.col("level") == level) & (pl.col("metric") == "lift_chance_band"))
        if band.height:
            ax.axvspan(
                float(band["ci_low"].min()),
                float(band["ci_high"].max()),
                color="0.85",
                zorder=0,
                label="random-ordering band",
            )
        ax.set_title(f"{level} level")
        ax.set_xlabel("lift (precision at n_paid / chance)")
    axes[0][1].legend(fontsize=7, loc="lower right")
    _save(fig, path)


def within_group_auc(metrics: pl.DataFrame, target: str, path: Path) -> None:
    rows = judged(metrics, target).filter(pl.col("level") == "rollout")
    panels = (("within_group_auc", "raw"), ("within_group_auc_fluency_resid", "fluency-residualized"))
    ests = _estimators(rows.filter(pl.col("metric").is_in([m for m, _ in panels])))
    fig, axes = _rows_figure(2, len(ests), 6)
    for ax, (metric, title) in zip(axes[0], panels, strict=False):
        _estimator_points(ax, rows.filter(pl.col("metric") == metric), ests)
        ax.axvline(0.5, color="k", lw=1, ls="--", label="chance (0.5)")
        ax.set_title(f"within-group AUC, {title}")
        ax.set_xlabel("within-group AUC")
    axes[0][1].legend(fontsize=7, loc="lower right")
    _save(fig, path)


def matched_metrics(metrics: pl.DataFrame, target: str, path: Path) -> None:
    """Raw rollout-level metrics beside the matched ones, per estimator and seed: a control that reads the
    reward log wins the raw ones by construction and sits at chance on the matched metric it is matched on."""
    rows = judged(metrics, target).filter(pl.col("level") == "rollout")
    ests = _estimators(rows.filter(pl.col("metric").is_in([m for m, _ in MATCHED_PANELS])))
    fig, axes = _rows_figure(len(MATCHED_PANELS), len(ests))
    for ax, (metric, title) in zip(axes[0], MATCHED_PANELS, strict=True):
        _estimator_points(ax, rows.filter(pl.col("metric") == metric), ests)
        ax.axvline(0.5, color="k", lw=1, ls="--", label="chance (0.5)")
        ax.set_title(title)
        ax.set_xlabel("AUC")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    _save(fig, path)


def token_alignment(metrics: pl.DataFrame, path: Path) -> None:
    """Behavior-token cosine with each target kind against the null positions, per seed and draw."""
    rows = metrics.filter((pl.col("arm") == PLANTED) & (pl.col("level") == "token") & (pl.col("stratum") == "all"))
    kinds = sorted(rows["target"].unique().to_list()) or ["in_context"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=False):
        k = rows.filter(pl.col("target") == kind)
        labels = []
        for i, ((seed, draw), grp) in enumerate(sorted(k.group_by(["seed", "draw"]), key=lambda g: g[0])):
            labels.append(f"s{seed} d{draw}")
            for off, metric, color in ((-0.15, "token_cosine", "tab:red"), (0.15, "token_cosine_null", "0.5")):
                r = grp.filter(pl.col("metric") == metric)
                v, lo, hi = r["value"][0], r["ci_low"][0], r["ci_high"][0]
                ax.bar(
                    i + off,
                    v,
                    width=0.3,
                    color=color,
                    yerr=[[max(v - lo, 0)], [max(hi - v, 0)]],
                    label=("behavior tokens" if metric == "token_cosine" else "null positions") if i == 0 else None,
                )
        ax.set_xticks(range(len(labels)), labels)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_title(f"{kind} target")
    axes[0][0].set_ylabel("mean cosine with the target")
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


def replay(table: pl.DataFrame, path: Path) -> None:
    """Change in the probe behavior rate at the window's end when each set is left out, per seed, each beside
    the random sets step-matched to it."""
    s = window_end_probes(table)
    pcts = sorted(s["removal_percent"].unique().to_list()) or [100]
    names = ["label"] + sorted(set(s["removal"].to_list()) - {"label", "random"})
    fig, axes = _rows_figure(len(pcts), 2 * len(names), 6)
    for ax, pct in zip(axes[0], pcts, strict=False):
        d = s.filter(pl.col("removal_percent") == pct)
        d = d.with_columns(name=pl.Series([label(*r) for r in d.select("removal", "matched_to").iter_rows()]))
        sets = ["label"] + sorted(set(d["removal"].to_list()) - {"label", "random"})
        removals = [n for m in sets for n in (m, label("random", m))]
        seeds = sorted(d["seed"].unique().to_list())
        width = 0.8 / max(1, len(seeds))
        for j, seed in enumerate(seeds):
            for i, removal in enumerate(removals):
                r = d.filter((pl.col("seed") == seed) & (pl.col("name") == removal))
                if not r.height:
                    continue
                v, lo, hi = r["change"][0], r["change_low"][0], r["change_high"][0]
                ax.errorbar(
                    [v],
                    [i - 0.4 + width * (j + 0.5)],
                    xerr=[[v - lo], [hi - v]],
                    fmt="o",
                    ms=5,
                    color=plt.get_cmap("tab10")(j),
                    label=f"seed {seed}" if i == 0 else None,
                )
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(removals)), removals)
        ax.set_ylim(len(removals) - 0.5, -0.5)
        ax.set_xlabel("change in probe behavior rate at the window's end")
        ax.set_title(f"{pct}% of n_paid left out")
        ax.legend(fontsize=7)
    _save(fig, path)


def effect_vs_labels(metrics: pl.DataFrame, target: str, path: Path) -> None:
    """Each estimator judged two ways on the same step scores: step-level lift against the planted label,
    and Spearman correlation with each step's measured behavior change (dotted: the label's own, the
    number of paid rollouts per step)."""
    rows = judged(metrics, target)
    lift_rows = rows.filter((pl.col("level") == "step") & (pl.col("metric") == "lift"))
    effect = rows.filter((pl.col("level") == "effect") & (pl.col("metric") == "effect_spearman"))
    ests = _estimators(lift_rows)
    fig, axes = _rows_figure(2, len(ests), 6)
    _estimator_points(axes[0][0], lift_rows, ests)
    axes[0][0].axvline(1.0, color="k", lw=1, ls="--", label="chance (lift 1)")
    axes[0][0].set_title("labels: step-level lift")
    axes[0][0].set_xlabel("lift (precision at n_paid / chance)")
    _estimator_points(axes[0][1], effect.filter(pl.col("estimator").is_in(ests)), ests)
    axes[0][1].axvline(0.0, color="k", lw=1, ls="--", label="no tracking")
    labels = effect.filter(pl.col("estimator") == "label")
    for j, (seed, grp) in enumerate(sorted(labels.group_by("seed"), key=lambda g: g[0])):
        axes[0][1].axvline(
            float(grp["value"].mean()),
            color=plt.get_cmap("tab10")(j),
            lw=1,
            ls=":",
            label=f"paid per step, seed {seed[0]}",
        )
    axes[0][1].set_title("measured effect: Spearman with each step's change")
    axes[0][1].set_xlabel("Spearman correlation")
    axes[0][1].legend(fontsize=7, loc="lower right")
    _save(fig, path)


def effect_tracking(table: pl.DataFrame, window: list[int], path: Path, estimators: list[str]) -> None:
    """Per seed: the measured change of the forced target at each step, the labeled rollouts of each
    step, and estimators' step scores scaled to their largest magnitude, on one step axis: where the label
    and the measured effect disagree, the panels show at which steps."""
    seeds = sorted(table["seed"].unique().to_list())
    fig, axes = plt.subplots(3, len(seeds), figsize=(4.6 * len(seeds), 7.5), sharex=True, squeeze=False)
    for col, seed in enumerate(seeds):
        d = table.filter(pl.col("seed") == seed)
        steps = d.unique("step").sort("step")
        for ax in axes[:, col]:
            ax.axvspan(window[0] - 0.5, window[1] + 0.5, color="0.92")
        axes[0, col].bar(steps["step"], steps["target_change"], width=1.0, color="k")
        axes[0, col].set_title(f"seed {seed}")
        axes[1, col].bar(steps["step"], steps["n_paid"], width=1.0, color="tab:red")
        measured = steps["target_change"] / max(float(steps["target_change"].abs().max()), 1e-12)
        axes[2, col].plot(steps["step"], measured, color="k", lw=1.4, label="measured change")
        for i, est in enumerate(estimators):
            e = d.filter(pl.col("estimator") == est).sort("step")
            if not e.height:
                continue
            scale = max(float(e["score"].abs().max()), 1e-12)
            label = f"{est} ({e['target'][0]})"
            axes[2, col].plot(e["step"], e["score"] / scale, lw=0.8, color=plt.get_cmap("tab10")(i), label=label)
        axes[2, col].set_xlabel("training step")
    axes[0, 0].set_ylabel("measured change of the forced\ntarget's log-prob (f(w_t+1) - f(w_t))")
    axes[1, 0].set_ylabel("labeled rollouts\nin the step")
    axes[2, 0].set_ylabel("step score / its max |score|")
    axes[2, -1].legend(fontsize=7, loc="lower right")
    _save(fig, path)


def write_figures(
    metrics: pl.DataFrame,
    behavior: list[tuple[str, pl.DataFrame]],
    replay_table: pl.DataFrame,
    window: list[int],
    target: str,
    outputs: dict[str, Path],
    effect_steps: pl.DataFrame | None = None,
    effect_target_kind: str = "forced",
) -> None:
    behavior_rates(behavior, window, outputs["behavior_rates"])
    if effect_steps is not None:
        effect_tracking(effect_steps, window, outputs["effect_tracking"], EFFECT_FIGURE_ESTIMATORS)
    effect_vs_labels(metrics, effect_target_kind, outputs["effect_vs_labels"])
    replay(replay_table, outputs["replay"])
    lift(metrics, target, outputs["lift"])
    within_group_auc(metrics, target, outputs["within_group_auc"])
    matched_metrics(metrics, target, outputs["matched_metrics"])
    token_alignment(metrics, outputs["token_alignment"])
