# With sketch.mode: train the training job writes the stores (it is preferred where both could).
ruleorder: train_grpo > sketch


rule sketch:
    input:
        rollouts=ROLLOUTS,
        steps=STEP_LOG,
        checkpoints=CHECKPOINTS,
        base_model=BASE_MODEL,
    output:
        directory(SHARD),
    log:
        f"{LOGS}/sketch/{{arm}}{{seed}}_shard{{shard}}.log",
    benchmark:
        f"{BENCHMARKS}/sketch/{{arm}}{{seed}}_shard{{shard}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=GPU,
    params:
        config=config_for("sketch", "grpo", "planting", "model", "compute"),
    script:
        "../scripts/sketch.py"


# Every score job of a seed reads this one uncompressed, memory-mapped copy of the seed's sketches
# (k x 4 bytes per rollout). It is kept: remade, it would make every estimator's scores look out of date.
rule sketch_matrix:
    input:
        shards=shard_paths,
    output:
        SKETCH_MATRIX,
    log:
        f"{LOGS}/sketch_matrix/{{arm}}{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/sketch_matrix/{{arm}}{{seed}}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/sketch_matrix.py"


# Built only for estimators that prepare (their score jobs read it): rerunning one then factors it only.
rule sketch_gram:
    input:
        matrix=SKETCH_MATRIX,
    output:
        SKETCH_GRAM,
    log:
        f"{LOGS}/sketch_gram/{{arm}}{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/sketch_gram/{{arm}}{{seed}}.tsv"
    priority: feeds_replay
    conda:
        CONDA_ENV
    threads: 1
    script:
        "../scripts/sketch_gram.py"
