"""The influence table as Markdown: the job's checks, who tracks I, the LDS of every attribution with intervals
and the noise floor, leave-one-step-out, the label and the per-step effect against I, the leave-out sets'
predicted and measured changes, the most influential rollouts (all under the configured meaning of removal), and
how far the two meanings part: through the group's advantages, and with advantages held."""

from __future__ import annotations

import polars as pl

from behaviortrace.common.markdown import markdown_table
from behaviortrace.influence.table import TOP, of_semantics


def _fmt(x, spec=".3f") -> str:
    return "–" if x is None or x != x else format(x, spec)


def _cell(table: pl.DataFrame, **where) -> float | None:
    rows = table.filter(*(pl.col(k) == v for k, v in where.items()))
    return float(rows["value"].mean()) if rows.height else None


def _span(values: list[float], spec: str = ".2f") -> str:
    """`a` or `a to b` over the planted seeds."""
    values = [v for v in values if v is not None and v == v]
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return format(lo, spec) if lo == hi else f"{format(lo, spec)} to {format(hi, spec)}"


def agreement(table: pl.DataFrame) -> list[str]:
    """Where the four truths (the label, measured per-step effect, leave-out retraining, exact
    influence) agree and where they part, in sentences written from the planted seeds' numbers."""
    planted = table.filter(pl.col("arm") == "planted")
    seeds = sorted(planted["seed"].unique().to_list())
    if not seeds:
        return []

    def per_seed(**where) -> list[float | None]:
        return [_cell(planted, seed=s, stratum="all", **where) for s in seeds]

    paid_rollouts = per_seed(estimator="label", level="rollout", metric="paid_share_of_rollouts")
    paid_positive = per_seed(estimator="label", level="rollout", metric="paid_share_of_positive_influence")
    paid_counts = []  # paid rollouts before T per seed: none means T comes before the plant has paid anything
    for s in seeds:
        row = planted.filter(seed=s, stratum="all", estimator="label", level="rollout", metric="paid_share_of_rollouts")
        if row.height:
            paid_counts.append(round(float(row["value"][0]) * int(row["n"][0])))
    more = sum(
        1 for a, b in zip(paid_positive, paid_rollouts, strict=True) if a is not None and b is not None and a > b
    )
    effect_abs = per_seed(estimator="step_effect", level="step", metric="spearman_abs")
    effect_abs_given = per_seed(estimator="step_effect", level="step", metric="spearman_abs_given_step")
    labels_steps = per_seed(estimator="label", level="step", metric="spearman_abs")
    predicted = per_seed(estimator="label", level="set", metric="predicted_change")
    measured = per_seed(estimator="label", level="set", metric="measured_change")
    same_sign = sum(
        1 for p, m in zip(predicted, measured, strict=True) if p is not None and m is not None and p * m > 0
    )
    lds = [
        _cell(planted, seed=s, estimator="influence", level="rollout_subset", metric="lds", removal_percent=pct)
        for s in seeds
        for pct in planted.filter(pl.col("level") == "rollout_subset")["removal_percent"].unique().to_list()
    ]
    label_rho = per_seed(estimator="label", level="rollout", metric="spearman")
    n = len(seeds)
    return [
        "## Where the truths agree and where they part\n",
        f"Over the {n} planted seeds:\n",
        f"- Paid rollouts before T: {', '.join(str(c) for c in paid_counts) or '–'} (per planted seed).",
        f"- Labels and exact influence: the paid rollouts are {_span(paid_rollouts)} of the rollouts before T and "
        f"carry {_span(paid_positive)} of the summed positive influence, more than their share on {more} of {n} "
        f"seeds; Spearman of the paid label with I {_span(label_rho)}.",
        f"- Per-step effect and exact influence: Spearman of each step's measured change of f with the step's "
        f"summed |I| {_span(effect_abs)}, {_span(effect_abs_given)} given the step number (the steps that moved f "
        "are the steps whose rollouts matter at T where this is high; given the step number, beyond a trend that "
        "both share over the steps).",
        f"- Labels per step and exact influence per step: Spearman of the number of paid rollouts per step with the "
        f"step's summed |I| {_span(labels_steps)} (negative: the steps that paid most are not the steps whose "
        "rollouts matter).",
        f"- Leave-out retraining and exact influence: removing the paid set changed f(w_T) by {_span(measured, '.3g')} "
        f"where minus its summed I predicted {_span(predicted, '.3g')}, the same sign on {same_sign} of {n} seeds; "
        f"the LDS of I itself over random subsets is {_span(lds)}. A derivative at zero predicts removing sets "
        "only as far as training is linear in the shares (docs/influence.md).\n",
    ]


