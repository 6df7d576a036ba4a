"""Helpers for tests/slurm/run_cluster.sh: inputs for the run on the local SLURM, and the checks after it.

cluster_check.py prepare WORK PROFILE_DIR CPUS MEM_MB
    writes WORK/config.yaml (the test suite's small config, one seed) and PROFILE_DIR/config.yaml, a
    profile layered over profiles/slurm that fits its resources to this node and checks job status
    with squeue (there is no accounting database).
cluster_check.py verify WORK SNAKEMAKE_LOG JOBCOMP_FILE
    checks that the run's outputs exist, that every job of the run was submitted to SLURM and
    completed there, and prints one line per SLURM job.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

RUN = "slurm"


def prepare(work: Path, profile_dir: Path, cpus: int, mem_mb: int) -> None:
    import yte

    from behaviortrace.tools.small_runs import small_config

    cfg = small_config()
    cfg.update(run=RUN, seeds=[0])
    cfg["planting"]["fraction"] = 1.0  # enough paid rollouts in six steps for every metric
    # One draw and one target kind: every rule and estimator still runs, with a third of the score jobs.
    cfg["targets"]["draws"] = 1
    cfg["evaluation"]["target_kinds"] = ["in_context"]
    cfg["checklist"]["effect_target_kind"] = "in_context"  # the only target kind scored here
    # Where the workflow has them: no placebo arm (it would double the run) and the fewest replays.
    if "placebo" in cfg:
        cfg["placebo"]["enabled"] = False
    if "replay" in cfg:
        cfg["replay"].update(estimators=[], removal_percent=[100], random_repeats=1)
    if "influence" in cfg:
        cfg["influence"].update(sets=[], lds_subsets=3)  # no replayed estimator's set; the smallest LDS
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    # The real profile, as Snakemake reads it, with each job's memory and CPUs cut to fit this node:
    # two one-CPU jobs side by side. Everything else (executor, rules, runtimes, GPU handling) is kept.
    with open(ROOT / "profiles" / "slurm" / "config.yaml") as f:
        profile = yte.process_yaml(f, require_use_yte=True)
    per_job_mem = mem_mb // max(1, cpus)

    def fit(resources: dict) -> dict:
        out = dict(resources)
        if "mem_mb" in out:
            out["mem_mb"] = min(int(out["mem_mb"]), per_job_mem)
        for key in ("cpus_per_task", "cpus_per_gpu"):
            if key in out:
                out[key] = min(int(out[key]), cpus)
        return out

    layer = {
        "default-resources": fit(profile["default-resources"]),
        "set-resources": {rule: fit(res) for rule, res in profile["set-resources"].items()},
        "retries": 0,  # a failure here is a failure, not something to retry
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 2,
        "seconds-between-status-checks": 2,
        "slurm-keep-successful-logs": True,
    }
    profile_dir.mkdir(parents=True, exist_ok=True)
    (profile_dir / "config.yaml").write_text(yaml.safe_dump(layer, sort_keys=False))
    print(
        f"config: {work / 'config.yaml'} (run {RUN!r}, seeds {cfg['seeds']}, {cfg['grpo']['steps']} GRPO steps, "
        f"{cfg['targets']['draws']} draw)"
    )
    print(f"local profile layer: {profile_dir / 'config.yaml'} (mem_mb at most {per_job_mem}, CPUs at most {cpus})")


def expected_outputs(cfg: dict) -> list[Path]:
    """What `rule all` asks for, plus the per-seed files every later stage is built on."""
    out = Path("results") / cfg["run"]
    n_shards = math.ceil(cfg["grpo"]["steps"] / cfg["sketch"]["shard_steps"])
    paths = [out / "tables" / "training.md", out / "tables" / "headroom.md"]
    for seed in cfg["seeds"]:
        s = out / f"planted{seed}"
        paths += [s / "rollouts.parquet", s / "steps.parquet", s / "checkpoints.json", s / "behavior.parquet"]
        paths += [s / "sketch" / f"shard{i:03d}.zarr" for i in range(n_shards)]
        for draw in range(cfg["targets"]["draws"]):
            paths += [s / "targets" / f"draw{draw}.zarr", s / "metrics" / f"draw{draw}.parquet"]
    return paths


def parse_jobcomp(path: Path) -> dict[str, dict[str, str]]:
    """SLURM's own record of finished jobs (JobCompType=jobcomp/filetxt): one line of key=value per job."""
    records = {}
    for line in path.read_text().splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            records[fields["JobId"]] = fields
    return records


