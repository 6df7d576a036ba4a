rule evaluate:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        target=TARGET_STORE,
        rates=TARGET_RATES,
        scores=score_files,
    output:
        METRICS,
    params:
        config=config_for("run", "evaluation", "planting", "targets"),
        score_keys=SCORE_KEYS,
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{LOGS}/evaluate/{{arm}}{{seed}}_draw{{draw}}.log",
    script:
        "../scripts/evaluate.py"
