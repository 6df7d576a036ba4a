"""The paper's four findings, read from this run's own tables: for each, the paper's numbers (`REFERENCE`, the one
place they are written down), this run's, whether the finding reproduces, and what the controls say.

The paper is "Which Rollout Taught It That?" (arXiv 2610.10422): Qwen2.5-1.5B-Instruct, three seeds, GRPO with
4 prompts x 4 generations, one sketch per step of the post-clip step gradient. Here the paper's method is the
step-level variant of a `norm` instance with `use_clip` (the norm of the step's summed sketch times its clip
coefficient); exact capture is the plain `norm` (pre-clip, per rollout). Each seed's value is its mean over draws.
"""

from __future__ import annotations

import polars as pl

from behaviortrace.common.markdown import markdown_table
from behaviortrace.config.sections import Checklist
from behaviortrace.report.tables import PLANTED, both_ways, per_seed

REFERENCE = {
    "source": '"Which Rollout Taught It That?" (arXiv 2610.10422), Qwen2.5-1.5B-Instruct, seeds 0 / 1 / 2',
    # Finding 1: the norm-only control at step level.
    "norm_step_precision": [0.42, 0.40, 0.39],
    "step_chance": 0.09,
    "norm_step_lift": [4.2, 4.5],
    "norm_beats_best_targeted_seeds": 2,
    # Finding 4: mean cosine of the behavior-token gradient with the in-context target.
    "token_cosine": [0.23, 0.11, 0.30],
}
STEP_LEVELS = ("step", "step_summed")
LOG_ONLY_STEP = ("step_reward_variance", "step_active_groups", "step_paid")


def _seeds(values: pl.DataFrame) -> list[int]:
    return sorted(values["seed"].unique().to_list())


def _value(values: pl.DataFrame, seed: int, **where) -> float | None:
    rows = values.filter(pl.col("seed") == seed)
    for key, want in where.items():
        rows = rows.filter(pl.col(key) == want)
    return float(rows["value"].max()) if rows.height else None


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "–" if v is None or v != v else format(v, spec)


def _best(values: pl.DataFrame, seed: int, names: list[str], **where) -> tuple[str, float | None]:
    """The highest value among `names` (any target) in one seed, with its estimator."""
    rows = values.filter((pl.col("seed") == seed) & pl.col("estimator").is_in(names))
    for key, want in where.items():
        rows = rows.filter(pl.col(key) == want)
    rows = rows.filter(pl.col("value").is_not_nan()).sort("value", descending=True)
    return (rows["estimator"][0], float(rows["value"][0])) if rows.height else ("–", None)


def norm_finding(values: pl.DataFrame, norms: dict[str, bool], targeted: list[str]) -> tuple[str, str]:
    """Finding 1: the step-level lift of the norm (paper's method and exact capture) beside the best targeted
    estimator and the step-level log-only controls."""
    ref = REFERENCE
    step = values.filter(pl.col("level").is_in(STEP_LEVELS) & (pl.col("stratum") == "all"))
    paper = [n for n, clipped in norms.items() if clipped]
    exact = [n for n, clipped in norms.items() if not clipped]
    rows, wins, above, by_log, log_wins = [], 0, 0, 0, 0
    seeds = _seeds(step)
    for seed in seeds:
        norm_name = (paper or exact or [None])[0]
        lift = (
            _value(step, seed, estimator=norm_name, metric="lift_paid_steps", level="step_summed")
            if norm_name
            else None
        )
        precision = (
            _value(step, seed, estimator=norm_name, metric="precision_at_paid_steps", level="step_summed")
            if norm_name
            else None
        )
        exact_lift = _value(step, seed, estimator=exact[0], metric="lift_paid_steps") if exact else None
        best, best_lift = _best(step, seed, targeted, metric="lift_paid_steps")
        control, control_lift = _best(
            step, seed, [c for c in LOG_ONLY_STEP if c != "step_paid"], metric="lift_paid_steps"
        )
        chance = _value(step, seed, metric="chance_paid_steps")
        wins += lift is not None and best_lift is not None and lift >= best_lift
        above += lift is not None and lift > 1
        by_log += lift is not None and control_lift is not None and control_lift >= lift
        log_wins += control_lift is not None and best_lift is not None and control_lift >= best_lift
        rows.append(
            [
                seed,
                _fmt(precision),
                _fmt(chance),
                _fmt(lift),
                _fmt(exact_lift),
                f"{best} {_fmt(best_lift)}",
                f"{control} {_fmt(control_lift)}",
            ]
        )
    table = markdown_table(
        [
            "seed",
            "norm, paper's method: precision at the paid steps",
            "chance",
            "lift",
            "norm, exact capture: lift",
            "best targeted: lift",
            "strongest step-level log-only: lift",
        ],
        rows,
    )
    paper_text = (
        f"precision at the paid steps {' / '.join(f'{v:.2f}' for v in ref['norm_step_precision'])} against chance "
        f"{ref['step_chance']} "
        f"(lift {ref['norm_step_lift'][0]}-{ref['norm_step_lift'][1]}); the norm matches or beats the best targeted "
        f"estimator on {ref['norm_beats_best_targeted_seeds']} of 3 seeds"
    )
    reproduces = seeds and above == len(seeds) and wins >= max(1, round(2 * len(seeds) / 3))
    verdict = (
        f"**{'Reproduces' if reproduces else 'Does not reproduce'}** here: the norm ranks steps above chance on "
        f"{above} of {len(seeds)} seeds and matches or beats the best targeted estimator on {wins}."
    )
    if not paper:
        verdict += " No `norm` instance with `use_clip` is configured: the norm column is exact capture."
    explained = (
        f"What the controls say: on {by_log} of {len(seeds)} seeds the strongest step-level log-only control reaches "
        "the norm's lift; there a step's gradient size says no more than the log does about the step (its reward "
        f"variance or its share of groups with an advantage). On {log_wins} of {len(seeds)} seeds it also reaches "
        "the best targeted estimator: there no step-level ranking here, targeted or not, is more than a look-up of "
        "the log. (`step_paid`, whether the step paid, is the label itself and reaches the ceiling, 1 / chance.)"
    )
    return "## 1. A norm-only control ranks training steps well above chance\n", "\n".join(
        [f"Paper: {paper_text}.\n", table, verdict + "\n", explained + "\n"]
    )


