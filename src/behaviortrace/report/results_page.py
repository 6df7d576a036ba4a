"""One page of a run's results (results/{run}/results.md), assembled from the run's own tables: the checklist,
the training summary, what the label can and cannot show, the leave-out replay, the exact influence, the
paper's findings and what each rule cost. Every
number on it comes from files of that run; `make results-page` copies the default run's page to docs/."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from behaviortrace.config import record
from behaviortrace.config.sections import Config
from behaviortrace.report import checklist as C
from behaviortrace.report import faithfulness
from behaviortrace.report.cost import (
    configured,
    elapsed_seconds,
    estimator_markdown,
    fixed_share,
    per_estimator,
    per_rule,
    read_benchmarks,
)
from behaviortrace.report.cost import to_markdown as cost_markdown


def _body(path: Path, stop: str | None = None) -> str:
    """A Markdown file without its first heading (and from `stop` on), its headings one level down."""
    return _body_text(Path(path).read_text(), stop)


def _body_text(text: str, stop: str | None = None) -> str:
    lines = text.splitlines()
    if stop is not None and stop in lines:
        lines = lines[: lines.index(stop)]
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(f"#{line}" if line.startswith("#") else line for line in lines).strip() + "\n"


def settings_section(config: Path) -> str:
    """What the run ran with (its config record, results/{run}/config.yaml): the settings a reader needs first."""
    import yaml

    cfg = Config.from_dict(yaml.safe_load(Path(config).read_text()))
    return (
        "## Settings\n\n"
        + record.settings_markdown(cfg, record.read_header(config))
        + f"\nEvery key is in `results/{cfg.run}/config.yaml` (usable as `--configfile`).\n"
    )


def jobs_of(benchmarks: Path, estimators: set[str]) -> pl.DataFrame:
    """The run's jobs from their benchmark files, of the configured estimator instances only."""
    return configured(read_benchmarks(Path(benchmarks)), estimators)


def faithfulness_rows(influence: pl.DataFrame, checklist_json: Path, jobs: pl.DataFrame) -> pl.DataFrame:
    """The faithfulness table (report/faithfulness.py) of a run, with each row's cost from its jobs."""
    checklist = json.loads(Path(checklist_json).read_text())
    target = checklist["thresholds"]["effect_target_kind"]
    costs = {r["estimator"]: r["wall_s"] for r in per_estimator(jobs).iter_rows(named=True)}
    return faithfulness.table(influence, checklist, target, costs)


def startup_sentence(jobs: pl.DataFrame) -> str:
    """The jobs' fixed cost: their start-up as each logged it (common/io.py), and its share of their wall time."""
    startup, share, logged = fixed_share(jobs)
    if not logged:
        return "Its jobs did not log their start-up (a version before the jobs did)."
    return (
        f"The start-up of its jobs (interpreter, Snakemake's script preamble and imports, as {logged} of "
        f"{jobs.height} jobs logged it) is {startup:.0f} s, {share:.1%} of their summed wall time: the fixed cost "
        "that grows with the number of jobs."
    )


def results_page(
    run: str,
    *,
    config: Path,
    faithfulness_md: str,
    truths_md: str,
    checklist: Path,
    checklist_json: Path,
    training: Path,
    controls: Path,
    replay: Path,
    influence: Path,
    paper: Path,
    jobs: pl.DataFrame,
) -> str:
    counts = json.loads(Path(checklist_json).read_text())["counts"]  # method verdicts only
    tally = "method verdicts: " + C.headline(counts)
    cost = per_rule(jobs)
    parts = [
        f"# Results of run `{run}`\n",
        "Written by the workflow (rule `results_page`) from this run's own tables under "
        f"`results/{run}/`; the HTML report holds the same with the figures.\n",
        settings_section(config),
        "## Faithfulness: does a row predict what removing data does?\n",
        _body_text(faithfulness_md),
        "![faithfulness](figures/faithfulness.png)\n",
        "## Which causal truth judges what\n",
        truths_md,
        f"## Checklist ({tally})\n",
        _body(checklist, "## The numbers behind each verdict"),
        "## Training\n",
        _body(training),
        "## What the planted label can and cannot show\n",
        _body(controls),
        "## Leave-out replay\n",
        _body(replay),
        "## Exact influence\n",
        _body(influence),
        "## Paper findings\n",
        _body(paper),
        "## What each rule cost\n",
        f"The run took {elapsed_seconds(jobs) / 60:.1f} min of wall time, from its first job's start to the end of the "
        "last job before this page (a run resumed later counts the time between). " + startup_sentence(jobs) + "\n",
        "Summed over jobs (jobs side by side on several cores add up): wall time from Snakemake's benchmark files, CPU "
        "time and peak memory from each job's own count at its end (its log's last line; Snakemake's benchmark file "
        "samples a job every 30 s).\n",
        cost_markdown(cost),
        "Per estimator instance: its preparation and score jobs over every seed, draw and target, what rerunning it "
        "alone costs.\n",
        estimator_markdown(per_estimator(jobs)),
    ]
    return "\n".join(parts)
