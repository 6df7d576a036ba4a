# Per-rollout gradient sketches (sharded by steps), behavior targets per generation draw, and headroom.

# What the per-rollout loss needs to match the loss TRL optimized.
LOSS_PARAMS = {k: config["grpo"][k] for k in ("steps", "temperature", "loss_type", "beta", "max_new_tokens")}
SAMPLING = {k: config["grpo"][k] for k in ("max_new_tokens", "temperature", "top_p")}


rule sketch:
    input:
        rollouts=f"{OUT}/{{arm}}{{seed}}/rollouts.parquet",
        steps=f"{OUT}/{{arm}}{{seed}}/steps.parquet",
        checkpoints=f"{OUT}/{{arm}}{{seed}}/checkpoints.json",
        base_model=f"{OUT}/base_model",
    output:
        directory(f"{OUT}/{{arm}}{{seed}}/sketch/shard{{shard}}.zarr"),
    params:
        sketch=config["sketch"],
        grpo=LOSS_PARAMS,
        marker=config["planting"]["marker"],
        model_name=config["model"]["name"],
        compute=config["compute"],
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/sketch/{{arm}}{{seed}}_shard{{shard}}.log",
    script:
        "../scripts/sketch.py"


rule targets:
    input:
        checkpoints=f"{OUT}/{{arm}}{{seed}}/checkpoints.json",
        probes=f"{OUT}/data/probe_prompts.parquet",
        controls=f"{OUT}/data/control_prompts.parquet",
    output:
        store=directory(f"{OUT}/{{arm}}{{seed}}/targets/draw{{draw}}.zarr"),
        rates=f"{OUT}/{{arm}}{{seed}}/targets/draw{{draw}}_rates.parquet",
    params:
        targets=config["targets"],
        sketch=config["sketch"],
        sampling=SAMPLING,
        marker=config["planting"]["marker"],
        base_reward=config["task"]["base_reward"],
        model_name=config["model"]["name"],
        compute=config["compute"],
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/targets/{{arm}}{{seed}}_draw{{draw}}.log",
    script:
        "../scripts/targets.py"


rule headroom:
    input:
        seed_paths(f"{OUT}/{{arm}}{{seed}}/targets/draw{{draw}}_rates.parquet", arms=("seed",), draw=DRAWS),
    output:
        table=f"{OUT}/tables/headroom.parquet",
        markdown=f"{OUT}/tables/headroom.md",
    params:
        saturation=config["targets"]["saturation"],
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/headroom.log",
    script:
        "../scripts/headroom.py"
