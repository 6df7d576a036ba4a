# A sketch estimator that uses a target: one job per seed and estimator scores every draw and target kind (SCORE_CELLS),
# after its per-seed preparation (trak's factorization), in one process: each job's imports and reads of the
# sketches cost about a second, more than scoring one cell.
rule score:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        targets=expand(TARGET_STORE, draw=DRAWS, allow_missing=True),
        matrix=SKETCH_MATRIX,
        gram=gram_input,
    output:
        rollouts=score_cell_paths(SCORES),
        steps=score_cell_paths(STEP_SCORES),
    log:
        f"{LOGS}/score/{{arm}}{{seed}}_{{estimator}}.log",
    benchmark:
        f"{BENCHMARKS}/score/{{arm}}{{seed}}_{{estimator}}.tsv"
    wildcard_constraints:
        estimator=TARGETED_SKETCH_ESTIMATORS,
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=estimator_config,
        # Editing the estimator's module or any project code it runs reruns this estimator's jobs only;
        # moving the checkout or the working directory changes nothing.
        code=estimator_code,
        cells=SCORE_CELLS,
    script:
        "../scripts/score.py"


# A sketch estimator without a target (the controls, a user's target-free estimator): one file per seed, read by every
# draw (UNDRAWN).
rule score_target_free:
    input:
        shards=shard_paths,
        rollouts=ROLLOUTS,
        matrix=SKETCH_MATRIX,
        gram=gram_input,
    output:
        rollouts=expand(SCORES, draw=UNDRAWN, target="none", allow_missing=True),
        steps=expand(STEP_SCORES, draw=UNDRAWN, target="none", allow_missing=True),
    log:
        f"{LOGS}/score_target_free/{{arm}}{{seed}}_{{estimator}}.log",
    benchmark:
        f"{BENCHMARKS}/score_target_free/{{arm}}{{seed}}_{{estimator}}.tsv"
    wildcard_constraints:
        estimator=TARGET_FREE_SKETCH_ESTIMATORS,
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    params:
        config=estimator_config,
        code=estimator_code,
        cells=[(UNDRAWN, "none")],
    script:
        "../scripts/score.py"


# An estimator that needs the model (score/model_run.py): the checkpoints, the rollout log and the probe targets,
# no sketches. One job per seed fits what the estimator fits once per seed (ekfac's factors, trackstar's rollout
# gradients), then scores every draw and target kind (SCORE_CELLS): each job's imports of torch, transformers and the
# estimator's library cost seconds.
rule score_model:
    input:
        rollouts=ROLLOUTS,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
        targets=expand(TARGET_STORE, draw=DRAWS, allow_missing=True),
        probes=PROBE_PROMPTS,
    output:
        rollouts=score_cell_paths(SCORES),
        steps=score_cell_paths(STEP_SCORES),
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
        cells=SCORE_CELLS,
    script:
        "../scripts/score_model.py"
