rule plant_data:
    output:
        train=TRAIN_PROMPTS,
        probes=PROBE_PROMPTS,
        controls=CONTROL_PROMPTS,
    params:
        config=config_for("task", "planting", "grpo", "probes"),
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/plant_data.log",
    script:
        "../scripts/plant_data.py"
