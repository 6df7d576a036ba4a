"""The fixed cost of a job: a fresh interpreter importing what a rule's script imports, before any work, times the
rule's jobs in a finished run, against the run's own job wall times.

    python benchmarks/job_startup.py [--run default] [--repeats 5] [--baseline PATH]

Each rule's script (workflow/scripts, found through its rule's `script:`) is timed as Snakemake starts it: a new
Python process that imports the project modules the script imports, median of `--repeats`. `--baseline PATH` times
the same scripts again with the package of another checkout first on the path (for example a `git worktree` of the
previous commit), taking turns, and prints each rule's ratio. What a job does after its imports (reading, computing,
writing) is the rest of its wall time in the run's benchmark files (benchmarks/pipeline.py).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from behaviortrace.report.cost import read_benchmarks

ROOT = Path(__file__).resolve().parents[1]


def script_of_rules(rules: Path) -> dict[str, str]:
    """rule name -> its script's stem, from the rule files."""
    found = {}
    for smk in sorted(rules.glob("*.smk")):
        for name, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(), re.M):
            script = re.search(r'"\.\./scripts/(\w+)\.py"', body)
            if script:
                found[name] = script.group(1)
    return found


def imports_of(script: Path) -> list[str]:
    tree = ast.parse(script.read_text())
    return sorted({n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} - {"__future__"})


def start_up(modules: list[str], src: Path | None) -> float:
    """Wall seconds of a fresh interpreter that imports `modules` (with `src` first on the path)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    code = "".join(f"import {m}\n" for m in modules)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="default", help="run name (results/{run}/benchmarks): jobs per rule")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout: its src/ is timed too, taking turns")
    args = ap.parse_args()
    jobs = read_benchmarks(args.results / args.run / "benchmarks")
    scripts = script_of_rules(ROOT / "workflow" / "rules")
    baseline = args.baseline / "src" if args.baseline else None
    rows, total_fixed, total_base = [], 0.0, 0.0
    for rule in sorted(set(jobs["rule"].to_list()) & set(scripts)):
        modules = imports_of(ROOT / "workflow" / "scripts" / f"{scripts[rule]}.py")
        own, base = [], []
        for _ in range(args.repeats):
            own.append(start_up(modules, ROOT / "src"))
            if baseline is not None:
                base.append(start_up(modules, baseline))
        of_rule = jobs.filter(jobs["rule"] == rule)
        n, wall = of_rule.height, float(of_rule["wall_s"].sum())
        per_job = statistics.median(own)
        total_fixed += n * per_job
        row = [rule, str(n), f"{wall:.0f}", f"{per_job:.2f}", f"{n * per_job:.0f}", f"{n * per_job / wall:.0%}"]
        if baseline is not None:
            before = statistics.median(base)
            total_base += n * before
            row += [f"{before:.2f}", f"{before / per_job:.2f}"]
        rows.append(row)
    header = ["rule", "jobs", "wall s (run)", "start-up s per job", "start-up s (all jobs)", "share of wall"]
    if baseline is not None:
        header += ["baseline start-up s per job", "baseline / this"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    wall = float(jobs["wall_s"].sum())
    share = total_fixed / wall
    print(f"\nstart-up over all {jobs.height} jobs: {total_fixed:.0f} s of {wall:.0f} s of job wall time ({share:.0%})")
    if baseline is not None:
        print(f"baseline: {total_base:.0f} s; baseline / this {total_base / total_fixed:.2f}")


if __name__ == "__main__":
    main()
