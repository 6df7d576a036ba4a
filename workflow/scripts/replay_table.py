"""Rule replay_table: every replay's behavior rates, their change against the full replay, and random intervals."""

from pathlib import Path

from behaviortrace.io import setup_logging
from behaviortrace.replaytable import write_replay_table

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
write_replay_table([Path(f) for f in sm.input], Path(sm.output.table), Path(sm.output.markdown),
                   Path(sm.output.html))
