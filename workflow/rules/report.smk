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


def metric_files(wildcards=None):
    return per_seed(f"{OUT}/{{arm}}{{seed}}/metrics/draw{{draw}}.parquet", draw=DRAWS)


def planted_score_files(wildcards=None):
    """Rollout scores of the planted seeds, for the rank correlation between draws."""
    return [f"{OUT}/seed{s}/scores/{e}/draw{d}_{t}.parquet" for s in SEEDS for e, t in SCORE_KEYS for d in DRAWS]


rule aggregate:
    input:
        metrics=metric_files,
        scores=planted_score_files,
        training=f"{TABLES}/training.parquet",
        replay=f"{TABLES}/replay.parquet",
        shards=per_seed(f"{OUT}/{{arm}}{{seed}}/sketch/shard{{shard}}.zarr", arms=("seed",), shard=SHARDS),
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
        arms=[ARM_NAMES[arm] for arm, _ in ARM_SEEDS for _ in DRAWS],  # one per metrics file, in order
        seeds=SEEDS,
        draws=DRAWS,
        score_keys=SCORE_KEYS,
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
        behavior=per_seed(f"{OUT}/{{arm}}{{seed}}/behavior.parquet"),
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
