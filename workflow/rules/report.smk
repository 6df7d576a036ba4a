# Cross-seed tables, the checklist and figures; `snakemake --report results/{run}/report.html` gathers them.

TABLES = f"{OUT}/tables"
FIGURES = f"{OUT}/figures"
FIGURE_NAMES = ["behavior_rates", "lift", "within_group_auc", "token_alignment", "replay"]
REPORT_OUTPUTS = [
    f"{TABLES}/metrics.parquet",
    f"{TABLES}/replay.parquet",
    f"{OUT}/checklist.md",
    *[f"{FIGURES}/{name}.png" for name in FIGURE_NAMES],
]


# Every metrics file with its arm, and the planted seeds' rollout scores (for the rank correlation between
# draws) with their (seed, estimator, target, draw): the script gets the keys beside the paths.
METRIC_FILES = [(ARM_NAMES[arm], f"{OUT}/{arm}{seed}/metrics/draw{draw}.parquet")
                for arm, seed in ARM_SEEDS for draw in DRAWS]
SCORE_FILES = {(s, e, t, d): f"{OUT}/seed{s}/scores/{e}/draw{d}_{t}.parquet"
               for s in SEEDS for e, t in SCORE_KEYS for d in DRAWS}


rule aggregate:
    input:
        metrics=[path for _, path in METRIC_FILES],
        scores=list(SCORE_FILES.values()),
        training=f"{TABLES}/training.parquet",
        replay=f"{TABLES}/replay.parquet",
        shards=seed_paths(f"{OUT}/{{arm}}{{seed}}/sketch/shard{{shard}}.zarr", arms=("seed",), shard=SHARDS),
    output:
        metrics=f"{TABLES}/metrics.parquet",
        csv=report(f"{TABLES}/metrics.csv", caption="../report/metrics.rst", category="3. Tables"),
        summary=f"{TABLES}/summary.md",
        summary_html=report(f"{TABLES}/summary.html", caption="../report/summary.rst", category="3. Tables"),
        draw_stability=f"{TABLES}/draw_stability.parquet",
        seed_stability=f"{TABLES}/seed_stability.parquet",
        stability_md=f"{TABLES}/stability.md",
        stability_html=report(f"{TABLES}/stability.html", caption="../report/stability.rst", category="3. Tables"),
        checklist=f"{OUT}/checklist.md",
        checklist_json=f"{OUT}/checklist.json",
        checklist_html=report(f"{OUT}/checklist.html", caption="../report/checklist.rst", category="1. Checklist"),
    params:
        run=RUN,
        arms=[arm for arm, _ in METRIC_FILES],
        score_keys=list(SCORE_FILES),
        checklist=config["checklist"],
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/aggregate.log",
    script:
        "../scripts/aggregate.py"


rule figures:
    input:
        metrics=f"{TABLES}/metrics.parquet",
        behavior=seed_paths(f"{OUT}/{{arm}}{{seed}}/behavior.parquet"),
        replay=f"{TABLES}/replay.parquet",
    output:
        **{name: report(f"{FIGURES}/{name}.png", caption=f"../report/{name}.rst", category="2. Figures")
           for name in FIGURE_NAMES},
    params:
        arms=[ARM_NAMES[arm] for arm, _ in ARM_SEEDS],
        window=config["planting"]["window"],
        checklist=config["checklist"],
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/figures.log",
    script:
        "../scripts/figures.py"
