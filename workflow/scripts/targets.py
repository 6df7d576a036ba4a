"""Rule targets: in-context and forced behavior targets and behavior rates for one seed, every draw."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.targets import targets_job

sm = snakemake  # noqa: F821
targets_job(
    start(sm, torch_threads=True),
    seed=int(sm.wildcards.seed),
    draws=[int(d) for d in sm.params.draws],
    checkpoints_path=Path(sm.input.checkpoints),
    probes_path=Path(sm.input.probes),
    plain_path=Path(sm.input.plain),
    out_stores=[Path(p) for p in sm.output.stores],
    out_rates=[Path(p) for p in sm.output.rates],
)
