"""Rule targets: in-context and forced behavior targets and behavior rates for one seed and draw."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.targets import targets_job

sm = snakemake  # noqa: F821
targets_job(
    start(sm, torch_threads=True),
    seed=int(sm.wildcards.seed),
    draw=int(sm.wildcards.draw),
    checkpoints_path=Path(sm.input.checkpoints),
    probes_path=Path(sm.input.probes),
    plain_path=Path(sm.input.plain),
    out_store=Path(sm.output.store),
    out_rates=Path(sm.output.rates),
)
