"""Rule aggregate: the tidy metrics of every seed and draw, the summary, stability tables and the checklist."""

from pathlib import Path

from behaviortrace.io import setup_logging
from behaviortrace.reporting import write_aggregate

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
p = sm.params
write_aggregate(run=p.run, metric_files=list(zip(p.arms, map(Path, sm.input.metrics))),
                score_files={tuple(key): Path(path) for key, path in zip(p.score_keys, sm.input.scores)},
                training=Path(sm.input.training), replay=Path(sm.input.replay),
                shards=[Path(s) for s in sm.input.shards], checklist_cfg=p.checklist,
                outputs={k: Path(v) for k, v in sm.output.items()})
