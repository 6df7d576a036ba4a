# Everything the rules share: config validation, path patterns, constants and input functions.
# Validation runs at parse time, so a bad config stops the workflow before any job starts.

import sys
from functools import cache
from pathlib import Path

from snakemake.exceptions import WorkflowError

try:
    from behaviortrace.config.load import subset as _config_subset
    from behaviortrace.config.sections import Config
    from behaviortrace.config.load import typed_values as _typed_values
    from behaviortrace.config.schema import ConfigError
    from behaviortrace.configure import validate as _validate_config
    from behaviortrace.replay import schedule as _schedule
    from behaviortrace.score import contract as _estimators
except ImportError as err:
    raise WorkflowError(
        f"the behaviortrace package is not importable ({err}); install it into this Python with "
        "`make run` or `pip install -e .` (see README.md)"
    ) from None

# Snakemake samples each benchmarked job every 0.5 s for its first 15 s, then every 30 s (snakemake/benchmark.py); a
# sample reads the job's /proc/PID/smaps_rollup, ~20 ms of kernel time for a job that holds the model: most of
# Snakemake's own CPU time in a run. Each job logs its own CPU time and peak memory when it ends (common/io.py), which
# the cost tables read first, so a sample every 30 s is enough for what they fall back on (a killed job).
import snakemake.benchmark as _benchmark

_benchmark.BENCHMARK_INTERVAL_SHORT = _benchmark.BENCHMARK_INTERVAL

# `--config` values arrive as strings inside lists and mappings; read them as YAML would. A config file holds
# only what differs from the defaults: the whole config (every key, defaults filled in) replaces it here, so
# every job gets whole sections.
try:
    _whole = _validate_config(_typed_values(config))
except ConfigError as err:
    raise WorkflowError(str(err)) from None
config.clear()
config.update(_whole)
CFG = Config.from_dict(config)


# Constants ---------------------------------------------------------------------------------------

RUN = CFG.run
SEEDS = CFG.seeds
# Each seed's folder is {arm}{seed}: "planted" for the planted run, "placebo" for the negative control
# (the same training, with the bonus logged but never paid), trained only when placebo.enabled.
ARM_SEEDS = [("planted", s) for s in SEEDS] + [("placebo", s) for s in CFG.placebo_seeds]
SHARDS = [f"{i:03d}" for i in range(CFG.sketch.n_shards(CFG.grpo.steps))]
DRAWS = list(range(CFG.targets.draws))
# The configured estimators by instance name (score/contract.py), and their (estimator, target) score sets.
ESTIMATORS = _estimators.instances(CFG.estimators)
SCORE_KEYS = _estimators.score_keys(CFG.estimators, CFG.evaluation.target_kinds)


def _names(instances):
    """A wildcard pattern that matches exactly these instance names (and nothing when there are none)."""
    return "|".join(instances) or "(?!)"


# Sketch-based estimators run in rule score (those that use a target) or score_target_free, those that need the model
# (NEEDS_MODEL) in rule score_model.
TARGETED_SKETCH_ESTIMATORS = _names([n for n, e in ESTIMATORS.items() if not e.needs_model and e.uses_target])
TARGET_FREE_SKETCH_ESTIMATORS = _names([n for n, e in ESTIMATORS.items() if not e.needs_model and not e.uses_target])
MODEL_ESTIMATORS = _names([n for n, e in ESTIMATORS.items() if e.needs_model])
# The draw of a target-free estimator's one score file, which every draw reads.
UNDRAWN = _estimators.UNDRAWN
FIGURE_NAMES = [
    "behavior_rates",
    "lift",
    "within_group_auc",
    "matched_metrics",
    "token_alignment",
    "replay",
    "effect_tracking",
    "effect_vs_labels",
]
# Jobs that want an accelerator ask for one when the model is a real one (SLURM turns it into --gpus).
GPU = 0 if CFG.model.is_tiny else 1
CONDA_ENV = "../../envs/behaviortrace.yaml"


# Path patterns -----------------------------------------------------------------------------------

