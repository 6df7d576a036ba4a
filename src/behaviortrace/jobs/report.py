"""Rules headroom, training_summary, aggregate, figures and results_page: the run's cross-seed tables, checklist and
figures, in Parquet/CSV for analysis, Markdown for reading, JSON for machines and HTML for the Snakemake
report, and the run's results on one page."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet, atomic_write_text, process_age
from behaviortrace.common.markdown import write_md_and_html
from behaviortrace.config.sections import Config
from behaviortrace.influence.table import of_semantics
from behaviortrace.report import checklist as C
from behaviortrace.report.controls import controls_markdown, fluency_markdown
from behaviortrace.report.paper import paper_findings
from behaviortrace.report.tables import (
    NOT_ESTIMATORS,
    SUMMARY_STRATA,
    collect_metrics,
    draw_stability,
    estimators_of,
    seed_stability,
    stability_markdown,
    summary_markdown,
)
from behaviortrace.report.training import TRAINING_INTRO, seed_summary, to_markdown
from behaviortrace.sketch.store import shard_checks
from behaviortrace.targets.headroom import headroom_markdown, headroom_table

log = logging.getLogger(__name__)


def headroom_job(cfg: Config, *, rate_files: list[Path], out_table: Path, out_markdown: Path) -> pl.DataFrame:
    """Behavior rates on probe and plain prompts per seed, draw and analysis checkpoint, with headroom."""
    table = headroom_table(rate_files, cfg.targets.saturation)
    atomic_write_parquet(table, out_table)
    atomic_write_text(headroom_markdown(table, cfg.targets.saturation), out_markdown)
    return table


def training_summary_job(
    cfg: Config, *, runs: list[tuple[str, Path, Path]], out_table: Path, out_markdown: Path
) -> str:
    """One row per trained (arm, rollouts, behavior) run: emergence, task reward and unfindable paid rollouts."""
    rows = [{"arm": arm, **seed_summary(pl.read_parquet(r), pl.read_parquet(b), cfg.planting)} for arm, r, b in runs]
    table = pl.DataFrame(rows)
    atomic_write_parquet(table, out_table)
    text = TRAINING_INTRO + to_markdown(table)
    atomic_write_text(text, out_markdown)
    return text


def aggregate_job(
    cfg: Config,
    *,
    metric_files: list[tuple[str, Path]],
    score_files: dict[tuple[int, str, str, int], Path],
    training: Path,
    replay: Path,
    shards: list[Path],
    log_only: list[str],
    outputs: dict[str, Path],
    influence: Path | None = None,
    norms: dict[str, bool] | None = None,
    controls: list[str] | None = None,
) -> None:
    """The tidy metrics of every arm, seed and draw, the summary, the stability tables, the checklist and the
    paper's findings; `log_only` names the log-only controls among the estimators, `norms` the norm instances
    (True: with the clip coefficient, the paper's method); `influence` is the exact-influence table."""
    run, checks = cfg.run, cfg.checklist
    metrics, replicates = collect_metrics(metric_files)
    log.info("%d metric rows from %d files", metrics.height, len(metric_files))
    atomic_write_parquet(metrics, outputs["metrics"])
    atomic_write_text(metrics.write_csv(), outputs["csv"])

    summary = summary_markdown(metrics, SUMMARY_STRATA)
    write_md_and_html(summary, outputs["summary"], outputs["summary_html"], f"Summary — {run}")

    log.info("rank correlations between draws over %d score files", len(score_files))
    draws = draw_stability(
        metrics,
        score_files,
        [
            ("step", checks.step_metric),
            ("rollout", checks.rollout_metric),
            ("rollout", "within_group_auc_fluency_resid"),
        ],
        cfg.evaluation.bootstrap,
        cfg.evaluation.seed,
    )
    log_only = [name for name in estimators_of(metrics) if name in log_only]
    seeds = seed_stability(
        metrics,
        checks.target_kind,
        checks.stratum,
        [
            ("beats_norm_step", ["norm"], "step", checks.step_metric, False),
            ("beats_norm_rollout", ["norm"], "rollout", checks.rollout_metric, False),
            ("beats_fluency_rollout", ["fluency"], "rollout", checks.fluency_metric, True),
            *(
                [
                    ("beats_log_only_step", log_only, "step", checks.step_metric, False),
                    ("beats_log_only_rollout", log_only, "rollout", checks.rollout_metric, False),
                ]
                if log_only
                else []
            ),
        ],
    )
    atomic_write_parquet(draws, outputs["draw_stability"])
    atomic_write_parquet(seeds, outputs["seed_stability"])
    write_md_and_html(
        stability_markdown(draws, seeds, checks),
        outputs["stability_md"],
        outputs["stability_html"],
        f"Stability — {run}",
    )

    write_md_and_html(
        controls_markdown(metrics, checks.target_kind, log_only)
        + "\n"
        + fluency_markdown(metrics, checks.target_kind, checks.fluency_metric, checks.fluency_strata),
        outputs["controls_md"],
        outputs["controls_html"],
        f"Controls — {run}",
    )
    table = C.build(
        metrics,
        pl.read_parquet(training),
        shard_checks(shards),
        draws,
        pl.read_parquet(replay),
        checks,
        log_only,
        of_semantics(pl.read_parquet(influence), cfg.influence.semantics) if influence else None,
        replicates,
        controls,
    )
    atomic_write_text(C.to_json(table, checks), outputs["checklist_json"])
    write_md_and_html(
        C.to_markdown(table, checks, run, cfg.influence.semantics),
        outputs["checklist"],
        outputs["checklist_html"],
        f"Checklist — {run}",
    )
    log.info("checklist, method verdicts: %s", C.counts(table))
    targeted = sorted(set(metrics.filter(pl.col("target") != "none")["estimator"].to_list()) - set(NOT_ESTIMATORS))
    write_md_and_html(
        paper_findings(metrics, checks, norms or {}, targeted),
        outputs["paper_md"],
        outputs["paper_html"],
        f"Paper findings — {run}",
    )


def figures_job(
    cfg: Config,
    *,
    metrics: Path,
    behavior: list[tuple[str, Path]],
    replay: Path,
    effect_steps: Path,
    outputs: dict[str, Path],
) -> None:
    """The run's PNG figures from the aggregated metrics, the behavior rates, the replay table and the
    per-step effect table."""
    from behaviortrace.report.figures import write_figures  # matplotlib: only the jobs that draw import it

    write_figures(
        pl.read_parquet(metrics),
        [(arm, pl.read_parquet(path)) for arm, path in behavior],
        pl.read_parquet(replay),
        cfg.planting.window,
        cfg.checklist.target_kind,
        outputs,
        pl.read_parquet(effect_steps),
        cfg.checklist.effect_target_kind,
    )


def results_page_job(
    cfg: Config, *, inputs: dict[str, Path], benchmarks: Path, estimators: set[str], outputs: dict[str, Path]
) -> None:
    """The run's results on one page (report/results_page.py), from the tables the other rules wrote, opening with
    its settings and the faithfulness table (also as its own HTML page and figure, first in the HTML report)."""
    from behaviortrace.report import faithfulness  # matplotlib: only the jobs that draw import it
    from behaviortrace.report.results_page import faithfulness_rows, jobs_of, results_page

    influence = of_semantics(pl.read_parquet(inputs.pop("influence_table")), cfg.influence.semantics)
    began = time.time() - (process_age() or 0.0)
    # The jobs that ended before this one began: a job beside it that ends while it runs would make the page depend
    # on when it read the benchmark folder.
    jobs = jobs_of(benchmarks, estimators).filter(pl.col("ended") < began)
    rows = faithfulness_rows(influence, inputs["checklist_json"], jobs)
    text = faithfulness.markdown(rows)
    truths = faithfulness.truths_markdown(influence, cfg.influence.semantics)
    faithfulness.figure(rows, outputs["faithfulness_figure"])
    write_md_and_html(text, outputs["faithfulness_md"], outputs["faithfulness_html"], f"Faithfulness — {cfg.run}")
    page = results_page(cfg.run, faithfulness_md=text, truths_md=truths, jobs=jobs, **inputs)
    atomic_write_text(page, outputs["page"])
    log.info("results page written to %s", outputs["page"])
