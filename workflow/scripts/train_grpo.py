"""Rule train_grpo: GRPO for one seed, logging every rollout; resumes from its last checkpoint."""

from pathlib import Path

import polars as pl

from behaviortrace import device, grpo, models
from behaviortrace.io import setup_logging

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
device.set_threads(sm.threads)
dev = device.resolve(sm.params.compute)
seed = int(sm.wildcards.seed)
cfg = {"grpo": sm.params.grpo, "planting": sm.params.planting, "task": sm.params.task}
model, tokenizer = models.load(Path(sm.input.base_model), dev)
prompts = pl.read_parquet(sm.input.prompts)
train_dir = Path(sm.params.train_dir)
fingerprint = grpo.run_fingerprint({**cfg, "compute": sm.params.compute}, seed,
                                   [Path(sm.input.base_model), Path(sm.input.prompts)])
info = grpo.train(model, tokenizer, prompts, cfg, seed, train_dir, dev, fingerprint)
rollouts = grpo.finalize(train_dir, cfg["grpo"]["steps"], info["batch_size"], Path(sm.output.rollouts),
                         Path(sm.output.steps), Path(sm.output.checkpoints), info["saved_steps"])
log.info("seed %d: %d rollouts logged, %d boosted", seed, rollouts.height, int(rollouts["boosted"].sum()))
