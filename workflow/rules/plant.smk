rule plant_data:
    output:
        train=TRAIN_PROMPTS,
        probes=PROBE_PROMPTS,
        plain=PLAIN_PROMPTS,
    log:
        f"{LOGS}/plant_data.log",
    benchmark:
        f"{BENCHMARKS}/plant_data.tsv"
    conda:
        CONDA_ENV
    params:
        config=config_for("task", "planting", "grpo", "probes"),
    script:
        "../scripts/plant_data.py"
