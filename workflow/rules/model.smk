# Every job that needs the model (per-rollout capture, each estimator that needs the model, the exact influence),
# tried on it with a handful of synthetic rollouts before the base model is built: a model one of them cannot run on
# is refused here, before the SFT warm-up and training (model/stage.py).
rule preflight:
    output:
        PREFLIGHT,
    log:
        PREFLIGHT_LOG,
    benchmark:
        f"{BENCHMARKS}/preflight.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=preflight_config,
        code=preflight_code,
    script:
        "../scripts/preflight.py"


rule base_model:
    input:
        # It waits for the preflight, but a rerun of the preflight (another estimator setting) does not rebuild it.
        ancient(PREFLIGHT),
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
