"""The aggregate stage: read every seed's metrics, write the cross-seed tables and the checklist, in
Parquet/CSV for analysis, Markdown for reading, JSON for machines and HTML for the Snakemake report."""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path

import polars as pl
import zarr

from . import checklist as C
from .aggregate import collect_metrics, draw_stability, markdown_table, seed_stability, summary_markdown
from .io import atomic_write_parquet, atomic_write_text

log = logging.getLogger(__name__)
SUMMARY_STRATA = ["all", "below_saturation", "saturated"]


def shard_checks(paths: list[Path]) -> list[dict]:
    """What each sketch job recorded about its own coverage and self-check."""
    out = []
    for path in paths:
        attrs = zarr.open_group(path, mode="r").attrs
        out.append({"path": str(path), "n_params": attrs.get("n_params"), "n_trainable": attrs.get("n_trainable"),
                    "self_check_error": attrs.get("self_check_error")})
    return out


def stability_markdown(draws: pl.DataFrame, seeds: pl.DataFrame, cfg: dict) -> str:
    parts = ["# Stability across generation draws and seeds\n",
             "## Across draws\n",
             "Per seed: the lowest Spearman rank correlation of an estimator's rollout scores between two "
             "generation draws (the draws resample the probe completions that build the targets; target-free "
             "controls do not depend on them), and the spread (max − min) of its metrics across draws, "
             "stratum `all`.\n"]
    cols = [c for c in draws.columns if c not in ("draws",)]
    parts.append(markdown_table(cols, [list(r) for r in draws.select(cols).iter_rows()]))
    parts += ["## Across seeds\n",
              f"On how many seeds each estimator's interval lies wholly above the control's, on every draw "
              f"(target `{cfg['target']}`, stratum `{cfg['stratum']}`; step level: `{cfg['step_metric']}`, "
              f"rollout level: `{cfg['rollout_metric']}`, fluency: `{cfg['fluency_metric']}`). "
              "– marks the control itself.\n"]
    parts.append(markdown_table(seeds.columns, [["–" if v is None else v for v in r] for r in seeds.iter_rows()]))
    return "\n".join(parts)


def write_aggregate(*, run: str, metric_files: list[tuple[str, Path]], score_files: dict, training: Path,
                    replay: Path, shards: list[Path], checklist_cfg: dict, outputs: dict[str, Path]) -> None:
    metrics = collect_metrics(metric_files)
    log.info("%d metric rows from %d files", metrics.height, len(metric_files))
    atomic_write_parquet(metrics, outputs["metrics"])
    atomic_write_text(metrics.write_csv(), outputs["csv"])

    summary = summary_markdown(metrics, SUMMARY_STRATA)
    write_md_and_html(summary, outputs["summary"], outputs["summary_html"], f"Summary — {run}")

    log.info("rank correlations between draws over %d score files", len(score_files))
    cfg = checklist_cfg
    draws = draw_stability(metrics, score_files, [("step", cfg["step_metric"]), ("rollout", cfg["rollout_metric"]),
                                                  ("rollout", "within_group_auc_fluency_resid")])
    seeds = seed_stability(metrics, cfg["target"], cfg["stratum"], [
        ("beats_norm_step", "norm", "step", cfg["step_metric"]),
        ("beats_norm_rollout", "norm", "rollout", cfg["rollout_metric"]),
        ("beats_fluency_rollout", "fluency", "rollout", cfg["fluency_metric"]),
    ])
    atomic_write_parquet(draws, outputs["draw_stability"])
    atomic_write_parquet(seeds, outputs["seed_stability"])
    write_md_and_html(stability_markdown(draws, seeds, cfg), outputs["stability_md"], outputs["stability_html"],
                       f"Stability — {run}")

    table = C.build(metrics, pl.read_parquet(training), shard_checks(shards), draws, pl.read_parquet(replay), cfg)
    atomic_write_text(C.to_json(table, cfg), outputs["checklist_json"])
    write_md_and_html(C.to_markdown(table, cfg, run), outputs["checklist"], outputs["checklist_html"],
                       f"Checklist — {run}")
    log.info("checklist: %s", C.verdict_counts(table))


def write_md_and_html(text: str, md_path: Path, html_path: Path, title: str) -> None:
    atomic_write_text(text, md_path)
    atomic_write_text(markdown_to_html(text, title), html_path)


# A small Markdown reader for the subset these tables use (headings, pipe tables, lists, paragraphs,
# `code` and **bold**), so the report shows them as HTML without another dependency.

LIST_ITEM = re.compile(r"^(- |\d+\. )")


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_to_html(text: str, title: str) -> str:
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(line))
            body, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                body.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(lines[i])) + "</tr>")
                i += 1
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
            continue
        elif LIST_ITEM.match(line):
            tag = "ul" if line.startswith("- ") else "ol"
            items = []
            while i < len(lines) and LIST_ITEM.match(lines[i]):
                items.append(f"<li>{_inline(LIST_ITEM.sub('', lines[i]))}</li>")
                i += 1
            out.append(f"<{tag}>{''.join(items)}</{tag}>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    style = ("body{font-family:sans-serif;margin:1.5em;max-width:100em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #bbb;padding:.2em .5em;text-align:left;font-size:90%}th{background:#eee}"
             "code{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(out)}</body></html>\n")
