rule behavior:
    input:
        checkpoints=CHECKPOINTS,
        probes=PROBE_PROMPTS,
        plain=PLAIN_PROMPTS,
    output:
        BEHAVIOR,
    log:
        f"{LOGS}/behavior/{{arm}}{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/behavior/{{arm}}{{seed}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("planting", "task", "probes", "grpo", "compute"),
    script:
        "../scripts/behavior.py"
