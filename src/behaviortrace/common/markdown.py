"""Markdown for the tables this project writes, and a small Markdown-to-HTML reader for the report.

The reader covers the subset these tables use (headings, pipe tables, lists, paragraphs, `code` and
**bold**), so Snakemake's report shows them as HTML without another dependency.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np

from behaviortrace.common.io import atomic_write_text


def _fmt(x: float | None) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.3f}"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) if isinstance(v, float) else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def mean_sd(values: list[float]) -> str:
    v = np.array([x for x in values if x is not None and np.isfinite(x)])
    if not len(v):
        return "–"
    sd = float(v.std(ddof=1)) if len(v) > 1 else float("nan")
    return f"{v.mean():.3f} ± {_fmt(sd)}"


def write_md_and_html(text: str, md_path: Path, html_path: Path, title: str) -> None:
    atomic_write_text(text, md_path)
    atomic_write_text(markdown_to_html(text, title), html_path)


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
    style = (
        "body{font-family:sans-serif;margin:1.5em;max-width:100em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:.2em .5em;text-align:left;font-size:90%}th{background:#eee}"
        "code{background:#f4f4f4}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(out)}</body></html>\n"
    )
