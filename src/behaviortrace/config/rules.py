"""Cross-key rules that need only the config: each returns the problems it finds, every one naming its key
and value. Rules that need a stage's knowledge (task words, TRL's losses, the checkpoint schedule, the
estimators) live with that stage and are collected by `behaviortrace.configure`."""

from __future__ import annotations

import re
from pathlib import Path

from behaviortrace.config.sections import Config

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_local_path(name: str) -> bool:
    """A model name that is meant as a path (rather than a hub id such as Qwen/Qwen2.5-1.5B-Instruct)."""
    return name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists() or not _HUB_ID.match(name)


def _window(cfg: Config) -> list[str]:
    start, end = cfg.planting.window
    problems = []
    if start > end:
        problems.append(f"config key planting.window = {cfg.planting.window}: start is after end")
    if end >= cfg.grpo.steps:
        problems.append(
            f"config key planting.window = {cfg.planting.window}: ends past the last step "
            f"(grpo.steps = {cfg.grpo.steps}, so the last step is {cfg.grpo.steps - 1})"
        )
    return problems


def _schedule(cfg: Config) -> list[str]:
    """A warm-up that never ends, or one the scheduler ignores, would train another schedule than the one named."""
    grpo, problems = cfg.grpo, []
    if grpo.warmup_steps >= grpo.steps:
        problems.append(
            f"config key grpo.warmup_steps = {grpo.warmup_steps}: the warm-up would not end within grpo.steps = "
            f"{grpo.steps}"
        )
    if grpo.warmup_steps and grpo.lr_scheduler == "constant":
        problems.append(
            f"config key grpo.warmup_steps = {grpo.warmup_steps}: grpo.lr_scheduler = 'constant' has no warm-up "
            "(transformers ignores it); use constant_with_warmup, or warmup_steps: 0"
        )
    return problems


def _task(cfg: Config) -> list[str]:
    if cfg.task.min_len > cfg.task.max_len:
        return [f"config key task.min_len = {cfg.task.min_len}: larger than task.max_len = {cfg.task.max_len}"]
    return []


def _plant_words(cfg: Config) -> list[str]:
    trigger, marker = cfg.planting.trigger, cfg.planting.marker
    if trigger == marker:
        return [f"config key planting.marker = {marker!r}: must differ from planting.trigger"]
    if marker in trigger:
        return [
            f"config key planting.marker = {marker!r}: occurs inside planting.trigger = {trigger!r}, so a "
            "completion that repeats the trigger would count as the behavior"
        ]
    return []


def _real_model(name: str) -> list[str]:
    """A local folder must exist; a hub id must be in the local Hugging Face cache (HF_HUB_CACHE, else
    HF_HOME/hub). The hub's own lookup of its config.json reads files only, never the network: a missing model
    stops validation at once, where a base_model job would spend minutes in download retries."""
    if is_local_path(name):
        if Path(name).expanduser().exists():
            return []
        return [
            f"config key model.name = {name!r}: no such local model path "
            "(use 'tiny', a Hugging Face id like org/name, or an existing folder)"
        ]
    from huggingface_hub import constants, try_to_load_from_cache  # only a real model pays for the import

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return []
    return [
        f"config key model.name = {name!r}: not in the local Hugging Face cache ({constants.HF_HUB_CACHE}); "
        f"fetch it first with `hf download {name}`, point HF_HOME or HF_HUB_CACHE at the cache that holds it, "
        "or set model.name to a local folder"
    ]


def _model(cfg: Config) -> list[str]:
    model, problems = cfg.model, []
    if not model.is_tiny:
        return _real_model(model.name)
    if cfg.task.prompt_format == "chat":
        problems.append(
            "config key task.prompt_format = 'chat': the built-in tiny model's tokenizer has no chat template "
            "(it is trained on plain prompts); use auto or plain"
        )
    tiny = model.tiny
    if tiny.num_heads % tiny.num_kv_heads:
        problems.append(
            f"config key model.tiny.num_kv_heads = {tiny.num_kv_heads}: must divide "
            f"model.tiny.num_heads = {tiny.num_heads}"
        )
    if tiny.hidden_size % tiny.num_heads:
        problems.append(
            f"config key model.tiny.num_heads = {tiny.num_heads}: must divide "
            f"model.tiny.hidden_size = {tiny.hidden_size}"
        )
    return problems


def _lora(cfg: Config) -> list[str]:
    """TRL computes the loss's log-probs from `lm_head.weight` directly (a fused head), so an adapter there would
    never train; TRL refuses it at start, this refuses it before anything runs."""
    lora = cfg.model.lora
    if lora.enabled and "lm_head" in lora.target_modules:
        return [
            f"config key model.lora.target_modules = {lora.target_modules}: lm_head cannot carry an adapter (TRL "
            "computes log-probs from lm_head.weight directly, so it would never be trained)"
        ]
    return []


