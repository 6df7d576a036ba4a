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
OUT = f"results/{RUN}"
SHARDS = [f"{i:03d}" for i in range(-(-config["grpo"]["steps"] // config["sketch"]["shard_steps"]))]
DRAWS = list(range(config["targets"]["draws"]))
# Jobs that want an accelerator ask for one when the model is a real one (SLURM turns it into --gpus).
GPU = 1 if config["model"]["name"] != "tiny" else 0


def all_outputs():
    return [
        expand(f"{OUT}/seed{{seed}}/behavior.parquet", seed=SEEDS),
        f"{OUT}/tables/training.md",
        expand(f"{OUT}/seed{{seed}}/sketch/shard{{shard}}.zarr", seed=SEEDS, shard=SHARDS),
        f"{OUT}/tables/headroom.md",
        expand(f"{OUT}/seed{{seed}}/metrics/draw{{draw}}.parquet", seed=SEEDS, draw=DRAWS),
    ]


wildcard_constraints:
    seed=r"\d+",
    shard=r"\d{3}",
    draw=r"\d+",
    estimator=r"[a-z][a-z0-9_]*",
    target=r"in_context|forced|none",
