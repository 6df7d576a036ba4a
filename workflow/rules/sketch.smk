rule sketch:
    input:
        rollouts=ROLLOUTS,
        steps=STEP_LOG,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
    output:
        directory(SHARD),
    log:
        f"{LOGS}/sketch/{{arm}}{{seed}}_shard{{shard}}.log",
    benchmark:
        f"{BENCHMARKS}/sketch/{{arm}}{{seed}}_shard{{shard}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("sketch", "grpo", "planting", "model", "compute"),
    script:
        "../scripts/sketch.py"
