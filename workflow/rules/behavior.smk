rule behavior:
    input:
        checkpoints=CHECKPOINTS,
        probes=PROBE_PROMPTS,
        controls=CONTROL_PROMPTS,
    output:
        BEHAVIOR,
    params:
        config=config_for("planting", "task", "probes", "grpo", "compute"),
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/behavior/{{arm}}{{seed}}.log",
    script:
        "../scripts/behavior.py"
