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
