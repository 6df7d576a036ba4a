# Temporary: only the estimator's own score jobs read it, and they rerun together with it.
rule prepare:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        matrix=SKETCH_MATRIX,
        gram=SKETCH_GRAM,
    output:
        temp(PREPARED),
    log:
        f"{LOGS}/prepare/{{arm}}{{seed}}_{{estimator}}.log",
    benchmark:
        f"{BENCHMARKS}/prepare/{{arm}}{{seed}}_{{estimator}}.tsv"
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=estimator_config,
        code=estimator_code,
    script:
        "../scripts/prepare.py"


rule score:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        target=score_target_input,
        matrix=SKETCH_MATRIX,
        prepared=prepared_input,
    output:
        rollouts=SCORES,
        steps=STEP_SCORES,
    log:
        f"{LOGS}/score/{{arm}}{{seed}}_{{estimator}}_draw{{draw}}_{{target}}.log",
    benchmark:
        f"{BENCHMARKS}/score/{{arm}}{{seed}}_{{estimator}}_draw{{draw}}_{{target}}.tsv"
    wildcard_constraints:
        estimator=SKETCH_ESTIMATORS,
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=estimator_config,
        # Editing the estimator's module or any project code it runs reruns this estimator's jobs only;
        # moving the checkout or the working directory changes nothing.
        code=estimator_code,
    script:
        "../scripts/score.py"


# Temporary, like prepare: what an estimator that needs the model fits once per seed (ekfac's factors, trackstar's
# rollout gradients), read by its score_model jobs of every draw and target kind.
rule prepare_model:
    input:
        rollouts=ROLLOUTS,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
    output:
        temp(directory(PREPARED_MODEL)),
    log:
        f"{LOGS}/prepare_model/{{arm}}{{seed}}_{{estimator}}.log",
    benchmark:
        f"{BENCHMARKS}/prepare_model/{{arm}}{{seed}}_{{estimator}}.tsv"
    wildcard_constraints:
        estimator=MODEL_ESTIMATORS,
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=model_estimator_config,
        code=estimator_code,
    script:
        "../scripts/prepare_model.py"


# An estimator that needs the model (score/model_run.py): the checkpoints, the rollout log and the probe targets,
# no sketches. One job per seed scores every draw and target kind (MODEL_CELLS): each job's imports of torch,
# transformers and the estimator's library cost seconds.
rule score_model:
    input:
        rollouts=ROLLOUTS,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
        prepared=prepared_model_input,
        targets=expand(TARGET_STORE, draw=DRAWS, allow_missing=True),
        probes=PROBE_PROMPTS,
    output:
        rollouts=model_score_paths(SCORES),
        steps=model_score_paths(STEP_SCORES),
    log:
        f"{LOGS}/score_model/{{arm}}{{seed}}_{{estimator}}.log",
    benchmark:
        f"{BENCHMARKS}/score_model/{{arm}}{{seed}}_{{estimator}}.tsv"
    wildcard_constraints:
        estimator=MODEL_ESTIMATORS,
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=model_estimator_config,
        code=estimator_code,
        cells=MODEL_CELLS,
    script:
        "../scripts/score_model.py"
