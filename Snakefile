# BehaviorTrace: does training-data attribution find the GRPO rollouts that taught a planted behavior?
# Run `snakemake --cores all` (defaults: config/config.yaml); see README.md.

configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/sketch.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/replay.smk"


rule all:
    input:
        all_outputs(),
    default_target: True
