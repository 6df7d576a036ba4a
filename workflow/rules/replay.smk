rule replay:
    input:
        rollouts=PLANTED_ROLLOUTS,
        checkpoints=PLANTED_CHECKPOINTS,
        base_model=BASE_MODEL,
        probes=PROBE_PROMPTS,
        plain=PLAIN_PROMPTS,
        scores=replay_scores,
    output:
        REPLAY,
    log:
        f"{LOGS}/replay/seed{{seed}}_{{removal}}_p{{pct}}.log",
    benchmark:
        f"{BENCHMARKS}/replay/seed{{seed}}_{{removal}}_p{{pct}}.tsv"
    priority: replay_priority
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("grpo", "planting", "replay", "targets", "task", "compute"),
        # What leaving a rollout out means, as for every causal truth (docs/influence.md).
        semantics=CFG.influence.semantics,
    script:
        "../scripts/replay.py"


rule replay_table:
    input:
        REPLAY_FILES,
    output:
        table=f"{TABLES}/replay.parquet",
        markdown=f"{TABLES}/replay.md",
        html=report(f"{TABLES}/replay.html", caption="../report/replay_table.rst", category="3. Tables"),
    log:
        f"{LOGS}/replay_table.log",
    benchmark:
        f"{BENCHMARKS}/replay_table.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/replay_table.py"
