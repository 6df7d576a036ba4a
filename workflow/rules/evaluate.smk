rule evaluate:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        target=TARGET_STORE,
        rates=TARGET_RATES,
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
        score_keys=SCORE_KEYS,
    script:
        "../scripts/evaluate.py"
