"""The answer on one screen: per row, how well its scores predict what removing data does (its agreement with
the exact influence over every rollout and group, the LDS at rollout and group level against the exact influence's
retrainings, with the margin over the strongest log-only control), how
its step sums agree with leave-one-step-out retraining, its leave-out replay verdict, and what it cost. Methods are
sorted by their first LDS; controls and references follow as the bars they are (in the figure: reference lines).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from behaviortrace.common.markdown import markdown_table  # noqa: E402
from behaviortrace.report.figures import ROW_INCHES, _save  # noqa: E402
from behaviortrace.report.tables import PLANTED  # noqa: E402

ORDER = {"method": 0, "reference": 1, "control": 2}


def _lds_columns(rows: pl.DataFrame) -> list[str]:
    """The table's (level, percent) LDS columns, without their margins."""
    return [c for c in rows.columns if "_subset_" in c and not c.endswith("_margin")]


def _cells(influence: pl.DataFrame, target: str) -> list[tuple[str, int]]:
    levels = [lv for lv in ("rollout_subset", "group_subset") if influence.filter(pl.col("level") == lv).height]
    return [
        (lv, int(p))
        for lv in levels
        for p in sorted(influence.filter(pl.col("level") == lv)["removal_percent"].drop_nulls().unique().to_list())
    ]


def _envelope(rows: pl.DataFrame, metric: str) -> tuple[float, float, float] | None:
    """Mean over planted seeds (and draws), with the lowest lower and the highest upper bound of their intervals."""
    value = rows.filter(pl.col("metric") == metric)["value"].drop_nans()
    if not len(value):
        return None
    low = rows.filter(pl.col("metric") == f"{metric}_low")["value"].drop_nans()
    high = rows.filter(pl.col("metric") == f"{metric}_high")["value"].drop_nans()
    low = float(low.min()) if len(low) else float("nan")
    return float(value.mean()), low, float(high.max()) if len(high) else float("nan")


DENSE = ("rollout_dense", "group_dense")  # the dense endpoint's levels (evaluate/dense.py)


def _pooled(rows: pl.DataFrame, metric: str) -> tuple[float, float, float] | None:
    """A pooled row's (value, low, high): one value over seeds and draws, its bootstrap interval."""
    found = {r["metric"]: r["value"] for r in rows.iter_rows(named=True)}
    if metric not in found:
        return None
    return found[metric], found[f"{metric}_low"], found[f"{metric}_high"]


def table(influence: pl.DataFrame, checklist: dict, target: str, costs: dict[str, float]) -> pl.DataFrame:
    """One row per checklist row that has an LDS: role, each (level, percent)'s LDS and margin as (mean, low, high),
    the step-level Spearman with leave-one-step-out, the replay verdict and the wall seconds of its jobs."""
    planted = influence.filter((pl.col("arm") == PLANTED) & pl.col("target").is_in([target, "none"]))
    cells = _cells(planted, target)
    out = []
    for name, role in checklist["roles"].items():
        own = planted.filter(pl.col("estimator") == name)
        if not own.height:
            continue
        row = {"row": name, "role": role}
        for level in DENSE:
            part = own.filter(pl.col("level") == level)
            row[level] = _pooled(part, "spearman")
            row[f"{level}_margin"] = _pooled(part, "over_log_only")
        for level, pct in cells:
            part = own.filter((pl.col("level") == level) & (pl.col("removal_percent") == pct))
            row[f"{level}_{pct}"] = _envelope(part, "lds")
            row[f"{level}_{pct}_margin"] = _envelope(part, "lds_over_log_only")
        steps = own.filter((pl.col("level") == "step_out") & (pl.col("metric") == "spearman"))["value"].drop_nans()
        row["step_out"] = float(steps.mean()) if len(steps) else None
        replay = checklist["estimators"][name].get("replay_beats_random", {}).get("verdict")
        row["replay"] = replay if role == "method" else "–"
        row["seconds"] = costs.get(name)
        out.append(row)
    first = f"{cells[0][0]}_{cells[0][1]}" if cells else None
    out.sort(key=lambda r: (ORDER.get(r["role"], 3), -(r[first][0] if first and r[first] else -9.0), r["row"]))
    return pl.DataFrame(out) if out else pl.DataFrame()


