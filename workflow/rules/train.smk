rule train_grpo:
    input:
        base_model=f"{OUT}/base_model",
        prompts=f"{OUT}/data/train_prompts.parquet",
    output:
        rollouts=f"{OUT}/seed{{seed}}/rollouts.parquet",
        steps=f"{OUT}/seed{{seed}}/steps.parquet",
        checkpoints=f"{OUT}/seed{{seed}}/checkpoints.json",
    params:
        train_dir=lambda wc: f"{OUT}/seed{wc.seed}/train",
        grpo=config["grpo"],
        planting=config["planting"],
        task=config["task"],
        compute=config["compute"],
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/train_grpo/seed{{seed}}.log",
    script:
        "../scripts/train_grpo.py"


rule behavior:
    input:
        checkpoints=f"{OUT}/seed{{seed}}/checkpoints.json",
        probes=f"{OUT}/data/probe_prompts.parquet",
        controls=f"{OUT}/data/control_prompts.parquet",
    output:
        f"{OUT}/seed{{seed}}/behavior.parquet",
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
        f"{OUT}/logs/behavior/seed{{seed}}.log",
    script:
        "../scripts/behavior.py"


rule training_summary:
    input:
        rollouts=expand(f"{OUT}/seed{{seed}}/rollouts.parquet", seed=SEEDS),
        behavior=expand(f"{OUT}/seed{{seed}}/behavior.parquet", seed=SEEDS),
    output:
        table=f"{OUT}/tables/training.parquet",
        markdown=f"{OUT}/tables/training.md",
    params:
        window=config["planting"]["window"],
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/training_summary.log",
    script:
        "../scripts/training_summary.py"