# The most memory one training step's sketches may take: 1 TB, beyond the host memory of any single node a
# run can count on (the sketcher cannot spill them to disk).
STEP_SKETCH_LIMIT = 10**12


def _sketch_size(cfg: Config) -> list[str]:
    """A training step holds three float32 sketches (full, behavior and null share) of k values for each of
    its rollouts in host memory at once (sketch/sketcher.py); a width whose step cannot fit is refused here
    rather than by the training job running out of memory. The paper's k = 65,536 on 16 rollouts: 12.6 MB."""
    rollouts, k = cfg.grpo.batch_size, cfg.sketch.k
    need = 3 * 4 * rollouts * k
    if need <= STEP_SKETCH_LIMIT:
        return []
    return [
        f"config key sketch.k = {k}: a training step holds 3 float32 sketches of k values for each of its "
        f"{rollouts} rollouts (grpo.prompts_per_step x grpo.num_generations) in memory, {need:,} bytes "
        f"({need / 1e9:,.1f} GB), over the {STEP_SKETCH_LIMIT / 1e9:,.0f} GB one machine can be counted on to hold; "
        "lower sketch.k (the paper used 65536)"
    ]


def _estimator_settings(cfg: Config) -> list[str]:
    """trak's ridge is lambda_scale x the mean diagonal of Phi^T Phi: at 0 or below the matrix it factors is
    not positive definite, and its Cholesky factorization would fail only after training and sketching."""
    problems = []
    for name, entry in cfg.estimators.items():
        value = entry.get("lambda_scale", 0.1)
        positive = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        if entry.get("module", name) == "trak" and not positive:
            problems.append(
                f"config key estimators.{name}.lambda_scale = {value!r}: must be a number > 0 "
                "(the ridge of trak's (Phi^T Phi + lambda I)^-1; the paper used 0.1)"
            )
    return problems


def _analysis(cfg: Config) -> list[str]:
    kinds, problems = cfg.evaluation.target_kinds, []
    for name, kind in (
        ("checklist.effect_target_kind", cfg.checklist.effect_target_kind),
        ("checklist.target_kind", cfg.checklist.target_kind),
    ):
        if kind not in kinds:
            problems.append(f"config key {name} = {kind!r}: not among evaluation.target_kinds {kinds}")
    replay = cfg.replay
    for name in replay.estimators:
        if name not in cfg.estimators:
            problems.append(f"config key replay.estimators: {name!r} is not under estimators")
        if name in ("full", "label", "random"):
            problems.append(f"config key replay.estimators: {name!r} is a built-in replay (always run); remove it")
    if replay.target_kind not in kinds:
        problems.append(f"config key replay.target_kind = {replay.target_kind!r}: not among evaluation.target_kinds")
    if replay.draw >= cfg.targets.draws:
        problems.append(f"config key replay.draw = {replay.draw}: only {cfg.targets.draws} draws (targets.draws)")
    influence = cfg.influence
    end, first = influence.end_step(cfg.planting, cfg.grpo.steps), cfg.planting.window[0]
    if end > cfg.grpo.steps:
        problems.append(
            f"config key influence.measure_at = {influence.measure_at!r}: T = {end} is past the last step "
            f"(grpo.steps = {cfg.grpo.steps})"
        )
    if end <= first:
        problems.append(
            f"config key influence.measure_at = {influence.measure_at!r}: T = {end} is at or before the first step "
            f"of planting.window = {cfg.planting.window}, so no paid rollout comes before it; use a later step or "
            "window_start+N"
        )
    if 0 < influence.lds_subsets < 3:
        problems.append(
            f"config key influence.lds_subsets = {influence.lds_subsets}: a rank correlation over subsets needs "
            "at least 3 (or 0 for no LDS)"
        )
    for name in influence.sets:
        if name not in replay.estimators:
            problems.append(
                f"config key influence.sets: {name!r} is not among replay.estimators {replay.estimators} "
                "(its top-k set is the leave-out replay's; the paid set is always retrained)"
            )
    if cfg.placebo.enabled and not cfg.placebo.seeds:
        problems.append("config key placebo.seeds = []: placebo.enabled is true but no seed is listed")
    return problems


RULES = (_window, _schedule, _task, _plant_words, _model, _lora, _sketch_size, _estimator_settings, _analysis)


def problems(cfg: Config) -> list[str]:
    """Every problem the config-only rules find."""
    return [problem for rule in RULES for problem in rule(cfg)]
