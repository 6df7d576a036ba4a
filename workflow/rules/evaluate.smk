rule token_cosines:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        target=TARGET_STORE,
    output:
        TOKEN_COSINES,
    log:
        f"{LOGS}/token_cosines/{{arm}}{{seed}}_draw{{draw}}.log",
    benchmark:
        f"{BENCHMARKS}/token_cosines/{{arm}}{{seed}}_draw{{draw}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/token_cosines.py"


rule evaluate:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        rates=TARGET_RATES,
        token_cosines=TOKEN_COSINES,
        steps=STEP_LOG,
        scores=score_files,
    output:
        METRICS,
    log:
        f"{LOGS}/evaluate/{{arm}}{{seed}}_draw{{draw}}.log",
    benchmark:
        f"{BENCHMARKS}/evaluate/{{arm}}{{seed}}_draw{{draw}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("run", "evaluation", "planting", "targets"),
        score_sets=score_sets,
        predicts_change=[name for name, instance in ESTIMATORS.items() if instance.predicts_change],
        # Not an output: the metrics of each score set, kept between runs (evaluate/cache.py).
        cache_dir=lambda wildcards: METRICS_CACHE.format(**wildcards),
    script:
        "../scripts/evaluate.py"