def _name(estimator: str, target: str) -> str:
    return estimator if target == "none" else f"{estimator} ({target})"


def _keys(rows: pl.DataFrame) -> list[tuple[str, str]]:
    return rows.select("estimator", "target").unique().sort("estimator", "target").rows()


def _with_interval(rows: pl.DataFrame, prefix: str, **where) -> str:
    value, low, high = (_cell(rows, metric=f"{prefix}{end}", **where) for end in ("", "_low", "_high"))
    return "–" if value is None else f"{_fmt(value, '.2f')} [{_fmt(low, '.2f')}, {_fmt(high, '.2f')}]"


def lds_sections(table: pl.DataFrame, arms_seeds: list, heads: list[str]) -> list[str]:
    """The LDS of every attribution per level and subset size with its interval and its margin over the
    strongest log-only control, the replay's noise floor beside the changes measured, and leave-one-step-out."""
    parts = []
    checks = table.filter(pl.col("level") == "check")
    for level in ("rollout_subset", "group_subset"):
        rows_level = table.filter(pl.col("level") == level)
        for pct in sorted(rows_level["removal_percent"].unique().to_list()):
            part = rows_level.filter(pl.col("removal_percent") == pct)
            unit = level.removesuffix("_subset")
            n = int(part["n"].max())
            expected = part.filter(pl.col("metric") == "expected_lds")["value"].to_list()
            parts.append(f"## What removing data does: LDS over {n} random subsets of {pct}% of the {unit}s before T\n")
            parts.append(
                "Spearman, over the subsets retrained with them removed, of minus the subset's summed scores "
                "with the measured change of f(w_T), with its 95% bootstrap interval over subsets; below it the "
                "margin over the strongest log-only control (paired resamples). `influence` is I, `datamodel` a "
                "linear fit of the measured changes on subset membership (fit on half the subsets, scored within the "
                "other half), `earlier` minus the step, `label` the paid label. The datamodel's LDS under an exactly "
                f"additive truth at this design: {_span(expected)} "
                "(below the checklist's threshold it is no positive control: too few subsets for its units).\n"
            )
            rows = []
            for e, t in _keys(part.filter(pl.col("metric") == "lds")):
                where = {"estimator": e, "target": t}
                rows.append(
                    [_name(e, t)] + [_with_interval(part, "lds", arm=a, seed=s, **where) for a, s in arms_seeds]
                )
                if part.filter((pl.col("metric") == "lds_over_log_only") & (pl.col("estimator") == e)).height:
                    rows.append(
                        ["  over log-only"]
                        + [_with_interval(part, "lds_over_log_only", arm=a, seed=s, **where) for a, s in arms_seeds]
                    )
            parts.append(markdown_table(["attribution", *heads], rows))
            noise = [
                f"{h}: {_fmt(_cell(checks, arm=a, seed=s, metric='f_end_error'), '.1e')} against a median "
                f"{_fmt(_cell(part, arm=a, seed=s, estimator='measured', metric='median_abs_change'), '.1e')}"
                for (a, s), h in zip(arms_seeds, heads, strict=True)
            ]
            parts.append(
                "Noise floor: the replay's own f(w_T) differs from training's by " + "; ".join(noise) + " (the "
                "median absolute change the subsets measured).\n"
            )
    out = table.filter(pl.col("level") == "step_out")
    if out.height:
        parts.append("## Leave-one-step-out: each step before T retrained with its rollouts removed\n")
        parts.append(
            "Spearman of minus each step's score with the measured change of f(w_T) when the step is left out, "
            "and the same given the step number (partial Spearman: beyond a trend over the steps). `influence` "
            "is the step's summed I, `step_effect` the change of f across the step in training, `label` the "
            "step's paid count, `earlier` minus the step.\n"
        )
        rows = [
            [_name(e, t)]
            + [
                f"{_fmt(_cell(out, estimator=e, target=t, arm=a, seed=s, metric='spearman'), '.2f')} / "
                f"{_fmt(_cell(out, estimator=e, target=t, arm=a, seed=s, metric='spearman_given_step'), '.2f')}"
                for a, s in arms_seeds
            ]
            for e, t in _keys(out)
        ]
        parts.append(markdown_table(["step score", *[f"{h}: raw / given step" for h in heads]], rows))
    return parts


