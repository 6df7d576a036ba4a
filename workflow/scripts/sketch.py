"""Rule sketch: per-rollout gradient sketches of one seed's shard of steps into a Zarr store."""

from pathlib import Path

from behaviortrace import device
from behaviortrace.io import setup_logging
from behaviortrace.sketchstage import sketch_shard

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
device.set_threads(sm.threads)
p = sm.params
sketch_shard(shard=int(sm.wildcards.shard), rollouts_path=Path(sm.input.rollouts), steps_path=Path(sm.input.steps),
             checkpoints_path=Path(sm.input.checkpoints), base_model=Path(sm.input.base_model), out=Path(sm.output[0]),
             sketch=p.sketch, grpo=p.grpo, marker=p.marker, model_name=p.model_name, device=device.resolve(p.compute))