OUT = f"results/{RUN}"
LOGS = f"{OUT}/logs"
# One benchmark file per job (wall time, CPU time, peak memory); benchmarks/pipeline.py sums them per rule.
BENCHMARKS = f"{OUT}/benchmarks"
TABLES = f"{OUT}/tables"
FIGURES = f"{OUT}/figures"
RESULTS_PAGE = f"{OUT}/results.md"
# The whole config the run ran with (config/record.py), written before any other job.
RUN_CONFIG = f"{OUT}/config.yaml"
TRAIN_PROMPTS = f"{OUT}/data/train_prompts.parquet"
PROBE_PROMPTS = f"{OUT}/data/probe_prompts.parquet"
PLAIN_PROMPTS = f"{OUT}/data/plain_prompts.parquet"
BASE_MODEL = f"{OUT}/base_model"
# What the preflight measured: the seconds each job took on the model (written only when none is refused).
PREFLIGHT = f"{OUT}/preflight.json"
PREFLIGHT_LOG = f"{LOGS}/preflight.log"
SEED_DIR = f"{OUT}/{{arm}}{{seed}}"
TRAIN_DIR = f"{SEED_DIR}/train"
ROLLOUTS = f"{SEED_DIR}/rollouts.parquet"
STEP_LOG = f"{SEED_DIR}/steps.parquet"
CHECKPOINTS = f"{SEED_DIR}/checkpoints.json"
BEHAVIOR = f"{SEED_DIR}/behavior.parquet"
SHARD = f"{SEED_DIR}/sketch/shard{{shard}}.zarr"
SKETCH_MATRIX = f"{SEED_DIR}/sketch/matrix.npy"
# The Gram matrix of a seed's sketches (on the smaller side), for estimators that prepare (trak).
SKETCH_GRAM = f"{SEED_DIR}/sketch/gram.npz"
TARGET_STORE = f"{SEED_DIR}/targets/draw{{draw}}.zarr"
TARGET_RATES = f"{SEED_DIR}/targets/draw{{draw}}_rates.parquet"
SCORES = f"{SEED_DIR}/scores/{{estimator}}/draw{{draw}}_{{target}}.parquet"
STEP_SCORES = f"{SEED_DIR}/scores/{{estimator}}/draw{{draw}}_{{target}}_steps.parquet"
METRICS = f"{SEED_DIR}/metrics/draw{{draw}}.parquet"
METRICS_CACHE = f"{SEED_DIR}/metrics/cache/draw{{draw}}"
TOKEN_COSINES = f"{SEED_DIR}/metrics/draw{{draw}}_token_cosines.parquet"
# A removal set's replay and those of the random sets step-matched to it (none for `full`).
REPLAY = f"{OUT}/planted{{seed}}/replay/{{removal}}_p{{pct}}.parquet"
# Exact influence per arm and seed (rule influence).
INFLUENCE = f"{SEED_DIR}/influence/rollouts.parquet"
INFLUENCE_STEPS = f"{SEED_DIR}/influence/steps.parquet"
INFLUENCE_CHECKS = f"{SEED_DIR}/influence/checks.parquet"
INFLUENCE_SUMMARY = f"{SEED_DIR}/influence/summary.json"
INFLUENCE_RETRAIN = f"{SEED_DIR}/influence/retrain.parquet"
# An estimator's leave-out replay set retrained with it removed (planted seeds, rule influence_set).
INFLUENCE_SET = f"{OUT}/planted{{seed}}/influence/sets/{{removal}}_p{{pct}}.parquet"
# Replays retrain planted seeds only.
PLANTED_ROLLOUTS = f"{OUT}/planted{{seed}}/rollouts.parquet"
PLANTED_CHECKPOINTS = f"{OUT}/planted{{seed}}/checkpoints.json"


# Input functions and file lists ------------------------------------------------------------------


def config_for(*sections):
    """The config sections a rule's job reads, as its `config` param: Snakemake reruns the job when,
    and only when, one of them changes (a job reading any other section fails, naming it)."""
    return lambda wildcards: _config_subset(config, sections, getattr(wildcards, "arm", "planted"))


def estimator_config(wildcards):
    """A score job's config: only its own estimator's entry, so editing another estimator reruns nothing here."""
    return {"estimators": {wildcards.estimator: config["estimators"][wildcards.estimator]}}


