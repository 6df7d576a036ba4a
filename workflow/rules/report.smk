# The record of the whole config, first of all jobs: any change of any key rewrites it (params), and the results page
# and the HTML report open with its settings.
rule run_config:
    output:
        RUN_CONFIG,
    log:
        f"{LOGS}/run_config.log",
    priority: 100
    conda:
        CONDA_ENV
    params:
        config=dict(config),
    script:
        "../scripts/run_config.py"


rule training_summary:
    input:
        rollouts=seed_paths(ROLLOUTS),
        behavior=seed_paths(BEHAVIOR),
    output:
        table=f"{TABLES}/training.parquet",
        markdown=f"{TABLES}/training.md",
    log:
        f"{LOGS}/training_summary.log",
    benchmark:
        f"{BENCHMARKS}/training_summary.tsv"
    conda:
        CONDA_ENV
    params:
        config=config_for("planting"),
        arms=[arm for arm, _ in ARM_SEEDS],
    script:
        "../scripts/training_summary.py"


rule aggregate:
    input:
        metrics=[path for _, path in METRIC_FILES],
        scores=list(SCORE_FILES.values()),
        training=f"{TABLES}/training.parquet",
        replay=f"{TABLES}/replay.parquet",
        influence=f"{TABLES}/influence.parquet",
        shards=seed_paths(SHARD, arms=("planted",), shard=SHARDS),
    output:
        metrics=f"{TABLES}/metrics.parquet",
        csv=report(f"{TABLES}/metrics.csv", caption="../report/metrics.rst", category="3. Tables"),
        summary=f"{TABLES}/summary.md",
        summary_html=report(f"{TABLES}/summary.html", caption="../report/summary.rst", category="3. Tables"),
        draw_stability=f"{TABLES}/draw_stability.parquet",
        seed_stability=f"{TABLES}/seed_stability.parquet",
        stability_md=f"{TABLES}/stability.md",
        stability_html=report(f"{TABLES}/stability.html", caption="../report/stability.rst", category="3. Tables"),
        controls_md=f"{TABLES}/controls.md",
        controls_html=report(f"{TABLES}/controls.html", caption="../report/controls.rst", category="3. Tables"),
        checklist=f"{OUT}/checklist.md",
        checklist_json=f"{OUT}/checklist.json",
        checklist_html=report(f"{OUT}/checklist.html", caption="../report/checklist.rst", category="1. Checklist"),
        paper_md=f"{TABLES}/paper_findings.md",
        paper_html=report(
            f"{TABLES}/paper_findings.html", caption="../report/paper_findings.rst", category="1. Checklist"
        ),
    log:
        f"{LOGS}/aggregate.log",
    benchmark:
        f"{BENCHMARKS}/aggregate.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("run", "checklist", "evaluation", "influence"),
        arms=[arm for arm, _ in METRIC_FILES],
        log_only=[name for name, instance in ESTIMATORS.items() if instance.log_only],
        # Target-free controls (the log-only ones among them): the bars a method is compared with, not judged.
        controls=[name for name, instance in ESTIMATORS.items() if not instance.uses_target],
        score_keys=list(SCORE_FILES),
        # The norm instances, each with whether it takes the clip coefficient (the paper's method).
        norms={
            name: bool(instance.arguments.get("use_clip"))
            for name, instance in ESTIMATORS.items()
            if instance.module_name == "norm"
        },
    script:
        "../scripts/aggregate.py"


rule effect_steps:
    input:
        steps=seed_paths(STEP_LOG, arms=("planted",)),
        rollouts=seed_paths(ROLLOUTS, arms=("planted",)),
        scores=list(EFFECT_STEP_SCORES.values()),
    output:
        f"{TABLES}/effect_steps.parquet",
    log:
        f"{LOGS}/effect_steps.log",
    benchmark:
        f"{BENCHMARKS}/effect_steps.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("checklist"),
        seeds=SEEDS,
        score_keys=list(EFFECT_STEP_SCORES),
    script:
        "../scripts/effect_steps.py"


rule figures:
    input:
        metrics=f"{TABLES}/metrics.parquet",
        behavior=seed_paths(BEHAVIOR),
        replay=f"{TABLES}/replay.parquet",
        effect_steps=f"{TABLES}/effect_steps.parquet",
    output:
        **{
            name: report(f"{FIGURES}/{name}.png", caption=f"../report/{name}.rst", category="2. Figures")
            for name in FIGURE_NAMES
        },
    log:
        f"{LOGS}/figures.log",
    benchmark:
        f"{BENCHMARKS}/figures.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=config_for("planting", "checklist"),
        arms=[arm for arm, _ in ARM_SEEDS],
    script:
        "../scripts/figures.py"


# The run's results on one page (docs/results.md is the default run's, copied by `make results-page`).
rule results_page:
    input:
        config=RUN_CONFIG,
        influence_table=f"{TABLES}/influence.parquet",
        checklist=f"{OUT}/checklist.md",
        checklist_json=f"{OUT}/checklist.json",
        training=f"{TABLES}/training.md",
        controls=f"{TABLES}/controls.md",
        replay=f"{TABLES}/replay.md",
        influence=f"{TABLES}/influence.md",
        paper=f"{TABLES}/paper_findings.md",
    output:
        page=RESULTS_PAGE,
        faithfulness_md=f"{TABLES}/faithfulness.md",
        faithfulness_html=report(
            f"{TABLES}/faithfulness.html", caption="../report/faithfulness.rst", category="0. The answer"
        ),
        faithfulness_figure=report(
            f"{FIGURES}/faithfulness.png", caption="../report/faithfulness_figure.rst", category="0. The answer"
        ),
    log:
        f"{LOGS}/results_page.log",
    benchmark:
        f"{BENCHMARKS}/results_page.tsv"
    conda:
        CONDA_ENV
    params:
        config=config_for("run", "influence"),
        benchmarks=BENCHMARKS,
        estimators=sorted(config["estimators"]),  # the cost tables count these instances' jobs only
    script:
        "../scripts/results_page.py"


rule headroom:
    input:
        seed_paths(TARGET_RATES, arms=("planted",), draw=DRAWS),
    output:
        table=f"{TABLES}/headroom.parquet",
        markdown=f"{TABLES}/headroom.md",
    log:
        f"{LOGS}/headroom.log",
    benchmark:
        f"{BENCHMARKS}/headroom.tsv"
    conda:
        CONDA_ENV
    params:
        config=config_for("targets"),
    script:
        "../scripts/headroom.py"
