"""Rule sketch: per-rollout gradient sketches of one seed's shard of steps into a Zarr store."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.sketch import sketch_job

sm = snakemake  # noqa: F821
sketch_job(
    start(sm, torch_threads=True),
    shard=int(sm.wildcards.shard),
    rollouts_path=Path(sm.input.rollouts),
    steps_path=Path(sm.input.steps),
    checkpoints_path=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    out=Path(sm.output[0]),
)
