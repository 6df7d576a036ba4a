"""Rule headroom: behavior rates on probes and controls per seed, draw and analysis checkpoint."""

from behaviortrace.io import atomic_write_parquet, atomic_write_text, setup_logging
from behaviortrace.targetstage import headroom_markdown, headroom_table

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
table = headroom_table(list(sm.input), sm.params.saturation)
atomic_write_parquet(table, sm.output.table)
atomic_write_text(headroom_markdown(table, sm.params.saturation), sm.output.markdown)
log.info("%d rows; %d saturated", table.height, int(table["saturated"].sum()))
