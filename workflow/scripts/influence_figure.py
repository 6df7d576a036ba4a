"""Rule influence_figure: each estimator's Spearman correlation with the exact influence, per planted seed and draw."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.influence import influence_figure_job

sm = snakemake  # noqa: F821
influence_figure_job(start(sm), table=Path(sm.input.table), log_only=list(sm.params.log_only), out=Path(sm.output[0]))
