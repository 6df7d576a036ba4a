rule base_model:
    output:
        directory(BASE_MODEL),
    params:
        config=config_for("model", "task", "planting", "compute"),
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/base_model.log",
    script:
        "../scripts/base_model.py"
