# Scores of every estimator (one job per seed, estimator, draw and target kind) and their evaluation.

from behaviortrace.estimators import module_path as _estimator_module
from behaviortrace.evalstage import score_keys as _score_keys

SCORE_KEYS = _score_keys(config)


def shard_paths(wildcards):
    return expand(f"{OUT}/seed{wildcards.seed}/sketch/shard{{shard}}.zarr", shard=SHARDS)


def score_target_input(wildcards):
    if wildcards.target == "none":
        return []
    return f"{OUT}/seed{wildcards.seed}/targets/draw{wildcards.draw}.zarr"


def score_files(wildcards):
    return [f"{OUT}/seed{wildcards.seed}/scores/{e}/draw{wildcards.draw}_{t}{suffix}.parquet"
            for e, t in SCORE_KEYS for suffix in ("", "_steps")]


rule score:
    input:
        shards=shard_paths,
        rollouts=f"{OUT}/seed{{seed}}/rollouts.parquet",
        target=score_target_input,
        # The estimator's own module: editing it reruns this estimator's jobs only. Relative to the
        # working directory, so that moving the checkout does not look like a changed input set.
        code=lambda wc: os.path.relpath(_estimator_module(wc.estimator)),
    output:
        rollouts=f"{OUT}/seed{{seed}}/scores/{{estimator}}/draw{{draw}}_{{target}}.parquet",
        steps=f"{OUT}/seed{{seed}}/scores/{{estimator}}/draw{{draw}}_{{target}}_steps.parquet",
    params:
        estimator=lambda wc: config["estimators"][wc.estimator],
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/score/seed{{seed}}_{{estimator}}_draw{{draw}}_{{target}}.log",
    script:
        "../scripts/score.py"


rule evaluate:
    input:
        shards=shard_paths,
        rollouts=f"{OUT}/seed{{seed}}/rollouts.parquet",
        target=f"{OUT}/seed{{seed}}/targets/draw{{draw}}.zarr",
        rates=f"{OUT}/seed{{seed}}/targets/draw{{draw}}_rates.parquet",
        scores=score_files,
    output:
        f"{OUT}/seed{{seed}}/metrics/draw{{draw}}.parquet",
    params:
        run=RUN,
        score_keys=SCORE_KEYS,
        evaluation=config["evaluation"],
        window=config["planting"]["window"],
        saturation=config["targets"]["saturation"],
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/evaluate/seed{{seed}}_draw{{draw}}.log",
    script:
        "../scripts/evaluate.py"
