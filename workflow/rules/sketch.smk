rule sketch:
    input:
        rollouts=ROLLOUTS,
        steps=STEP_LOG,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
    output:
        directory(SHARD),
    params:
        config=config_for("sketch", "grpo", "planting", "model", "compute"),
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/sketch/{{arm}}{{seed}}_shard{{shard}}.log",
    script:
        "../scripts/sketch.py"
