# Scores of every estimator (one job per seed, estimator, draw and target kind) and their evaluation.

from behaviortrace.estimators import source_digest as _estimator_digest
from behaviortrace.evalstage import score_keys as _score_keys

SCORE_KEYS = _score_keys(config)


def shard_paths(wildcards):
    return expand(f"{OUT}/{wildcards.arm}{wildcards.seed}/sketch/shard{{shard}}.zarr", shard=SHARDS)


def score_target_input(wildcards):
    if wildcards.target == "none":
        return []
    return f"{OUT}/{wildcards.arm}{wildcards.seed}/targets/draw{wildcards.draw}.zarr"


def score_files(wildcards):
    return [f"{OUT}/{wildcards.arm}{wildcards.seed}/scores/{e}/draw{wildcards.draw}_{t}{suffix}.parquet"
            for e, t in SCORE_KEYS for suffix in ("", "_steps")]


rule score:
    input:
        shards=shard_paths,
        rollouts=f"{OUT}/{{arm}}{{seed}}/rollouts.parquet",
        target=score_target_input,
    output:
        rollouts=f"{OUT}/{{arm}}{{seed}}/scores/{{estimator}}/draw{{draw}}_{{target}}.parquet",
        steps=f"{OUT}/{{arm}}{{seed}}/scores/{{estimator}}/draw{{draw}}_{{target}}_steps.parquet",
    params:
        estimator=lambda wc: config["estimators"][wc.estimator],
        # A digest of the estimator's own module: editing it reruns this estimator's jobs only, and moving
        # the checkout or the working directory changes nothing.
        code=lambda wc: _estimator_digest(wc.estimator),
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/score/{{arm}}{{seed}}_{{estimator}}_draw{{draw}}_{{target}}.log",
    script:
        "../scripts/score.py"


rule evaluate:
    input:
        shards=shard_paths,
        rollouts=f"{OUT}/{{arm}}{{seed}}/rollouts.parquet",
        target=f"{OUT}/{{arm}}{{seed}}/targets/draw{{draw}}.zarr",
        rates=f"{OUT}/{{arm}}{{seed}}/targets/draw{{draw}}_rates.parquet",
        scores=score_files,
    output:
        f"{OUT}/{{arm}}{{seed}}/metrics/draw{{draw}}.parquet",
    params:
        run=RUN,
        score_keys=SCORE_KEYS,
        evaluation=config["evaluation"],
        window=config["planting"]["window"],
        saturation=config["targets"]["saturation"],
        placebo=lambda wc: planting_of(wc)["placebo"],
    threads: 1
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/evaluate/{{arm}}{{seed}}_draw{{draw}}.log",
    script:
        "../scripts/evaluate.py"
