# Config validation and path helpers shared by every rule. Validation runs at parse time, so a bad
# config stops the workflow before any job starts.

import os
import sys
from pathlib import Path

# The package lives in src/; jobs (scripts, conda envs, cluster jobs) find it through PYTHONPATH.
_SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, _SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p)

from snakemake.exceptions import WorkflowError
from behaviortrace.config import ConfigError, validate as _validate_config

try:
    _validate_config(config)
except ConfigError as err:
    raise WorkflowError(str(err)) from None

RUN = config["run"]
CONDA_ENV = "../../envs/behaviortrace.yaml"
SEEDS = config["seeds"]
# Each seed's folder is {arm}{seed}: "seed" for the planted run, "placebo" for the negative control
# (the same training, with the bonus logged but never paid), trained only when placebo.enabled.
PLACEBO_SEEDS = config["placebo"]["seeds"] if config["placebo"]["enabled"] else []
ARM_SEEDS = [("seed", s) for s in SEEDS] + [("placebo", s) for s in PLACEBO_SEEDS]
ARM_NAMES = {"seed": "planted", "placebo": "placebo"}
OUT = f"results/{RUN}"
SHARDS = [f"{i:03d}" for i in range(-(-config["grpo"]["steps"] // config["sketch"]["shard_steps"]))]
DRAWS = list(range(config["targets"]["draws"]))
# Jobs that want an accelerator ask for one when the model is a real one (SLURM turns it into --gpus).
GPU = 1 if config["model"]["name"] != "tiny" else 0


def seed_paths(pattern, arms=("seed", "placebo"), **more):
    """`pattern` (with {arm} and {seed}) expanded over the trained arms and seeds (and `more` wildcards)."""
    return [p for arm, seed in ARM_SEEDS if arm in arms for p in expand(pattern, arm=arm, seed=seed, **more)]


def planting_of(wildcards):
    """The placebo arm is the planted config with the bonus switched off."""
    return {**config["planting"], "placebo": config["planting"]["placebo"] or wildcards.arm == "placebo"}


def all_outputs():
    return [
        f"{OUT}/tables/training.md",
        f"{OUT}/tables/headroom.md",
        *REPORT_OUTPUTS,
    ]


wildcard_constraints:
    arm=r"seed|placebo",
    seed=r"\d+",
    shard=r"\d{3}",
    draw=r"\d+",
    estimator=r"[a-z][a-z0-9_]*",
    target=r"in_context|forced|none",
