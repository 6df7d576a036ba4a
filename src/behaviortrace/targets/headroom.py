"""Headroom: how far the probe behavior rate is from saturation at each analysis checkpoint."""

from __future__ import annotations

from pathlib import Path

import polars as pl


def headroom_table(rate_files: list[Path], saturation: float) -> pl.DataFrame:
    """Probe and control behavior rate per seed, draw and checkpoint, with headroom and a saturation flag."""
    rates = pl.concat([pl.read_parquet(p) for p in rate_files])
    wide = rates.pivot(on="prompt_set", index=["seed", "draw", "step"], values="behavior_rate")
    return (
        wide.rename({"probes": "probe_rate", "plain": "plain_rate"})
        .with_columns(headroom=1 - pl.col("probe_rate"), saturated=pl.col("probe_rate") >= saturation)
        .sort("seed", "draw", "step")
    )


def headroom_markdown(table: pl.DataFrame, saturation: float) -> str:
    lines = [
        f"# Headroom: behavior rate on probes (and controls) per checkpoint; saturated at >= {saturation}",
        "",
        "| seed | draw | step | probe rate | control rate | headroom | saturated |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table.iter_rows(named=True):
        lines.append(
            f"| {r['seed']} | {r['draw']} | {r['step']} | {r['probe_rate']:.3f} | {r['plain_rate']:.3f} "
            f"| {r['headroom']:.3f} | {'yes' if r['saturated'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"