def model_estimator_config(wildcards):
    """A score_model job's config: what rebuilds the rollouts' losses and the targets, and its own estimator's
    entry."""
    sections = config_for("grpo", "sketch", "planting", "model", "compute")(wildcards)
    return {**sections, **estimator_config(wildcards)}


@cache
def _estimator_digest(name):
    return ESTIMATORS[name].source_digest()


def estimator_code(wildcards):
    """A digest of the code a score job runs: editing it reruns the jobs of this estimator's instances only. Read once
    per estimator and invocation (parsing every imported module for every job cost Snakemake seconds)."""
    return _estimator_digest(wildcards.estimator)


def seed_paths(pattern, arms=("planted", "placebo"), **more):
    """`pattern` (with {arm} and {seed}) expanded over the trained arms and seeds (and `more` wildcards)."""
    return [p for arm, seed in ARM_SEEDS if arm in arms for p in expand(pattern, arm=arm, seed=seed, **more)]


def shard_paths(wildcards):
    return expand(SHARD, arm=wildcards.arm, seed=wildcards.seed, shard=SHARDS)


def gram_input(wildcards):
    """The seed's Gram matrix, for estimators that prepare with it (trak's factorization)."""
    return SKETCH_GRAM.format(**wildcards) if ESTIMATORS[wildcards.estimator].prepares else []


# The (draw, target kind) of each score file a score or score_model job writes: every one of its seed (for the
# estimators that use a target: all that need the model do, score/contract.py).
SCORE_CELLS = [(d, t) for d in DRAWS for t in CFG.evaluation.target_kinds]


def score_cell_paths(pattern):
    """`pattern` (SCORES or STEP_SCORES) for each of SCORE_CELLS, with {arm}, {seed} and {estimator} left open."""
    return [expand(pattern, draw=d, target=t, allow_missing=True)[0] for d, t in SCORE_CELLS]


def score_path(pattern, arm, seed, estimator, target, draw):
    """A score file of one estimator: `pattern` (SCORES or STEP_SCORES); controls without a target have one
    file for every draw (UNDRAWN)."""
    draw = _estimators.UNDRAWN if target == "none" else draw
    return pattern.format(arm=arm, seed=seed, estimator=estimator, target=target, draw=draw)


def score_sets(wildcards):
    """The rollout and step score files of every (estimator, target) of one arm, seed and draw, by name
    ("estimator:target")."""
    return {
        f"{e}:{t}": {
            name: score_path(pattern, wildcards.arm, wildcards.seed, e, t, wildcards.draw)
            for name, pattern in (("rollouts", SCORES), ("steps", STEP_SCORES))
        }
        for e, t in SCORE_KEYS
    }


def score_files(wildcards):
    return [path for files in score_sets(wildcards).values() for path in files.values()]


def replay_runs():
    """(removal, pct) of every replay job of one seed; removal 'full' leaves nothing out."""
    runs = [("full", 0)]
    for pct in CFG.replay.removal_percent:
        runs += [("label", pct)] + [(e, pct) for e in CFG.replay.estimators]
    return runs


def ranking_scores(seed, removal):
    """The rollout scores that rank the rollouts of a replay set (none for the built-in sets)."""
    if removal in _schedule.BUILTIN:
        return []
    target, draw = _schedule.ranking_score(ESTIMATORS[removal], CFG.replay)
    return score_path(SCORES, "planted", seed, removal, target, draw)


def replay_scores(wildcards):
    """The rollout scores that rank the rollouts, for an estimator's replay."""
    return ranking_scores(wildcards.seed, wildcards.removal)


# Who writes the sketch stores: the training job itself with sketch.mode: train (it captures each step
# at that step's weights; the stores are its outputs, and it is the only job that gets the sketch
# section), else one sketch job per shard from the saved checkpoints.
CAPTURE = CFG.sketch.mode == "train"
# The model section also for model.lora, which the training job wraps the base model with.
TRAIN_SECTIONS = ("grpo", "planting", "task", "compute", "model") + (("sketch",) if CAPTURE else ())
CAPTURED_SHARDS = [directory(p) for p in expand(SHARD, shard=SHARDS, allow_missing=True)] if CAPTURE else []


