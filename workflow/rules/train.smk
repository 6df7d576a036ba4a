rule train_grpo:
    input:
        base_model=f"{OUT}/base_model",
        prompts=f"{OUT}/data/train_prompts.parquet",
    output:
        rollouts=f"{OUT}/{{arm}}{{seed}}/rollouts.parquet",
        steps=f"{OUT}/{{arm}}{{seed}}/steps.parquet",
        checkpoints=f"{OUT}/{{arm}}{{seed}}/checkpoints.json",
    params:
        train_dir=lambda wc: f"{OUT}/{wc.arm}{wc.seed}/train",
        grpo=config["grpo"],
        planting=planting_of,
        task=config["task"],
        compute=config["compute"],
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/train_grpo/{{arm}}{{seed}}.log",
    script:
        "../scripts/train_grpo.py"


rule behavior:
    input:
        checkpoints=f"{OUT}/{{arm}}{{seed}}/checkpoints.json",
        probes=f"{OUT}/data/probe_prompts.parquet",
        controls=f"{OUT}/data/control_prompts.parquet",
    output:
        f"{OUT}/{{arm}}{{seed}}/behavior.parquet",
    params:
        planting=config["planting"],
        task=config["task"],
        probes=config["probes"],
        sampling={k: config["grpo"][k] for k in ("max_new_tokens", "temperature", "top_p")},
        compute=config["compute"],
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/behavior/{{arm}}{{seed}}.log",
    script:
        "../scripts/behavior.py"


rule training_summary:
    input:
        rollouts=seed_paths(f"{OUT}/{{arm}}{{seed}}/rollouts.parquet"),
        behavior=seed_paths(f"{OUT}/{{arm}}{{seed}}/behavior.parquet"),
    output:
        table=f"{OUT}/tables/training.parquet",
        markdown=f"{OUT}/tables/training.md",
    params:
        window=config["planting"]["window"],
        arms=[ARM_NAMES[arm] for arm, _ in ARM_SEEDS],
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/training_summary.log",
    script:
        "../scripts/training_summary.py"
