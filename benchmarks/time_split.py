"""Where a replay job's and an influence job's time goes: forward passes, backward passes, the optimizer (clipping
and AdamW), sampling (the replay's behavior measurement, the influence's f), I/O (models, tables, saved states),
and the rest, from rerunning one job of a finished run with timers around those functions.

    python benchmarks/time_split.py [--run default] [--seed 1] [--removal gas] [--skip-influence]

The jobs run exactly as the workflow runs them (their stage functions, the run's own whole config from
results/{run}/config.yaml), writing into a temporary folder; the run's files are only read. Each second is
charged to the innermost timed function running (a model load inside a checkpoint check counts as I/O once),
so the phases add up to the job's wall time. The influence job's own phase timings (its summary's `seconds`:
forward sweep, backward sweep, finite differences, LDS retraining) are printed beside.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import polars as pl
import torch
import yaml

from behaviortrace.config.load import complete
from behaviortrace.config.sections import Config


class Phases:
    """Exclusive wall time per phase: a second goes to the innermost timed call running."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.stack: list[str] = ["other"]
        self.mark = time.perf_counter()

    def _charge(self) -> None:
        now = time.perf_counter()
        self.seconds[self.stack[-1]] += now - self.mark
        self.mark = now

    def timed(self, phase: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self._charge()
            self.stack.append(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self._charge()
                self.stack.pop()

        return wrapper

    def patch(self, owner, name: str, phase: str) -> None:
        """Time `owner.name`, and every loaded module's own reference to the same function."""
        original = getattr(owner, name)
        wrapped = self.timed(phase, original)
        setattr(owner, name, wrapped)
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("behaviortrace") and getattr(module, name, None) is original:
                setattr(module, name, wrapped)

    def table(self, title: str) -> str:
        self._charge()
        total = sum(self.seconds.values())
        lines = [f"### {title}: {total:.1f} s", "", "| phase | s | share |", "|---|---|---|"]
        for phase, s in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {phase} | {s:.1f} | {s / total:.0%} |")
        return "\n".join(lines) + "\n"


def instrument() -> Phases:
    """Timers around the functions a replay and an influence job spend their time in."""
    import behaviortrace.behavior.rates as rates
    import behaviortrace.gradients.batch as batch
    import behaviortrace.influence.adjoint  # noqa: F401  (loaded first, so that its references are patched too)
    import behaviortrace.influence.batched  # noqa: F401
    import behaviortrace.influence.metagradient as metagradient
    import behaviortrace.influence.objective as objective
    import behaviortrace.influence.trajectory as trajectory
    import behaviortrace.jobs.influence  # noqa: F401
    import behaviortrace.jobs.replay  # noqa: F401
    import behaviortrace.model.models as models
    import behaviortrace.replay.retrain  # noqa: F401

    phases = Phases()
    phases.patch(batch, "completion_logps", "forward")
    phases.patch(torch.Tensor, "backward", "backward")
    phases.patch(torch.autograd, "grad", "backward")
    phases.patch(torch.nn.utils, "clip_grad_norm_", "optimizer")
    phases.patch(torch.optim.AdamW, "step", "optimizer")
    phases.patch(rates, "behavior_rates", "sampling")
    phases.patch(objective.ForcedTarget, "value", "sampling")
    phases.patch(models, "load", "I/O")
    phases.patch(pl, "read_parquet", "I/O")
    phases.patch(metagradient.StateStore, "save", "I/O")
    phases.patch(metagradient.StateStore, "load", "I/O")
    phases.patch(trajectory.State, "load", "I/O")
    return phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="default")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--seed", type=int, default=1, help="a planted seed of the run")
    ap.add_argument("--removal", default="gas", help="the replay's removal (an estimator of replay.estimators, full)")
    ap.add_argument("--skip-influence", action="store_true")
    args = ap.parse_args()
    out = args.results / args.run
    cfg = Config.from_dict(complete(yaml.safe_load((out / "config.yaml").read_text())))
    torch.set_num_threads(1)  # as the workflow's jobs run (threads: 1)
    from behaviortrace.common.io import setup_logging

    setup_logging(None)
    seed_dir = out / f"planted{args.seed}"
    inputs = {
        "rollouts_path": seed_dir / "rollouts.parquet",
        "checkpoints_path": seed_dir / "checkpoints.json",
        "base_model": out / "base_model",
        "probes_path": out / "data" / "probe_prompts.parquet",
    }
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        phases = instrument()
        from behaviortrace.jobs.replay import replay_job

        scores = seed_dir / "scores" / args.removal / f"draw{cfg.replay.draw}_{cfg.replay.target_kind}.parquet"
        replay_job(
            cfg,
            seed=args.seed,
            removal=args.removal,
            pct=cfg.replay.removal_percent[0],
            scores_path=scores if args.removal != "full" else None,
            plain_path=out / "data" / "plain_prompts.parquet",
            out=scratch / "replay.parquet",
            semantics=cfg.influence.semantics,
            **inputs,
        )
        print(phases.table(f"replay of planted{args.seed}, {args.removal} (its set and its random sets)"))
        if args.skip_influence:
            return
        phases = instrument()
        from behaviortrace.jobs.influence import influence_job

        influence_job(
            cfg,
            arm="planted",
            seed=args.seed,
            steps_path=seed_dir / "steps.parquet",
            **{
                f"out_{name}": scratch / f"influence_{name}.parquet"
                for name in ("rollouts", "steps", "checks", "retrain")
            },
            out_summary=scratch / "summary.json",
            label_percents=tuple(cfg.replay.removal_percent),
            replay_seed=cfg.replay.seed,
            **inputs,
        )
        print(phases.table(f"influence of planted{args.seed}"))
        seconds = json.loads((scratch / "summary.json").read_text())["seconds"]
        print("The job's own timings (summary.json `seconds`):", {k: round(v, 1) for k, v in seconds.items()})


if __name__ == "__main__":
    main()
