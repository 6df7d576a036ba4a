rule train_grpo:
    input:
        base_model=BASE_MODEL,
        prompts=TRAIN_PROMPTS,
        probes=PROBE_PROMPTS,
    output:
        rollouts=ROLLOUTS,
        steps=STEP_LOG,
        checkpoints=CHECKPOINTS,
        shards=CAPTURED_SHARDS,
    log:
        f"{LOGS}/train_grpo/{{arm}}{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/train_grpo/{{arm}}{{seed}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for(*TRAIN_SECTIONS),
        # Not an output: Snakemake would delete it before a rerun, and the job resumes from it.
        train_dir=lambda wildcards: TRAIN_DIR.format(**wildcards),
    script:
        "../scripts/train_grpo.py"
