rule plant_data:
    output:
        train=f"{OUT}/data/train_prompts.parquet",
        probes=f"{OUT}/data/probe_prompts.parquet",
        controls=f"{OUT}/data/control_prompts.parquet",
    params:
        task=config["task"],
        planting=config["planting"],
        schedule={k: config["grpo"][k] for k in ("steps", "prompts_per_step")},
        probes=config["probes"],
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/plant_data.log",
    script:
        "../scripts/plant_data.py"


rule base_model:
    output:
        directory(f"{OUT}/base_model"),
    params:
        model=config["model"],
        task=config["task"],
        planting=config["planting"],
        compute=config["compute"],
    threads: 1
    resources:
        gpu=1 if config["model"]["name"] != "tiny" else 0,
    conda:
        CONDA_ENV
    log:
        f"{OUT}/logs/base_model.log",
    script:
        "../scripts/base_model.py"
