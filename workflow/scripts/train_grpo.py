"""Rule train_grpo: GRPO for one seed, logging (and with sketch.mode: train, sketching) every rollout."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.train import train_job

sm = snakemake  # noqa: F821
train_job(
    start(sm, torch_threads=True),
    seed=int(sm.wildcards.seed),
    base_model=Path(sm.input.base_model),
    prompts=Path(sm.input.prompts),
    probes=Path(sm.input.probes),
    train_dir=Path(sm.params.train_dir),
    rollouts_path=Path(sm.output.rollouts),
    steps_path=Path(sm.output.steps),
    manifest_path=Path(sm.output.checkpoints),
    shards=[Path(p) for p in sm.output.shards],
)
