rule targets:
    input:
        checkpoints=CHECKPOINTS,
        probes=PROBE_PROMPTS,
        controls=CONTROL_PROMPTS,
    output:
        store=directory(TARGET_STORE),
        rates=TARGET_RATES,
    params:
        config=config_for("targets", "sketch", "grpo", "planting", "task", "model", "compute"),
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/targets/{{arm}}{{seed}}_draw{{draw}}.log",
    script:
        "../scripts/targets.py"


rule headroom:
    input:
        seed_paths(TARGET_RATES, arms=("seed",), draw=DRAWS),
    output:
        table=f"{TABLES}/headroom.parquet",
        markdown=f"{TABLES}/headroom.md",
    params:
        config=config_for("targets"),
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/headroom.log",
    script:
        "../scripts/headroom.py"
