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


def _model(cfg: Config) -> list[str]:
    model, problems = cfg.model, []
    if not model.is_tiny and is_local_path(model.name) and not Path(model.name).expanduser().exists():
        problems.append(
            f"config key model.name = {model.name!r}: no such local model path "
            "(use 'tiny', a Hugging Face id like org/name, or an existing folder)"
        )
    if not model.is_tiny:
        return problems
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
        if name in ("full", "oracle", "random"):
            problems.append(f"config key replay.estimators: {name!r} is a built-in replay (always run); remove it")
    if replay.target_kind not in kinds:
        problems.append(f"config key replay.target_kind = {replay.target_kind!r}: not among evaluation.target_kinds")
    if replay.draw >= cfg.targets.draws:
        problems.append(f"config key replay.draw = {replay.draw}: only {cfg.targets.draws} draws (targets.draws)")
    influence = cfg.influence
    if isinstance(influence.measure_at, int) and influence.measure_at > cfg.grpo.steps:
        problems.append(
            f"config key influence.measure_at = {influence.measure_at}: past the last step "
            f"(grpo.steps = {cfg.grpo.steps})"
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


RULES = (_window, _task, _plant_words, _model, _analysis)


def problems(cfg: Config) -> list[str]:
    """Every problem the config-only rules find."""
    return [problem for rule in RULES for problem in rule(cfg)]