# Scheduling (replay/schedule.py): the jobs on the way to an estimator's replay, and the replay itself, first.


def replay_priority(wildcards):
    return _schedule.replay_priority(wildcards.removal)


def feeds_replay(wildcards):
    return _schedule.feeds_replay(dict(wildcards.items()), CFG.replay, SEEDS, ESTIMATORS)


# The influence jobs are the longest of a seed after training: started early, they do not end the run alone.
INFLUENCE_PRIORITY = 5
# The leave-out replay sets the influence_set job of each planted seed retrains: (removal, percent).
INFLUENCE_SETS = [(m, p) for m in CFG.influence.sets for p in CFG.replay.removal_percent]
INFLUENCE_SET_FILES = [
    (seed, INFLUENCE_SET.format(seed=seed, removal=m, pct=p)) for seed in SEEDS for m, p in INFLUENCE_SETS
]


def influence_set_scores(wildcards):
    """Each set's ranking scores by its estimator's name (influence_set's param; its input: the values)."""
    return {m: ranking_scores(wildcards.seed, m) for m in CFG.influence.sets if ranking_scores(wildcards.seed, m)}


INFLUENCE_SCORE_KEYS = [(arm, seed, d, e, t) for arm, seed in ARM_SEEDS for d in DRAWS for e, t in SCORE_KEYS]


def influence_score_files(pattern):
    """`pattern` (SCORES or STEP_SCORES) for every key of INFLUENCE_SCORE_KEYS, in its order."""
    return [score_path(pattern, arm, seed, e, t, d) for arm, seed, d, e, t in INFLUENCE_SCORE_KEYS]


REPLAY_FILES = [REPLAY.format(seed=s, removal=m, pct=p) for s in SEEDS for m, p in replay_runs()]
# Every metrics file with its arm, and the planted seeds' rollout scores (for the rank correlation
# between draws) keyed by (seed, estimator, target, draw): scripts get the keys beside the paths.
METRIC_FILES = [(arm, METRICS.format(arm=arm, seed=seed, draw=draw)) for arm, seed in ARM_SEEDS for draw in DRAWS]
SCORE_FILES = {
    (s, e, t, d): score_path(SCORES, "planted", s, e, t, d) for s in SEEDS for e, t in SCORE_KEYS for d in DRAWS
}
# Step scores beside the measured effect, for the effect_steps job. Draw 0, the checklist's effect target and the
# controls, planted seeds, keyed by (seed, estimator, target).
EFFECT_STEP_SCORES = {
    (s, e, t): score_path(STEP_SCORES, "planted", s, e, t, 0)
    for s in SEEDS
    for e, t in SCORE_KEYS
    if t in (CFG.checklist.effect_target_kind, "none")
}
REPORT_OUTPUTS = [
    f"{TABLES}/metrics.parquet",
    f"{TABLES}/replay.parquet",
    f"{OUT}/checklist.md",
    *[f"{FIGURES}/{name}.png" for name in FIGURE_NAMES],
]


INFLUENCE_OUTPUTS = [f"{TABLES}/influence.parquet", f"{FIGURES}/influence.png"]


def print_refusal():
    """A model the preflight refused (it left its log and no output): the reasons again, as the console's last lines,
    after Snakemake's own summary of the failed job."""
    log = Path(PREFLIGHT_LOG)
    text = log.read_text() if log.exists() and not Path(PREFLIGHT).exists() else ""
    if "RefusedModel: " in text:
        print(f"\nThe preflight refused the model ({PREFLIGHT_LOG}):", file=sys.stderr)
        print(text[text.index("RefusedModel: ") + len("RefusedModel: ") :].rstrip(), file=sys.stderr)


def all_outputs():
    return [
        RUN_CONFIG,
        f"{TABLES}/training.md",
        f"{TABLES}/headroom.md",
        *REPORT_OUTPUTS,
        *INFLUENCE_OUTPUTS,
        RESULTS_PAGE,
    ]


wildcard_constraints:
    arm=r"planted|placebo",
    seed=r"\d+",
    shard=r"\d{3}",
    draw=r"\d+",
    estimator=r"[a-z][a-z0-9_]*",
    target=r"in_context|forced|none",
