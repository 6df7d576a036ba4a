# Exact influence (src/behaviortrace/influence/, docs/influence.md): every rollout's I_z through the replayed
# training, the retraining behind its LDS and its predicted-vs-measured sets, and how well each estimator
# and control tracks it.


rule influence:
    input:
        rollouts=ROLLOUTS,
        steps=STEP_LOG,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
        probes=PROBE_PROMPTS,
    output:
        rollouts=INFLUENCE,
        steps=INFLUENCE_STEPS,
        checks=INFLUENCE_CHECKS,
        retrain=INFLUENCE_RETRAIN,
        summary=INFLUENCE_SUMMARY,
    log:
        f"{LOGS}/influence/{{arm}}{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/influence/{{arm}}{{seed}}.tsv"
    priority: INFLUENCE_PRIORITY
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("grpo", "planting", "influence", "compute"),
        # The leave-out replay's paid sets (planted seeds), without the rest of the replay section.
        label_percents=lambda wildcards: CFG.replay.removal_percent if wildcards.arm == "planted" else [],
        replay_seed=CFG.replay.seed,
    script:
        "../scripts/influence.py"


# Defined only where there are sets to retrain (influence.sets names at least one estimator).
if INFLUENCE_SETS:

    rule influence_set:
        input:
            rollouts=PLANTED_ROLLOUTS,
            checkpoints=PLANTED_CHECKPOINTS,
            base_model=BASE_MODEL,
            probes=PROBE_PROMPTS,
            scores=lambda wildcards: list(influence_set_scores(wildcards).values()),
        output:
            [expand(INFLUENCE_SET, removal=m, pct=p, allow_missing=True)[0] for m, p in INFLUENCE_SETS],
        log:
            f"{LOGS}/influence_set/planted{{seed}}.log",
        benchmark:
            f"{BENCHMARKS}/influence_set/planted{{seed}}.tsv"
        conda:
            CONDA_ENV
        threads: 1
        resources:
            gpu=GPU,
        params:
            config=config_for("grpo", "planting", "influence", "replay", "compute"),
            sets=INFLUENCE_SETS,
            scores=influence_set_scores,
        script:
            "../scripts/influence_set.py"


rule influence_metrics:
    input:
        influence=seed_paths(INFLUENCE),
        checks=seed_paths(INFLUENCE_CHECKS),
        retrain=seed_paths(INFLUENCE_RETRAIN),
        summaries=seed_paths(INFLUENCE_SUMMARY),
        rollouts=seed_paths(ROLLOUTS),
        step_logs=seed_paths(STEP_LOG),
        scores=influence_score_files(SCORES),
        step_scores=influence_score_files(STEP_SCORES),
        sets=[path for _, path in INFLUENCE_SET_FILES],
    output:
        table=f"{TABLES}/influence.parquet",
        csv=f"{TABLES}/influence.csv",
        top=f"{TABLES}/influence_top.parquet",
        markdown=f"{TABLES}/influence.md",
        html=report(f"{TABLES}/influence.html", caption="../report/influence_table.rst", category="3. Tables"),
    log:
        f"{LOGS}/influence_metrics.log",
    benchmark:
        f"{BENCHMARKS}/influence_metrics.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("planting", "influence", "checklist"),
        log_only=[name for name, instance in ESTIMATORS.items() if instance.log_only],
        arms=[arm for arm, _ in ARM_SEEDS],
        seeds=[seed for _, seed in ARM_SEEDS],
        score_keys=INFLUENCE_SCORE_KEYS,
        set_seeds=[seed for seed, _ in INFLUENCE_SET_FILES],
    script:
        "../scripts/influence_metrics.py"


rule influence_figure:
    input:
        table=f"{TABLES}/influence.parquet",
    output:
        report(f"{FIGURES}/influence.png", caption="../report/influence.rst", category="2. Figures"),
    log:
        f"{LOGS}/influence_figure.log",
    benchmark:
        f"{BENCHMARKS}/influence_figure.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("checklist", "influence"),
        log_only=[name for name, instance in ESTIMATORS.items() if instance.log_only],
    script:
        "../scripts/influence_figure.py"
