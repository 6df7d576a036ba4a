"""The "Paper findings" section: its numbers recomputed from the metrics table of the small workflow run, and
each finding's verdict going both ways on metrics built to reproduce it and not to."""

import polars as pl
import pytest

from behaviortrace.config.sections import Checklist
from behaviortrace.report import paper


@pytest.fixture(scope="module")
def out(finished_run):
    return finished_run[0] / "results" / "wf"


def _row(seed, estimator, level, metric, value, *, stratum="all", target="none", draw=0, low=None, high=None):
    return {
        "run": "t",
        "arm": "planted",
        "seed": seed,
        "draw": draw,
        "estimator": estimator,
        "target": target,
        "level": level,
        "stratum": stratum,
        "metric": metric,
        "value": value,
        "ci_low": value - 0.01 if low is None else low,
        "ci_high": value + 0.01 if high is None else high,
        "n": 100,
    }


def _metrics(norm_lift: float, fluency_auc: float, token: float) -> pl.DataFrame:
    rows = []
    for seed in (0, 1, 2):
        rows += [
            _row(seed, "norm_post_clip", "step_summed", "lift_paid_steps", norm_lift),
            _row(seed, "norm_post_clip", "step_summed", "precision_at_paid_steps", norm_lift * 0.1),
            _row(seed, "norm", "step", "lift_paid_steps", 1.5),
            _row(seed, "gas", "step", "lift_paid_steps", 3.0, target="in_context"),
            _row(seed, "step_reward_variance", "step", "lift_paid_steps", 3.5),
            # the label itself: never the "strongest log-only control" of finding 1.
            _row(seed, "step_paid", "step", "lift_paid_steps", 10.0),
            # The harness's own step metric: not what finding 1 reads.
            _row(seed, "norm_post_clip", "step_summed", "lift", 0.5),
            _row(seed, "gas", "step", "chance_paid_steps", 0.1, target="in_context"),
            _row(seed, "fluency", "rollout", "auroc", fluency_auc, stratum="saturated"),
            _row(seed, "gas", "rollout", "auroc", 0.62, stratum="saturated", target="in_context"),
            _row(seed, "gas", "rollout", "within_group_auc_fluency_resid", 0.4 + 0.1 * seed, target="in_context"),
            _row(seed, "behavior_tokens", "token", "token_cosine", token, target="in_context"),
            _row(seed, "behavior_tokens", "token", "token_cosine_null", 0.0, target="in_context"),
            _row(seed, "behavior_tokens", "token", "token_cosine_gap", token, target="in_context"),
        ]
    return pl.DataFrame(rows)


def _verdicts(text: str) -> list[str]:
    return [line.split("**")[1] for line in text.splitlines() if line.startswith("**")]


def test_each_finding_can_reproduce_and_fail_to():
    norms, targeted, cfg = {"norm_post_clip": True, "norm": False}, ["gas"], Checklist()
    # The norm above the best targeted estimator; fluency at 0.3 (0.7 both ways) above gas's 0.62; aligned tokens.
    yes = paper.paper_findings(_metrics(4.0, 0.3, 0.2), cfg, norms, targeted)
    # The norm at chance; fluency at 0.45 (0.55 both ways) below gas; tokens against the target.
    no = paper.paper_findings(_metrics(1.0, 0.45, -0.1), cfg, norms, targeted)
    # Finding 3 (the residualized AUC on both sides of 0.5 across seeds) moves in both tables.
    assert _verdicts(yes) == ["Reproduces"] * 4
    assert _verdicts(no) == ["Does not reproduce", "Does not reproduce", "Reproduces", "Does not reproduce"]
    assert "| 0 | 0.40 | 0.10 | 4.00 | 1.50 | gas 3.00 | step_reward_variance 3.50 |" in yes
    assert "0.300 → 0.700" not in yes and "| saturated | 0 | 0.30 | 0.70 | gas 0.62 |" in yes


def test_paper_findings_page_recomputed_from_the_run(finished_run, out):
    _, cfg = finished_run
    page = (out / "tables" / "paper_findings.md").read_text()
    assert page.count("\n## ") == 4 and "Paper: mean cosine +0.23 / +0.11 / +0.30." in page
    assert "## Paper findings" in (out / "results.md").read_text()
    metrics = pl.read_parquet(out / "tables" / "metrics.parquet").filter(pl.col("arm") == "planted")
    token = metrics.filter(
        (pl.col("level") == "token") & (pl.col("stratum") == "all") & (pl.col("target") == "in_context")
    )
    aligned = 0
    for seed in cfg["seeds"]:
        own = token.filter(pl.col("seed") == seed)
        cosine = own.filter(pl.col("metric") == "token_cosine")["value"].mean()
        low = own.filter(pl.col("metric") == "token_cosine_gap")["ci_low"].min()
        assert f"| {seed} | {cosine:+.3f} |" in page
        aligned += cosine > 0 and low > 0
    section = page[page.index("## 4.") :]
    expected = "Reproduces" if aligned == len(cfg["seeds"]) else "Does not reproduce"
    assert f"**{expected}** here: the cosine is positive and above its null on {aligned} of" in section
