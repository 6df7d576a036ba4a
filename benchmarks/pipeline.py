"""What a finished run cost, per rule: jobs, wall time (sum, and share of all jobs), CPU time and peak
memory, read from the `benchmark:` file Snakemake writes for every job (results/{run}/benchmarks/).

    python benchmarks/pipeline.py [--run default] [--markdown out.md]

Wall times add up jobs that ran side by side, so their sum exceeds the run's elapsed time on more than
one core; the share column says where the work goes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from behaviortrace.report.cost import per_rule, read_benchmarks, to_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="default", help="run name (results/{run}/benchmarks)")
    ap.add_argument("--results", default="results", help="results folder")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    table = per_rule(read_benchmarks(Path(args.results) / args.run / "benchmarks"))
    text = to_markdown(table)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
