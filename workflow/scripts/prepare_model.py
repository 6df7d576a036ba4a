"""Rule prepare_model: what one estimator that needs the model fits once per seed for all its score jobs (ekfac:
kronfluence's factors at each checkpoint; trackstar: the rollouts' projected gradients and their second moment)."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.score import prepare_model_job

sm = snakemake  # noqa: F821
prepare_model_job(
    start(sm, torch_threads=True),
    estimator=sm.wildcards.estimator,
    rollouts=Path(sm.input.rollouts),
    checkpoints=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    out=Path(sm.output[0]),
)
