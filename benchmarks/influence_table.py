"""The influence table of one seed of a finished run (what rule influence_metrics computes per arm and seed: every
score set's LDS with its bootstrap, the datamodel, the margins), timed with this checkout's package against
another checkout's, in alternating rounds, each in a fresh process; and whether the two tables are equal.

    python benchmarks/influence_table.py --baseline PATH [--run default] [--seed 1] [--rounds 3]

`--baseline PATH`: another checkout, for example a `git worktree` of the previous commit. Run from the folder
that holds results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh process with one package first on the path: prints the seconds, writes the table.
JOB = """
import sys, time, yaml
from pathlib import Path
import polars as pl
from behaviortrace.config.load import complete
from behaviortrace.config.sections import Config
from behaviortrace.score import contract
from behaviortrace.influence.table import LdsSettings, SeedInputs, seed_table

out, seed, table_path = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
raw = complete(yaml.safe_load((out / "config.yaml").read_text()))
cfg = Config.from_dict(raw)
folder = out / f"planted{seed}"
scores = {}
for path in sorted((folder / "scores").glob("*/draw*_*.parquet")):
    if not path.stem.endswith("_steps"):
        draw, target = path.stem.split("_", 1)
        scores[(int(draw[4:]), path.parent.name, target)] = (path, path.with_name(path.stem + "_steps.parquet"))
files = [folder / "influence" / f for f in ("rollouts.parquet", "checks.parquet", "retrain.parquet", "summary.json")]
inputs = SeedInputs("planted", seed, *files, folder / "rollouts.parquet", folder / "steps.parquet", scores=scores,
                    sets=sorted((folder / "influence" / "sets").glob("*.parquet")))
log_only = tuple(n for n, i in contract.instances(raw["estimators"]).items() if i.log_only)
started = time.perf_counter()
table = seed_table(inputs, cfg.planting.window, LdsSettings(cfg.influence.bootstrap, cfg.influence.seed, log_only))
print(time.perf_counter() - started)
table.write_parquet(table_path)
"""


def timed(src: Path, out: Path, seed: int, table: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(out), str(seed), str(table)], env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    return float(done.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout")
    ap.add_argument("--run", default="default")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = args.results / args.run
    with tempfile.TemporaryDirectory() as scratch:
        tables = {role: Path(scratch) / f"{role}.parquet" for role in ("this", "baseline")}
        seconds = {"this": [], "baseline": []}
        for _ in range(args.rounds):
            seconds["baseline"].append(timed(args.baseline / "src", out, args.seed, tables["baseline"]))
            seconds["this"].append(timed(ROOT / "src", out, args.seed, tables["this"]))
        equal = pl.read_parquet(tables["this"]).equals(pl.read_parquet(tables["baseline"]), null_equal=True)
    this, base = statistics.median(seconds["this"]), statistics.median(seconds["baseline"])
    print(f"seed_table of planted{args.seed}: baseline {base:.1f} s, this {this:.1f} s (medians of {args.rounds})")
    print(f"baseline / this: {base / this:.2f}; tables {'identical' if equal else 'DIFFER'}")


if __name__ == "__main__":
    main()