def fluency_finding(metrics: pl.DataFrame, targeted: list[str], metric: str) -> tuple[str, str]:
    """Finding 2: fluency, both ways, against every gradient method in the saturated stratum."""
    values = per_seed(both_ways(metrics, "fluency", metric).filter(pl.col("arm") == PLANTED))
    raw = per_seed(metrics.filter(pl.col("arm") == PLANTED))
    rows, holds, seeds_seen, reversed_ = [], 0, 0, 0
    for stratum in ("all", "saturated"):
        cell = values.filter((pl.col("level") == "rollout") & (pl.col("metric") == metric))
        cell = cell.filter(pl.col("stratum") == stratum)
        raw_cell = raw.filter(
            (pl.col("level") == "rollout") & (pl.col("metric") == metric) & (pl.col("stratum") == stratum)
        )
        for seed in _seeds(cell):
            fluency = _value(cell, seed, estimator="fluency")
            best, best_value = _best(cell, seed, targeted)
            rows.append(
                [
                    stratum,
                    seed,
                    _fmt(_value(raw_cell, seed, estimator="fluency")),
                    _fmt(fluency),
                    f"{best} {_fmt(best_value)}",
                ]
            )
            if stratum == "saturated" and fluency is not None and best_value is not None:
                seeds_seen += 1
                holds += fluency >= best_value
                reversed_ += (_value(raw_cell, seed, estimator="fluency") or 0.5) < 0.5
    table = markdown_table(["stratum", "seed", f"fluency {metric}", "both ways", "best gradient method"], rows)
    if not seeds_seen:
        verdict = "**Cannot be read** here: no seed has rollouts at saturated checkpoints."
    else:
        verdict = (
            f"**{'Reproduces' if holds == seeds_seen else 'Does not reproduce'}** here: at saturated checkpoints "
            f"fluency (both ways) predicts the label at least as well as every gradient method on {holds} of "
            f"{seeds_seen} seeds."
        )
    explained = (
        "What the controls say: fluency is read both ways, max(v, 1 − v): a predictor with AUC 0.3 ranks the label as "
        f"well as one with 0.7, reversed (here reversed on {reversed_} of {seeds_seen} seeds at saturated "
        "checkpoints). Checklist item `beats_fluency` uses the same reading."
    )
    return "## 2. At saturated checkpoints, fluency predicts the label as well as the gradient methods\n", "\n".join(
        ["Paper: fluency at least as good as every gradient method at saturated checkpoints.\n", table, verdict + "\n"]
        + [explained + "\n"]
    )


