# One job per seed samples and differentiates the targets of every draw: each job pays seconds of imports of torch and
# transformers.
rule targets:
    input:
        checkpoints=CHECKPOINTS,
        probes=PROBE_PROMPTS,
        plain=PLAIN_PROMPTS,
    output:
        stores=[directory(p) for p in expand(TARGET_STORE, draw=DRAWS, allow_missing=True)],
        rates=expand(TARGET_RATES, draw=DRAWS, allow_missing=True),
    log:
        f"{LOGS}/targets/{{arm}}{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/targets/{{arm}}{{seed}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("targets", "sketch", "grpo", "planting", "task", "model", "compute"),
        draws=DRAWS,
    script:
        "../scripts/targets.py"
