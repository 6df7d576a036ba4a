# Every job that needs the model (per-rollout capture, each estimator that needs the model, the exact influence),
# tried on it with a handful of synthetic rollouts before the base model is built: a model one of them cannot run on
# is refused here, before the SFT warm-up and training (preflight/checks.py). It reruns exactly when the base model is
# rebuilt (the same config sections), so the base model takes it as a plain input: an `ancient` input whose job
# reruns makes Snakemake drop the new jobs behind it from that invocation's plan (snakemake/snakemake#4166). The
# tries read the estimators, grpo, sketch and influence sections from the whole config without tracking them: an
# estimator added to a trained run is not tried again, its own score jobs run it (docs/models.md).
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
        config=config_for("model", "task", "planting", "compute"),
    script:
        "../scripts/preflight.py"


rule base_model:
    input:
        PREFLIGHT,
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
