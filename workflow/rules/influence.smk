# Exact influence (src/behaviortrace/influence/, docs/influence.md): every rollout's I_z through the replayed
# training, the retraining behind its LDS and its predicted-vs-measured sets, and how well each estimator
# and control tracks it.

# The influence jobs are the longest of a seed after training: started early, they do not end the run alone.
INFLUENCE_PRIORITY = 5
INFLUENCE_SET_FILES = [
    (seed, INFLUENCE_SET.format(seed=seed, method=m, pct=p))
    for seed in SEEDS
    for m in CFG.influence.sets
    for p in CFG.replay.k_percent
]
INFLUENCE_SCORE_KEYS = [
    (ARM_NAMES[arm], seed, d, e, t) for arm, seed in ARM_SEEDS for d in DRAWS for e, t in SCORE_KEYS
]
# The figure's scores: each estimator ranked as the leave-out replay ranks it (replay.target, replay.draw).
FIGURE_SCORE_KEYS = [(seed, e, t) for seed in SEEDS for e, t in SCORE_KEYS if t in (CFG.replay.target, "none")]


def influence_set_scores(wildcards):
    """The rollout scores that rank an estimator's top k, as its leave-out replay's (none for the oracle)."""
    if wildcards.method == "oracle":
        return []
    return replay_scores(wildcards)


def influence_score_files(pattern):
    """`pattern` (SCORES or STEP_SCORES) for every key of INFLUENCE_SCORE_KEYS, in its order."""
    return [
        pattern.format(arm=arm, seed=seed, estimator=e, target=t, draw=d)
        for arm, seed in ARM_SEEDS
        for d in DRAWS
        for e, t in SCORE_KEYS
    ]


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
        lds=INFLUENCE_LDS,
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
    script:
        "../scripts/influence.py"


rule influence_set:
    input:
        rollouts=PLANTED_ROLLOUTS,
        checkpoints=PLANTED_CHECKPOINTS,
        base_model=BASE_MODEL,
        probes=PROBE_PROMPTS,
        scores=influence_set_scores,
    output:
        INFLUENCE_SET,
    log:
        f"{LOGS}/influence_set/seed{{seed}}_{{method}}_k{{pct}}.log",
    benchmark:
        f"{BENCHMARKS}/influence_set/seed{{seed}}_{{method}}_k{{pct}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("grpo", "planting", "influence", "replay", "compute"),
    script:
        "../scripts/influence_set.py"


rule influence_metrics:
    input:
        influence=seed_paths(INFLUENCE),
        steps=seed_paths(INFLUENCE_STEPS),
        checks=seed_paths(INFLUENCE_CHECKS),
        lds=seed_paths(INFLUENCE_LDS),
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
    log:
        f"{LOGS}/influence_metrics.log",
    benchmark:
        f"{BENCHMARKS}/influence_metrics.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("planting"),
        arms=[ARM_NAMES[arm] for arm, _ in ARM_SEEDS],
        seeds=[seed for _, seed in ARM_SEEDS],
        score_keys=INFLUENCE_SCORE_KEYS,
        set_seeds=[seed for seed, _ in INFLUENCE_SET_FILES],
    script:
        "../scripts/influence_metrics.py"


rule influence_figure:
    input:
        influence=seed_paths(INFLUENCE, arms=("seed",)),
        rollouts=seed_paths(ROLLOUTS, arms=("seed",)),
        scores=[
            SCORES.format(arm="seed", seed=s, estimator=e, target=t, draw=CFG.replay.draw)
            for s, e, t in FIGURE_SCORE_KEYS
        ],
    output:
        f"{FIGURES}/influence.png",
    log:
        f"{LOGS}/influence_figure.log",
    benchmark:
        f"{BENCHMARKS}/influence_figure.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        seeds=SEEDS,
        score_keys=FIGURE_SCORE_KEYS,
    script:
        "../scripts/influence_figure.py"
