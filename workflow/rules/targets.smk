rule targets:
    input:
        checkpoints=CHECKPOINTS,
        probes=PROBE_PROMPTS,
        plain=PLAIN_PROMPTS,
    output:
        store=directory(TARGET_STORE),
        rates=TARGET_RATES,
    log:
        f"{LOGS}/targets/{{arm}}{{seed}}_draw{{draw}}.log",
    benchmark:
        f"{BENCHMARKS}/targets/{{arm}}{{seed}}_draw{{draw}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("targets", "sketch", "grpo", "planting", "task", "model", "compute"),
    script:
        "../scripts/targets.py"


rule headroom:
    input:
        seed_paths(TARGET_RATES, arms=("planted",), draw=DRAWS),
    output:
        table=f"{TABLES}/headroom.parquet",
        markdown=f"{TABLES}/headroom.md",
    log:
        f"{LOGS}/headroom.log",
    benchmark:
        f"{BENCHMARKS}/headroom.tsv"
    conda:
        CONDA_ENV
    params:
        config=config_for("targets"),
    script:
        "../scripts/headroom.py"
