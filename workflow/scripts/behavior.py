"""Rule behavior: behavior rate on probe and plain prompts at every saved checkpoint of one seed."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.behavior import behavior_job

sm = snakemake  # noqa: F821
behavior_job(
    start(sm, torch_threads=True),
    seed=int(sm.wildcards.seed),
    checkpoints_path=Path(sm.input.checkpoints),
    probes_path=Path(sm.input.probes),
    plain_path=Path(sm.input.plain),
    out=Path(sm.output[0]),
)
