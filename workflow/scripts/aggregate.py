"""Rule aggregate: the tidy metrics of every seed and draw, the summary, stability tables and the checklist."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.report import aggregate_job

sm = snakemake  # noqa: F821
aggregate_job(
    start(sm),
    metric_files=list(zip(sm.params.arms, map(Path, sm.input.metrics), strict=False)),
    score_files={tuple(key): Path(path) for key, path in zip(sm.params.score_keys, sm.input.scores, strict=False)},
    training=Path(sm.input.training),
    replay=Path(sm.input.replay),
    influence=Path(sm.input.influence),
    shards=[Path(s) for s in sm.input.shards],
    log_only=sm.params.log_only,
    controls=sm.params.controls,
    norms=dict(sm.params.norms),
    outputs={k: Path(v) for k, v in sm.output.items()},
)