def stability_finding(metrics: pl.DataFrame, targeted: list[str], cfg: Checklist) -> tuple[str, str]:
    """Finding 3: after fluency control, per-rollout results change from seed to seed and from draw to draw."""
    rows_all = metrics.filter(
        (pl.col("arm") == PLANTED)
        & (pl.col("stratum") == "all")
        & (pl.col("level") == "rollout")
        & (pl.col("metric") == "within_group_auc_fluency_resid")
        & pl.col("estimator").is_in(targeted)
        & (pl.col("target") == cfg.target_kind)
    )
    rows, unstable = [], 0
    for est in sorted(rows_all["estimator"].unique().to_list()):
        own = rows_all.filter(pl.col("estimator") == est)
        per = own.group_by("seed").agg(
            mean=pl.col("value").mean(), spread=pl.col("value").max() - pl.col("value").min()
        )
        means, spread = per.sort("seed")["mean"].to_list(), float(per["spread"].max())
        sd = float(pl.Series(means).std()) if len(means) > 1 else float("nan")
        sides = {m > 0.5 for m in means}
        moves = (sd == sd and sd > cfg.max_seed_sd) or len(sides) > 1 or spread > cfg.max_draw_spread
        unstable += moves
        rows.append(
            [
                est,
                " / ".join(_fmt(m, ".3f") for m in means),
                _fmt(sd, ".3f"),
                _fmt(spread, ".3f"),
                "yes" if moves else "no",
            ]
        )
    table = markdown_table(
        ["estimator", "per seed", "sd over seeds", "largest spread over draws", "moves"],
        rows,
    )
    verdict = (
        f"**{'Reproduces' if rows and unstable == len(rows) else 'Does not reproduce'}** here: {unstable} of "
        f"{len(rows)} targeted estimators move (sd over seeds above {cfg.max_seed_sd}, seeds on both sides of 0.5, "
        f"or a spread over draws above {cfg.max_draw_spread}; the thresholds of the checklist items "
        "stable_across_draws and stable_across_seeds)."
    )
    return "## 3. After fluency control, per-rollout results move with the seed and the draw\n", "\n".join(
        [
            f"Paper: the fluency-residualized results change from seed to seed and from draw to draw. Here: the "
            f"within-group AUC after residualizing on fluency (`{cfg.target_kind}` target, stratum `all`).\n",
            table,
            verdict + "\n",
        ]
    )


def token_finding(metrics: pl.DataFrame) -> tuple[str, str]:
    """Finding 4: the behavior-token gradient aligns with the in-context target."""
    values = per_seed(
        metrics.filter(
            (pl.col("arm") == PLANTED)
            & (pl.col("level") == "token")
            & (pl.col("stratum") == "all")
            & (pl.col("target") == "in_context")
        )
    )
    rows, aligned = [], 0
    seeds = _seeds(values)
    for seed in seeds:
        cosine = _value(values, seed, metric="token_cosine")
        null = _value(values, seed, metric="token_cosine_null")
        gap = _value(values, seed, metric="token_cosine_gap")
        draw_gaps = metrics.filter(
            (pl.col("arm") == PLANTED)
            & (pl.col("seed") == seed)
            & (pl.col("level") == "token")
            & (pl.col("stratum") == "all")
            & (pl.col("target") == "in_context")
            & (pl.col("metric") == "token_cosine_gap")
        )
        low = draw_gaps["ci_low"].min() if draw_gaps.height else None
        ok = cosine is not None and cosine > 0 and low is not None and low > 0
        aligned += ok
        rows.append([seed, _fmt(cosine, "+.3f"), _fmt(null, "+.3f"), _fmt(gap, "+.3f"), _fmt(low, "+.3f")])
    table = markdown_table(
        ["seed", "behavior tokens", "null (random other positions)", "gap", "gap's lowest 95% bound over draws"], rows
    )
    verdict = (
        f"**{'Reproduces' if seeds and aligned == len(seeds) else 'Does not reproduce'}** here: the cosine is positive "
        f"and above its null on {aligned} of {len(seeds)} seeds."
    )
    paper = " / ".join(f"{v:+.2f}" for v in REFERENCE["token_cosine"])
    return "## 4. The behavior-token gradient aligns with the in-context target\n", "\n".join(
        [f"Paper: mean cosine {paper}.\n", table, verdict + "\n"]
    )


def paper_findings(metrics: pl.DataFrame, cfg: Checklist, norms: dict[str, bool], targeted: list[str]) -> str:
    """The section: `norms` maps each `norm` instance to whether it uses the clip coefficient (the paper's
    method); `targeted` names the gradient methods (estimators with a target)."""
    planted = metrics.filter(pl.col("arm") == PLANTED)
    values = per_seed(planted)
    parts = [
        "# Paper findings\n",
        f"The four headline findings of {REFERENCE['source']}, read from this run. Each says whether it reproduces "
        "here (on the seeds' mean values over draws); a finding that does not reproduce is a result about this "
        "setting, not a failure of the run. Only the first depends on how gradients were taken: the paper's method "
        "(one sketch per step of the post-clip gradient) beside exact per-rollout capture. The others read the "
        "per-rollout sketches.\n",
    ]
    for heading, body in (
        norm_finding(values, norms, targeted),
        fluency_finding(metrics, targeted, cfg.fluency_metric),
        stability_finding(metrics, targeted, cfg),
        token_finding(metrics),
    ):
        parts += [heading, body]
    return "\n".join(parts)
