rule base_model:
    output:
        directory(BASE_MODEL),
    log:
        f"{LOGS}/base_model.log",
    benchmark:
        f"{BENCHMARKS}/base_model.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("model", "task", "planting", "compute"),
    script:
        "../scripts/base_model.py"
