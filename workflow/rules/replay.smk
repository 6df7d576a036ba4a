# Causal check: retrain each planted seed with a set of rollouts left out (an estimator's top k, k at
# random, the GT set itself, or nothing) and measure the behavior it ends up with.

from behaviortrace.estimators import load as _load_estimator

REPLAY = config["replay"]


def replay_runs():
    """(method, pct, rep) of every replay of one seed; method 'full' leaves nothing out."""
    runs = [("full", 0, 0)]
    for pct in REPLAY["k_percent"]:
        runs += [("oracle", pct, 0)] + [(e, pct, 0) for e in REPLAY["estimators"]]
        runs += [("random", pct, r) for r in range(REPLAY["random_repeats"])]
    return runs


REPLAY_FILES = [f"{OUT}/seed{s}/replay/{m}_k{p}_r{r}.parquet" for s in SEEDS for m, p, r in replay_runs()]


def replay_scores(wildcards):
    """The rollout scores that rank the rollouts, for an estimator's replay."""
    method = wildcards.method
    if method in ("full", "oracle", "random"):
        return []
    target = REPLAY["target"] if _load_estimator(method).USES_TARGET else "none"
    return f"{OUT}/seed{wildcards.seed}/scores/{method}/draw{REPLAY['draw']}_{target}.parquet"


rule replay:
    input:
        rollouts=f"{OUT}/seed{{seed}}/rollouts.parquet",
        checkpoints=f"{OUT}/seed{{seed}}/checkpoints.json",
        base_model=f"{OUT}/base_model",
        probes=f"{OUT}/data/probe_prompts.parquet",
        controls=f"{OUT}/data/control_prompts.parquet",
        scores=replay_scores,
    output:
        f"{OUT}/seed{{seed}}/replay/{{method}}_k{{pct}}_r{{rep}}.parquet",
    params:
        grpo=config["grpo"],
        window=config["planting"]["window"],
        replay=REPLAY,
        targets=config["targets"],
        sampling=SAMPLING,
        marker=config["planting"]["marker"],
        base_reward=config["task"]["base_reward"],
        compute=config["compute"],
    threads: 1
    resources:
        gpu=GPU,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/replay/seed{{seed}}_{{method}}_k{{pct}}_r{{rep}}.log",
    script:
        "../scripts/replay.py"


rule replay_table:
    input:
        REPLAY_FILES,
    output:
        table=f"{TABLES}/replay.parquet",
        markdown=f"{TABLES}/replay.md",
        html=report(f"{TABLES}/replay.html", caption="../report/replay_table.rst", category="3. Tables"),
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/replay_table.log",
    script:
        "../scripts/replay_table.py"