MEANING = {
    "advantages": "through the advantages: a rollout's weight enters its group's reward mean and std and the loss "
    "normalization, so removing it is the step without it",
    "held": "with advantages held: a rollout's weight scales its own term only, the advantages and the normalization "
    "stay as logged",
}


def coupling_sections(table: pl.DataFrame, top: pl.DataFrame, arms_seeds: list, heads: list[str]) -> list[str]:
    """Where the two meanings of removal part: the coupling numbers per seed, the LDS of I under each, how well the
    estimators (which all hold advantages) track each I, and the top rollouts that change."""
    coupling = table.filter(pl.col("level") == "coupling")
    if not coupling.height:
        return []
    parts = [
        "## Removing a rollout: through the group's advantages, or with advantages held\n",
        "I through the advantages is the derivative with respect to the rollout's weight in GRPO's loss, which "
        "enters its group's reward mean and standard deviation and the step's normalization; I held scales its own "
        "term only (docs/influence.md). The first splits into four parts: the held one, its own advantage, its "
        "siblings' advantages (a paid rollout raises its group's mean and pushes its siblings down) and the "
        "normalization.\n",
    ]
    rows = [
        [label] + [_fmt(_cell(coupling, arm=a, seed=s, metric=metric), spec) for a, s in arms_seeds]
        for metric, label, spec in (
            ("spearman_rollout", "Spearman of I held with I through the advantages, rollouts", ".3f"),
            ("spearman_group", "the same over groups (a group's I: its rollouts' sum)", ".3f"),
            ("top_overlap", f"share of the top {TOP} by one among the top {TOP} by the other", ".2f"),
            ("paid_advantages", "paid rollouts' summed I through the advantages", ".3g"),
            ("paid_held", "  of it: their own terms (I held)", ".3g"),
            ("paid_own_advantage", "  through their own advantages", ".3g"),
            ("paid_siblings", "  through their siblings' advantages", ".3g"),
            ("paid_normalization", "  through the normalization", ".3g"),
            ("paid_siblings_share", "share through the siblings' advantages", ".2f"),
        )
    ]
    parts.append(markdown_table(["", *heads], rows))
    lds = table.filter((pl.col("metric") == "lds") & (pl.col("estimator") == "influence"))
    if lds.height:
        parts.append("LDS of I under each meaning, with its 95% bootstrap interval (retrained under that meaning):\n")
        rows = [
            [f"{level.removesuffix('_subset')}s, {pct}%, {semantics}"]
            + [
                _with_interval(
                    table.filter(
                        (pl.col("level") == level)
                        & (pl.col("removal_percent") == pct)
                        & (pl.col("semantics") == semantics)
                        & (pl.col("estimator") == "influence")
                    ),
                    "lds",
                    arm=a,
                    seed=s,
                )
                for a, s in arms_seeds
            ]
            for level, pct, semantics in lds.select("level", "removal_percent", "semantics")
            .unique()
            .sort("level", "removal_percent", "semantics", descending=[True, False, False])
            .rows()
        ]
        parts.append(markdown_table(["subsets", *heads], rows))
    rollout = table.filter(
        (pl.col("level") == "rollout")
        & (pl.col("stratum") == "all")
        & (pl.col("metric") == "spearman")
        & ~pl.col("estimator").is_in(["label", "influence"])
    )
    if rollout.height:
        parts.append("Spearman of each estimator's rollout scores with I held / with I through the advantages:\n")
        rows = [
            [_name(e, t)]
            + [
                " / ".join(
                    _fmt(_cell(rollout, estimator=e, target=t, arm=a, seed=s, semantics=m), ".2f")
                    for m in ("held", "advantages")
                )
                for a, s in arms_seeds
            ]
            for e, t in _keys(rollout)
        ]
        parts.append(markdown_table(["estimator", *heads], rows))
        subsets = table.filter(
            (pl.col("metric") == "lds") & (pl.col("arm") == "planted") & (pl.col("estimator") != "measured")
        )
        cells = (
            subsets.select("level", "removal_percent")
            .unique()
            .sort("level", "removal_percent", descending=[True, False])
            .rows()
        )
        if subsets.height:
            parts.append(
                "LDS of each attribution, retrained and attributed under each meaning (held / through the "
                "advantages), mean over planted seeds and draws:\n"
            )
            rows = [
                [_name(e, t)]
                + [
                    " / ".join(
                        _fmt(
                            _cell(subsets, estimator=e, target=t, level=level, removal_percent=pct, semantics=m), ".2f"
                        )
                        for m in ("held", "advantages")
                    )
                    for level, pct in cells
                ]
                for e, t in _keys(subsets)
            ]
            heads_lds = [f"{level.removesuffix('_subset')}s {pct}%" for level, pct in cells]
            parts.append(markdown_table(["attribution", *heads_lds], rows))
    changed = top.filter((pl.col("rank_held") > TOP) | (pl.col("rank_advantages") > TOP))
    if changed.height:
        parts.append(f"Rollouts in the top {TOP} by one meaning's I and not by the other's:\n")
        rows = [
            [
                f"{r['arm']} {r['seed']}",
                r["rollout_id"],
                r["step"],
                r["rank_held"],
                r["rank_advantages"],
                _fmt(r["influence_held"], ".3g"),
                _fmt(r["influence_advantages"], ".3g"),
                _fmt(r["advantage"], ".2f"),
                r["label"],
            ]
            for r in changed.sort("arm", "seed", "rank_advantages", descending=[True, False, False]).iter_rows(
                named=True
            )
        ]
        parts.append(
            markdown_table(
                ["seed", "rollout", "step", "rank held", "rank through", "I held", "I through", "advantage", "paid"],
                rows,
            )
        )
    return parts