def verify(work: Path, log_path: Path, jobcomp_path: Path) -> int:
    import polars as pl

    from behaviortrace.sketch.store import read_rows

    problems = []
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    log = log_path.read_text()

    missing = [str(p) for p in expected_outputs(cfg) if not (work / p).exists()]
    if missing:
        problems.append(f"missing outputs: {missing}")
    else:
        g = cfg["grpo"]
        rollouts = pl.read_parquet(work / "results" / RUN / "planted0" / "rollouts.parquet")
        want = g["steps"] * g["prompts_per_step"] * g["num_generations"]
        if rollouts.height != want:
            problems.append(f"rollouts.parquet has {rollouts.height} rows, expected {want}")
        shards = sorted((work / "results" / RUN / "planted0" / "sketch").glob("shard*.zarr"))
        rows = read_rows(shards, with_sketches=False)[0]
        if sorted(rows["rollout_id"].tolist()) != sorted(rollouts["rollout_id"].to_list()):
            problems.append("the sketch shards do not hold exactly the logged rollouts")
        metrics = pl.read_parquet(work / "results" / RUN / "planted0" / "metrics" / "draw0.parquet")
        if not set(cfg["estimators"]) <= set(metrics["estimator"]):
            problems.append(f"metrics lack estimators: {set(cfg['estimators']) - set(metrics['estimator'])}")

    # Every job Snakemake ran, except the target rule `all` (it has no action and runs in Snakemake
    # itself), must have gone through sbatch.
    submitted = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (\S+)\)", log)
    done = re.findall(r"(\d+) of (\d+) steps \(100%\) done", log)
    if not done:
        problems.append("the Snakemake log does not report all steps done")
        total = None
    else:
        total = int(done[-1][1])
        if len(submitted) != total - 1:
            problems.append(
                f"{len(submitted)} jobs were submitted to SLURM, but the run had {total - 1} jobs besides `all`"
            )
    if not submitted:
        problems.append("no job was submitted to SLURM")

    records = parse_jobcomp(jobcomp_path) if jobcomp_path.exists() else {}
    ids = [slurm_id for _, slurm_id, _ in submitted]
    if len(set(ids)) != len(ids):
        problems.append("a SLURM job id was reported twice")
    unknown = sorted(set(records) - set(ids), key=int)
    if unknown:
        problems.append(f"SLURM ran jobs this run did not submit: {unknown}")

    print(f"{'slurm id':>8}  {'rule':<16} {'wildcards':<36} {'state':<10} {'exit':<5} {'secs':>5}")
    n_completed = 0
    for _, slurm_id, logfile in sorted(submitted, key=lambda s: int(s[1])):
        parts = Path(logfile).parts
        i = next(k for k, p in enumerate(parts) if p.startswith("rule_"))
        rule = parts[i][len("rule_") :]
        wildcards = parts[i + 1] if i + 2 < len(parts) else ""
        rec = records.get(slurm_id, {})
        state, exit_code = rec.get("JobState", "(none)"), rec.get("ExitCode", "")
        secs = ""
        if rec.get("StartTime") and rec.get("EndTime"):
            from datetime import datetime

            secs = str(
                int((datetime.fromisoformat(rec["EndTime"]) - datetime.fromisoformat(rec["StartTime"])).total_seconds())
            )
        print(f"{slurm_id:>8}  {rule:<16} {wildcards:<36} {state:<10} {exit_code:<5} {secs:>5}")
        if state == "COMPLETED" and exit_code == "0:0":
            n_completed += 1
        else:
            problems.append(f"SLURM job {slurm_id} ({rule} {wildcards}) ended {state} {exit_code}")
        if rec and Path(rec.get("WorkDir", "")).resolve() != work.resolve():
            problems.append(f"SLURM job {slurm_id} ran in {rec.get('WorkDir')}, not in {work}")

    print(
        f"jobs in the run: {total}; submitted to SLURM: {len(submitted)}; "
        f"completed in SLURM's job record: {n_completed}"
    )
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["prepare"] and len(argv) == 5:
        prepare(Path(argv[1]), Path(argv[2]), int(argv[3]), int(argv[4]))
        return 0
    if argv[:1] == ["verify"] and len(argv) == 4:
        return verify(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
