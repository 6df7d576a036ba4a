"""Config validation: the schema first, then the checks a schema cannot express.

Every error names the config key and the offending value, and all of this runs when the Snakefile is
parsed, before any job starts.
"""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import yaml

from behaviortrace.config.sections import Planting
from behaviortrace.model.vocab import SPECIAL_TOKENS
from behaviortrace.plant.task import TASK_WORDS
from behaviortrace.score.contract import check_params
from behaviortrace.sketch.tolerance import tolerance_for
from behaviortrace.train.checkpoints import saved_steps
from behaviortrace.train.trl_surface import SKETCHABLE_LOSSES

# Shipped inside the package, so validation works from any install, editable or not.
SCHEMA = Path(__file__).resolve().parent / "schema.yaml"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ConfigError(ValueError):
    pass


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def check_schema(config: dict, schema_path: Path = SCHEMA) -> None:
    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors:
            if e.validator == "additionalProperties":
                lines.append(f"config key {_key(e.absolute_path)}: {e.message}")
            else:
                lines.append(f"config key {_key(e.absolute_path)} = {e.instance!r}: {e.message}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))


def is_local_path(name: str) -> bool:
    """A model name that is meant as a path (rather than a hub id such as Qwen/Qwen2.5-1.5B-Instruct)."""
    return name.startswith(("/", "./", "../", "~")) or Path(name).expanduser().exists() or not _HUB_ID.match(name)


def check_semantics(config: dict) -> None:
    grpo, planting, task, model = config["grpo"], config["planting"], config["task"], config["model"]
    start, end = planting["window"]
    problems = []
    if start > end:
        problems.append(f"config key planting.window = {planting['window']}: start is after end")
    if end >= grpo["steps"]:
        problems.append(
            f"config key planting.window = {planting['window']}: ends past the last step "
            f"(grpo.steps = {grpo['steps']}, so the last step is {grpo['steps'] - 1})"
        )
    if task["min_len"] > task["max_len"]:
        problems.append(f"config key task.min_len = {task['min_len']}: larger than task.max_len = {task['max_len']}")
    problems += _plant_word_problems(planting, model)
    name = model["name"]
    if name != "tiny" and is_local_path(name) and not Path(name).expanduser().exists():
        problems.append(
            f"config key model.name = {name!r}: no such local model path "
            "(use 'tiny', a Hugging Face id like org/name, or an existing folder)"
        )
    if name == "tiny" and task["prompt_format"] == "chat":
        problems.append(
            "config key task.prompt_format = 'chat': the built-in tiny model's tokenizer has no chat template "
            "(it is trained on plain prompts); use auto or plain"
        )
    tiny = model["tiny"]
    if name == "tiny" and tiny["num_heads"] % tiny["num_kv_heads"]:
        problems.append(
            f"config key model.tiny.num_kv_heads = {tiny['num_kv_heads']}: must divide "
            f"model.tiny.num_heads = {tiny['num_heads']}"
        )
    if name == "tiny" and tiny["hidden_size"] % tiny["num_heads"]:
        problems.append(
            f"config key model.tiny.num_heads = {tiny['num_heads']}: must divide "
            f"model.tiny.hidden_size = {tiny['hidden_size']}"
        )
    problems += _sketch_problems(config)
    problems += _estimator_problems(config)
    problems += _analysis_problems(config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _plant_word_problems(planting: dict, model: dict) -> list[str]:
    """The trigger and marker must be words no ordinary prompt or answer contains (the behavior check is
    "the marker occurs in the completion"), and, for the built-in model, words its tokenizer keeps whole."""
    trigger, marker = planting["trigger"], planting["marker"]
    problems = []
    if trigger == marker:
        return [f"config key planting.marker = {marker!r}: must differ from planting.trigger"]
    for key, word in (("trigger", trigger), ("marker", marker)):
        inside = [w for w in TASK_WORDS if word in w]
        if inside:
            problems.append(
                f"config key planting.{key} = {word!r}: occurs in ordinary task prompts and answers (in "
                f"{', '.join(map(repr, inside))}), so it cannot mark the planted {key}; choose a word the sort "
                "task never uses"
            )
        if model["name"] == "tiny" and word in SPECIAL_TOKENS:
            problems.append(
                f"config key planting.{key} = {word!r}: a special token of the built-in tokenizer "
                f"({', '.join(SPECIAL_TOKENS)}); choose an ordinary word"
            )
    if marker in trigger:
        problems.append(
            f"config key planting.marker = {marker!r}: occurs inside planting.trigger = {trigger!r}, so a "
            "completion that repeats the trigger would count as the behavior"
        )
    return problems


def _sketch_problems(config: dict) -> list[str]:
    grpo, targets = config["grpo"], config["targets"]
    problems = []
    if grpo["loss_type"] not in SKETCHABLE_LOSSES:
        problems.append(
            f"config key grpo.loss_type = {grpo['loss_type']!r}: per-rollout gradients are implemented "
            f"for {', '.join(SKETCHABLE_LOSSES)} only"
        )
    if targets["checkpoints"] != "all":
        window_end = Planting(**config["planting"]).end_checkpoint(grpo["steps"])
        saved = saved_steps(grpo["steps"], grpo["save_every"], window_end)
        missing = sorted(set(targets["checkpoints"]) - set(saved))
        if missing:
            problems.append(
                f"config key targets.checkpoints = {targets['checkpoints']}: steps {missing} have no "
                f"saved checkpoint (saved steps: {saved})"
            )
    return problems


def _estimator_problems(config: dict) -> list[str]:
    """Every estimator exists and gets only keyword arguments its score function takes."""
    return [problem for name, params in config["estimators"].items() for problem in check_params(name, params)]


def _analysis_problems(config: dict) -> list[str]:
    checklist, placebo = config["checklist"], config["placebo"]
    problems = []
    dtype = config["compute"]["dtype"]
    reachable = tolerance_for(dtype)
    if dtype != "float32" and checklist["max_self_check_error"] < reachable:
        problems.append(
            f"config key checklist.max_self_check_error = {checklist['max_self_check_error']}: below what capture "
            f"reaches with compute.dtype = {dtype} (a step's rollout sketches add up to its gradient within "
            f"{reachable:.1e} there, sketch/tolerance.py); set it to {reachable:.1e} or more"
        )
    if checklist["effect_target"] not in config["evaluation"]["targets"]:
        problems.append(
            f"config key checklist.effect_target = {checklist['effect_target']!r}: not among evaluation.targets "
            f"{config['evaluation']['targets']}"
        )
    if checklist["target"] not in config["evaluation"]["targets"]:
        problems.append(
            f"config key checklist.target = {checklist['target']!r}: not among evaluation.targets "
            f"{config['evaluation']['targets']}"
        )
    replay = config["replay"]
    for name in replay["estimators"]:
        if name not in config["estimators"]:
            problems.append(f"config key replay.estimators: {name!r} is not under estimators")
        if name in ("full", "oracle", "random"):
            problems.append(f"config key replay.estimators: {name!r} is a built-in replay (always run); remove it")
    if replay["target"] not in config["evaluation"]["targets"]:
        problems.append(f"config key replay.target = {replay['target']!r}: not among evaluation.targets")
    if replay["draw"] >= config["targets"]["draws"]:
        problems.append(
            f"config key replay.draw = {replay['draw']}: only {config['targets']['draws']} draws (targets.draws)"
        )
    influence = config["influence"]
    if 0 < influence["lds_subsets"] < 3:
        problems.append(
            f"config key influence.lds_subsets = {influence['lds_subsets']}: a rank correlation over subsets needs "
            "at least 3 (or 0 for no LDS)"
        )
    for name in influence["sets"]:
        if name not in replay["estimators"]:
            problems.append(
                f"config key influence.sets: {name!r} is not among replay.estimators {replay['estimators']} "
                "(its top-k set is the leave-out replay's; the GT set is always retrained)"
            )
    if placebo["enabled"] and not placebo["seeds"]:
        problems.append("config key placebo.seeds = []: placebo.enabled is true but no seed is listed")
    return problems


def validate(config: dict) -> dict:
    check_schema(config)
    check_semantics(config)
    return config