def _fmt(cell) -> str:
    if cell is None:
        return "–"
    value, low, high = cell
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def markdown(rows: pl.DataFrame) -> str:
    if not rows.height:
        return "# Faithfulness\n\nNo exact influence in this run: nothing to predict removals against.\n"
    cells = _lds_columns(rows)
    head = ["row", "role"]
    dense = [c for c in DENSE if c in rows.columns]
    for c in dense:
        head += [f"agreement with I, {c.removesuffix('_dense')}s", "over log-only"]
    for c in cells:
        level, pct = c.rsplit("_", 1)
        head += [f"LDS {level.removesuffix('_subset')} {pct}%", "over log-only"]
    head += ["step sums vs leave-one-step-out", "replay", "jobs' s"]
    body = []
    for r in rows.iter_rows(named=True):
        line = [r["row"], r["role"]]
        for c in [*dense, *cells]:
            line += [_fmt(r[c]), _fmt(r[f"{c}_margin"])]
        step = "–" if r["step_out"] is None else f"{r['step_out']:.2f}"
        cost = "–" if r["seconds"] is None else f"{r['seconds']:.0f}"
        body.append(line + [step, r["replay"], cost])
    return "\n".join(
        [
            "# Faithfulness: does a row predict what removing data does?\n",
            "Per row, first the dense endpoint: its rank agreement with the exact influence I over every rollout "
            "and every prompt group before T (Spearman; a group's scores and I summed over its rollouts), pooled "
            "over planted seeds and draws, with its 95% interval (a bootstrap over seeds, then groups) and its "
            "margin over the strongest log-only control on the same resamples. Then the LDS (Spearman of minus a "
            "subset's summed scores with the change of f(w_T) measured by retraining without it) at each level "
            "and subset size: the mean over planted seeds (and draws) with the "
            "lowest and highest bound of their 95% intervals, and the margin over the strongest log-only control on "
            "the same resamples. Then the Spearman of minus each step's summed score with the change measured by "
            "retraining without that step, the leave-out replay verdict, and the wall seconds of the row's "
            "preparation and score jobs, summed. Methods first, sorted by the first LDS; references (the exact "
            "influence: the ceiling; earlier-is-more: a negative control) and controls (the bars) below them.\n",
            markdown_table(head, body),
        ]
    )


def figure(rows: pl.DataFrame, path: Path) -> None:
    """Each method's LDS per (level, percent) as a point with its envelope; controls and references as vertical
    reference lines, named in the legend."""
    cells = _lds_columns(rows) if rows.height else []
    methods = rows.filter(pl.col("role") == "method") if rows.height else rows
    names = methods["row"].to_list() if methods.height else []
    fig, axes = plt.subplots(
        1, max(len(cells), 1), figsize=(4.2 * max(len(cells), 1), ROW_INCHES * max(len(names), 4) + 1.6),
        sharey=True, squeeze=False,
    )  # fmt: skip
    bars = rows.filter(pl.col("role") != "method") if rows.height else rows
    colors = plt.get_cmap("tab10")
    for ax, c in zip(axes[0], cells, strict=False):
        for i, r in enumerate(methods.iter_rows(named=True)):
            if r[c] is None:
                continue
            value, low, high = r[c]
            ax.errorbar([value], [i], xerr=[[max(value - low, 0)], [max(high - value, 0)]], fmt="o", ms=4, color="k")
        for j, r in enumerate(bars.iter_rows(named=True)):
            if r[c] is not None:
                style = "-" if r["role"] == "reference" else ":"
                ax.axvline(r[c][0], color=colors(j % 10), ls=style, lw=1.2, label=f"{r['row']} ({r['role']})")
        level, pct = c.rsplit("_", 1)
        ax.set_title(f"{level.removesuffix('_subset')}s, {pct}% subsets")
        ax.set_xlabel("LDS")
        ax.set_xlim(-1.05, 1.05)
    axes[0][0].set_yticks(range(len(names)), names)
    axes[0][0].set_ylim(max(len(names), 1) - 0.5, -0.5)
    if cells:
        axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    _save(fig, path)


def _values(influence: pl.DataFrame, **where) -> list[float]:
    rows = influence.filter(pl.col("arm") == PLANTED, *(pl.col(k) == v for k, v in where.items()))
    return [v for v in rows["value"].to_list() if v is not None and v == v]


def _span(values: list[float]) -> str:
    return (
        "–"
        if not values
        else f"{min(values):.2f}"
        if min(values) == max(values)
        else f"{min(values):.2f} to {max(values):.2f}"
    )


def truths_markdown(influence: pl.DataFrame, semantics: str) -> str:
    """Which causal truth judges which level, with this run's numbers for why; `semantics` is what removing a
    rollout means (influence.semantics), and `influence` holds the rows under it."""
    lds = _values(influence, estimator="influence", metric="lds")
    steps = _values(influence, estimator="influence", level="step_out", metric="spearman")
    predicted = _values(influence, estimator="label", level="set", metric="predicted_change")
    measured = _values(influence, estimator="label", level="set", metric="measured_change")
    ratios = [p / m for p, m in zip(predicted, measured, strict=False) if m]
    return "\n".join(
        [
            "| level | the truth that judges it | why |",
            "|---|---|---|",
            f"| rollouts, groups | the LDS: random subsets retrained without them (`{semantics}`) | small removals, "
            f"where the exact influence I predicts them (I's own LDS here: {_span(lds)}); I is the ceiling an "
            "attribution is read against, not the truth itself |",
            "| steps | leave-one-step-out, measured | a step's summed I is the derivative of scaling all its "
            "shares together: it describes small scalings, while removing the step (all of its update) can lie far "
            "outside that linear range (diagnostics/step_scaling.py measures the curve from a nudge to the removal); "
            f"I's step sums against leave-one-step-out reach {_span(steps)} here |",
            f"| sets (the paid set, an estimator's top set) | the leave-out retraining and replay, measured | a set's "
            f"removal is far outside the linear range: I's prediction for the paid set is {_span(ratios)} times its "
            "measured change here |",
            "",
        ]
    )
