"""Rule training_summary: one row per seed on behavior emergence, task reward and unfindable GT."""

import polars as pl

from behaviortrace.io import atomic_write_parquet, atomic_write_text, setup_logging
from behaviortrace.summary import seed_summary, to_markdown

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
rows = [{"arm": arm, **seed_summary(pl.read_parquet(r), pl.read_parquet(b), sm.params.window)}
        for arm, r, b in zip(sm.params.arms, sm.input.rollouts, sm.input.behavior)]
table = pl.DataFrame(rows)
atomic_write_parquet(table, sm.output.table)
text = ("# Training summary\n\nBehavior rates are the share of sampled completions that show the marker. "
        "Window end is the checkpoint right after the contamination window's last step. "
        "Base reward is the mean over the first and last tenth of training steps. The placebo arm (if any) is "
        "the same training with the bonus logged but never paid.\n\n" + to_markdown(table))
atomic_write_text(text, sm.output.markdown)
log.info("\n%s", text)
