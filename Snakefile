# BehaviorTrace: does training-data attribution find the GRPO rollouts that taught a planted behavior?
# Run `snakemake --cores all` (defaults: config/config.yaml); see README.md.

from snakemake.utils import min_version

min_version("9.27")


# A --configfile is the whole run over the package's defaults: config/config.yaml is read only without one, so a
# preset runs the defaults plus itself whatever this file holds (config/README.md).
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/plant.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/behavior.smk"
include: "workflow/rules/sketch.smk"
include: "workflow/rules/targets.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/replay.smk"
include: "workflow/rules/influence.smk"
include: "workflow/rules/report.smk"


onerror:
    print_refusal()


rule all:
    default_target: True
    input:
        all_outputs(),