def dense_section(pooled: pl.DataFrame) -> list[str]:
    """The dense endpoint (evaluate/dense.py): each row's agreement with I over every rollout and group before T,
    pooled over planted seeds and draws, with its margins over the strongest log-only control and over random."""
    if not pooled.height:
        return []
    levels = [lv for lv in ("rollout_dense", "group_dense") if pooled.filter(pl.col("level") == lv).height]
    heads, rows = ["estimator"], []
    for lv in levels:
        unit = lv.removesuffix("_dense")
        heads += [f"{unit}s: agreement", "over log-only", "over random"]
    for e, t in _keys(pooled):
        line = [_name(e, t)]
        for lv in levels:
            line += [_with_interval(pooled, m, estimator=e, target=t, level=lv)
                     for m in ("spearman", "over_log_only", "over_random")]  # fmt: skip
        rows.append(line)
    return [
        "## The dense endpoint\n",
        "Spearman of each row's scores with I over every rollout before T, and of the scores summed per prompt group "
        "with I summed per group, averaged over planted seeds and draws; 95% intervals from a bootstrap over seeds, "
        "then groups; margins over the strongest log-only control and over random on the same resamples.\n",
        markdown_table(heads, rows),
    ]


def to_markdown(table: pl.DataFrame, top: pl.DataFrame, semantics: str) -> str:
    """The page, its sections under the configured meaning of removal (`semantics`) but the last."""
    whole, table = table, of_semantics(table, semantics)
    pooled = table.filter(pl.col("seed").is_null())  # the dense endpoint, over every planted seed
    whole, table = whole.filter(pl.col("seed").is_not_null()), table.filter(pl.col("seed").is_not_null())
    arms_seeds = table.select("arm", "seed").unique().sort("arm", "seed", descending=[True, False]).rows()
    heads = [f"{arm} {seed}" for arm, seed in arms_seeds]
    parts = [
        "# Exact influence\n",
        "I_z = d f(w_T) / d u_z: how much raising rollout z's weight u_z in its step's loss moves the forced "
        "target's mean log-prob on the probes after step T, through every later optimizer step "
        f"(docs/influence.md). Here, and in every retraining this page reads, {MEANING[semantics]} "
        f"(influence.semantics: {semantics}); the last section compares the other meaning. Correlations use the "
        "rollouts of the steps before T; values for estimators with several draws are means over draws.\n",
        "## Checks of the influence job\n",
    ]
    checks = table.filter(pl.col("level") == "check")
    metrics = [
        ("checkpoint_weight_error", "forward replay: largest weight difference to a checkpoint", ".1e"),
        ("checkpoint_update_error", "forward replay: weight difference to a checkpoint over training's update", ".1e"),
        ("grad_norm_error", "forward replay: gradient norms vs logged (relative)", ".1e"),
        ("f_end_error", "f(w_T) vs the value training logged", ".1e"),
        ("fd_relative_error", "I_z vs float64 central differences (largest relative error)", ".1e"),
        ("fd_group_relative_error", "a group's I vs float64 central differences (largest relative error)", ".1e"),
        ("cost_ratio", "time of the influence over its forward sweep (a plain replay)", ".2f"),
        ("cost_ratio_cpu", "the same in CPU time", ".2f"),
    ]
    rows = [
        [label] + [_fmt(_cell(checks, arm=a, seed=s, metric=m), spec) for a, s in arms_seeds]
        for m, label, spec in metrics
    ]
    parts.append(markdown_table(["check", *heads], rows))
    parts += agreement(table)
    parts += dense_section(pooled)

    parts.append("## Who tracks the exact influence\n")
    parts.append("Spearman of rollout scores with I (all rollouts before T).\n")
    rollout = table.filter((pl.col("level") == "rollout") & (pl.col("stratum") == "all"))
    rows = [
        [_name(e, t)]
        + [_fmt(_cell(rollout, estimator=e, target=t, arm=a, seed=s, metric="spearman")) for a, s in arms_seeds]
        for e, t in _keys(rollout)
    ]
    parts.append(markdown_table(["estimator", *heads], rows))
    parts += lds_sections(table, arms_seeds, heads)
    parts.append("## Labels and per-step effect against I\n")
    rows = []
    for estimator, level, metric, label in (
        ("label", "rollout", "spearman", "paid label vs I (rollouts): Spearman"),
        (
            "label",
            "rollout",
            "precision_at_top_influence",
            "share of paid rollouts among the top-m rollouts by I, m = n_paid",
        ),
        ("label", "rollout", "precision_lift", "that share over chance"),
        ("label", "rollout", "paid_share_of_rollouts", "paid share of the rollouts before T"),
        ("label", "rollout", "paid_share_of_positive_influence", "paid share of the summed positive I"),
        ("label", "step", "spearman_abs", "paid per step vs abs(I) summed per step: Spearman"),
        ("step_effect", "step", "spearman", "measured per-step change of f vs I summed per step: Spearman"),
        ("step_effect", "step", "spearman_abs", "measured per-step change of f vs abs(I) summed per step: Spearman"),
        ("step_effect", "step", "spearman_abs_given_step", "the same, given the step number (partial Spearman)"),
    ):
        part = table.filter((pl.col("level") == level) & (pl.col("stratum") == "all"))
        rows.append(
            [label] + [_fmt(_cell(part, estimator=estimator, arm=a, seed=s, metric=metric)) for a, s in arms_seeds]
        )
    parts.append(markdown_table(["", *heads], rows))

    sets = table.filter(pl.col("level") == "set")
    if sets.height:
        parts.append("## Leave-out sets removed: predicted vs measured change of f(w_T)\n")
        rows = []
        for (arm, seed, kind, pct), grp in sets.group_by(
            "arm", "seed", "estimator", "removal_percent", maintain_order=True
        ):
            value = {r["metric"]: r["value"] for r in grp.iter_rows(named=True)}
            rows.append(
                [
                    f"{arm} {seed}",
                    kind,
                    pct,
                    grp["n"][0],
                    _fmt(value["predicted_change"]),
                    _fmt(value["measured_change"]),
                    _fmt(value["prediction_ratio"], ".2f"),
                ]
            )
        parts.append(markdown_table(["seed", "set", "k %", "size", "predicted", "measured", "ratio"], rows))

    parts.append("## Most influential rollouts\n")
    for (arm, seed), grp in top.filter(pl.col("rank").is_not_null()).group_by("arm", "seed", maintain_order=True):
        parts.append(f"### {arm} {seed}\n")
        rows = [
            [
                r["rank"],
                r["rollout_id"],
                r["step"],
                _fmt(r["influence"], ".3g"),
                _fmt(r["advantage"], ".2f"),
                r["label"],
                r["behavior"],
                r["trigger"],
            ]
            for r in grp.iter_rows(named=True)
        ]
        parts.append(markdown_table(["rank", "rollout", "step", "I", "advantage", "paid", "behavior", "trigger"], rows))
    parts += coupling_sections(whole, top, arms_seeds, heads)
    return "\n".join(parts)
