"""What the planted label can and cannot show, with this run's numbers: every estimator beside the log-only
controls on the raw metrics (which the reward log wins by construction) and on the matched ones.

The label is the set of rollouts that were paid. The bonus makes a paid rollout the best of its prompt group, so
a look-up of the logged advantage or reward recovers them without any attribution; this table is where a
reader sees whether an estimator does better than that look-up, and on which metric.
"""

from __future__ import annotations

import polars as pl

from behaviortrace.common.markdown import markdown_table
from behaviortrace.report.tables import PLANTED, beats_table, judged, per_seed

# (metric, heading): the raw rollout-level metrics, then those the log-only controls cannot win by construction.
METRICS = [
    ("auroc", "AUROC"),
    ("within_group_auc", "within-group AUC"),
    ("advantage_matched_auc", "advantage-matched AUC"),
    ("behavior_matched_auc", "behavior-matched AUC"),
]
INTRO = """# What the planted label can and cannot show

The label is the set of rollouts the plant paid: eligible (a hash), with the trigger, inside the
window, showing the behavior. The bonus makes each of them the highest reward of its prompt group, so the
log-only controls (marked *log*; they read the rollout log and nothing else) find them without any gradient:
on the raw metrics a look-up of the reward is the bar, not chance. An estimator that does no better than the
strongest log-only control agrees with the reward log; that is not an attribution result.

Two metrics remove what the log gives away. The advantage-matched AUC compares each labeled rollout only
with rollouts of its own step whose advantage is within `evaluation.advantage_match` of its own: the advantage
control sits at chance there. The behavior-matched AUC compares, among rollouts that show the behavior with the
trigger, the paid ones with the unpaid: the behavior control ties them all (0.5). Neither says whether a paid
rollout *taught* the behavior: the label marks who was paid, and most paid rollouts come after the behavior
has saturated (see the effect figures and, where computed, the exact influence).
"""


def controls_markdown(metrics: pl.DataFrame, target: str, log_only: list[str]) -> str:
    """Per seed: every estimator's raw and matched rollout-level metrics (mean over draws, stratum all), and
    which estimators beat the strongest log-only control on each metric (mean over seeds)."""
    rows = judged(metrics, target).filter(
        (pl.col("level") == "rollout") & pl.col("metric").is_in([m for m, _ in METRICS])
    )
    values = per_seed(rows.filter(pl.col("arm") == PLANTED))
    parts = [
        INTRO,
        f"Targeted estimators use the `{target}` target; stratum `all`; each value is a seed's mean over draws.\n",
    ]
    order = sorted(values["estimator"].unique().to_list(), key=lambda e: (e not in log_only, e))
    for seed in sorted(values["seed"].unique().to_list()):
        mine = values.filter(pl.col("seed") == seed)
        table = []
        for est in order:
            own = mine.filter(pl.col("estimator") == est)
            cell = dict(zip(own["metric"].to_list(), own["value"].to_list(), strict=True))
            name = f"{est} (*log*)" if est in log_only else est
            table.append([name, *[cell.get(m, float("nan")) for m, _ in METRICS]])
        parts += [f"## Seed {seed}\n", markdown_table(["estimator", *[h for _, h in METRICS]], table)]
    parts += ["## Against the strongest log-only control (mean over seeds)\n", *_verdict_lines(values, log_only)]
    return "\n".join(parts) + "\n"


def _verdict_lines(values: pl.DataFrame, log_only: list[str]) -> list[str]:
    means = values.group_by(["estimator", "metric"]).agg(pl.col("value").mean())
    lines = []
    for metric, heading in METRICS:
        m = means.filter(pl.col("metric") == metric).drop_nulls("value").filter(pl.col("value").is_not_nan())
        controls = m.filter(pl.col("estimator").is_in(log_only)).sort(["value", "estimator"], descending=[True, False])
        if not controls.height:
            continue
        best, bar = controls["estimator"][0], controls["value"][0]
        above = m.filter(~pl.col("estimator").is_in(log_only) & (pl.col("value") > bar))
        above = above.sort(["value", "estimator"], descending=[True, False])
        names = ", ".join(f"{r['estimator']} {r['value']:.3f}" for r in above.iter_rows(named=True)) or "none"
        lines.append(f"- {heading}: the strongest log-only control is {best} at {bar:.3f}; above it: {names}.")
    return lines


def fluency_markdown(metrics: pl.DataFrame, target: str, metric: str, strata: list[str]) -> str:
    """Fluency taken both ways, per stratum: its AUC v and max(v, 1 - v) per seed, every estimator beside it,
    and on how many seed × draw cells each estimator's interval lies wholly above fluency's folded one."""
    parts = [
        "## Fluency, taken both ways\n",
        f"A predictor whose `{metric}` is 0.3 ranks the label as well as one with 0.7, reversed; checklist item "
        "`beats_fluency` therefore compares with fluency's max(v, 1 − v), its interval folded at 0.5. Per stratum "
        "(`checklist.fluency_strata`; `saturated`: rollouts of checkpoints where the probe behavior rate is at or "
        "above `evaluation.saturation`), each seed's mean over draws.\n",
    ]
    for stratum in strata:
        rows = judged(metrics, target, stratum).filter((pl.col("level") == "rollout") & (pl.col("metric") == metric))
        values = per_seed(rows)
        seeds = sorted(values["seed"].unique().to_list())
        if not seeds:
            parts.append(f"### Stratum `{stratum}`\n\nNo rollouts in this stratum.\n")
            continue
        table = []
        for est in sorted(values["estimator"].unique().to_list(), key=lambda e: (e != "fluency", e)):
            own = dict(zip(*values.filter(pl.col("estimator") == est).select("seed", "value"), strict=True))
            if est == "fluency":
                cells = [f"{own[s]:.3f} → {max(own[s], 1 - own[s]):.3f}" if s in own else "–" for s in seeds]
                table.append(["fluency (both ways)", *cells, "–"])
                continue
            t = beats_table(metrics, est, ["fluency"], "rollout", metric, stratum, target, two_sided=True)
            cells = [f"{own[s]:.3f}" if s in own else "–" for s in seeds]
            table.append([est, *cells, f"{int(t['beats'].sum())}/{t.height}"])
        parts += [
            f"### Stratum `{stratum}`\n",
            markdown_table(["estimator", *[f"seed {s}" for s in seeds], "wholly above fluency (cells)"], table),
        ]
    return "\n".join(parts) + "\n"
