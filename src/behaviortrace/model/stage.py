"""Rules preflight and base_model: try every job that needs the model on it before anything trains; build the
tiny model or load a real one, run the optional SFT warm-up, save it."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from pathlib import Path

from behaviortrace.common import device as devices
from behaviortrace.common.io import atomic_write_text, replace_dir, scratch_dir
from behaviortrace.config.sections import Config
from behaviortrace.influence.preflight import influence_problems
from behaviortrace.model import lora, models, tiny
from behaviortrace.model.models import load_pretrained
from behaviortrace.model.prompt_format import set_prompt_format
from behaviortrace.model.sft import train_on_pairs
from behaviortrace.model.tiny import build_tiny, corpus_pair
from behaviortrace.score import contract
from behaviortrace.score.preflight import ProbeRun, estimator_problem, probe_target
from behaviortrace.sketch.preflight import capture_problems, capture_tolerance, check_capture

log = logging.getLogger(__name__)


class RefusedModel(ValueError):
    """Jobs of the run cannot run on this model; the message names each one, where it failed and the ways out.
    `problems` maps each refused job (train_grpo, estimators.<name>, influence) to its reason."""

    def __init__(self, message: str, problems: dict[str, str]):
        super().__init__(message)
        self.problems = problems


WAYS_OUT = (
    "Ways out: drop the instance (estimators.<name>: null) and keep the others, or score with another one (the "
    "sketch-based trak and tracincp read no layer of the model); train LoRA adapters (model.lora.rank > 0, "
    "model.lora.target_modules) on layers the library handles; or give the harness a rule for this layer class "
    "(docs/models.md, 'Every job on a model you bring'). The influence: influence.fd_rollouts: 0 runs no float64 "
    "checks."
)


def preflight_job(cfg: Config, *, out: Path) -> None:
    """Try every job that needs the model on it, before the base model is built (so before the SFT warm-up), and
    write how long each took to `out`; refuse the model (RefusedModel) if any cannot run."""
    device = devices.resolve(cfg.compute)
    model, tokenizer = preflight_model(cfg, device)
    with scratch_dir(out.parent / ".preflight") as scratch:
        seconds = check_jobs(model, tokenizer, cfg, device, scratch)
    atomic_write_text(json.dumps({"model": cfg.model.name, "seconds": seconds}, indent=1) + "\n", out)


def preflight_model(cfg: Config, device: dict):
    """The model the run trains, before any warm-up: the tiny model's architecture untrained (its weights do not
    change what can run on it), or the model at model.name; under fresh LoRA adapters with model.lora."""
    if cfg.model.is_tiny:
        tokenizer = tiny.build_tokenizer(cfg.planting)
        model = tiny.build_model(tokenizer, cfg.model.tiny, cfg.model.tiny.seed).to(device["device"])
    else:
        model, tokenizer = load_pretrained(cfg.model.name, cfg.model.trust_remote_code, device)
    if cfg.model.lora.enabled:
        model = lora.wrap(model, cfg.model.lora, Path(cfg.model.name), seed=0)
    return model, tokenizer


def check_jobs(model, tokenizer, cfg: Config, device: dict, scratch: Path) -> dict[str, float]:
    """Every job that needs the model tried on `model` (`job_problems`); raises RefusedModel naming each that cannot
    run, else returns the seconds each took."""
    problems, seconds = job_problems(model, tokenizer, cfg, device, scratch)
    log.info("preflight: %s", ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    if problems:
        shown = "\n  ".join(f"{job}: {why}" for job, why in problems.items())
        raise RefusedModel(
            f"model {cfg.model.name!r} ({type(lora.unwrap(model)).__name__}"
            f"{' with LoRA' if cfg.model.lora.enabled else ''}) is refused before training: {len(problems)} of the "
            f"run's jobs cannot run on it (rule preflight, on a handful of synthetic rollouts):\n  {shown}\n"
            + WAYS_OUT,
            problems,
        )
    return seconds


def job_problems(model, tokenizer, cfg: Config, device: dict, scratch: Path) -> tuple[dict[str, str], dict[str, float]]:
    """Per-rollout capture (the training job's, sketch/preflight.py), every configured estimator that needs the
    model (score/preflight.py) and the exact influence (influence/preflight.py), each tried on `model`: the reason
    of each job that cannot run (train_grpo, estimators.<name>, influence), and the seconds each try took."""
    problems, seconds, started = {}, {}, time.time()
    capture = capture_problems(model, tokenizer.pad_token_id, capture_tolerance(model))
    if capture:
        more = f" (and {len(capture) - 1} more)" if len(capture) > 1 else ""
        problems["train_grpo"] = f"per-rollout capture, in either sketch.mode: {capture[0]}{more}"
    seconds["capture"] = time.time() - started
    run = ProbeRun(model, tokenizer, cfg.grpo, device, scratch)
    vocab = model.get_input_embeddings().num_embeddings
    target = probe_target(vocab, tokenizer.pad_token_id, cfg.grpo.temperature, device)
    for name, instance in contract.instances(cfg.estimators).items():
        if not instance.needs_model:
            continue
        started = time.time()
        problem = estimator_problem(name, cfg.estimators[name], run, target)
        seconds[name] = time.time() - started
        if problem:
            library = ", ".join(getattr(instance.module, "REQUIRES", ())) or "behaviortrace"
            problems[f"estimators.{name}"] = f"(module {instance.module_name}, library {library}) {problem}"
    started = time.time()
    inf = cfg.influence
    influence = influence_problems(model, run.batch(run.rows()), inf.dtype, inf.fd_rollouts > 0)
    if influence:
        problems["influence"] = "; ".join(influence)
    seconds["influence"] = time.time() - started
    return problems, seconds


def base_model_job(cfg: Config, *, out: Path) -> None:
    """Write the base model and its tokenizer to `out`, in one move once complete."""
    device = devices.resolve(cfg.compute)
    log.info("base model %r on %s", cfg.model.name, device["device"])
    model, tokenizer = build_base_model(cfg, device)
    tmp = out.with_name(out.name + ".tmp")
    models.save(model, tokenizer, tmp)
    replace_dir(tmp, out)
    log.info("saved %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))


def build_base_model(cfg: Config, device: dict):
    """Build or load the base model, fix its prompt format in its tokenizer (model/prompt_format.py), run the
    optional SFT warm-up on task demonstrations, and check that per-rollout gradients can be captured on it
    (sketch/preflight.py), so that a model they cannot be is refused before anything trains."""
    mcfg = cfg.model
    if mcfg.name == "tiny":
        model, tokenizer = build_tiny(cfg.task, cfg.planting, mcfg.tiny)
        model = model.to(device["device"])
    else:
        model, tokenizer = load_pretrained(mcfg.name, mcfg.trust_remote_code, device)
    chosen = set_prompt_format(tokenizer, cfg.task.prompt_format, mcfg.name)
    log.info("prompt format: %s (task.prompt_format: %s)", chosen, cfg.task.prompt_format)
    sft = mcfg.sft
    if sft.steps > 0:
        rng = random.Random(sft.seed)
        # Demonstrations of the base task only: no trigger and no marker, so the warm-up cannot plant the behavior.
        plain = dataclasses.replace(
            mcfg.tiny, marker_rate=0.0, plain_marker_rate=0.0, marker_practice=0.0, trigger_rate=0.0
        )
        train_on_pairs(
            model,
            tokenizer,
            lambda: corpus_pair(rng, cfg.task, cfg.planting, plain),
            sft.steps,
            sft.batch_size,
            sft.lr,
            sft.seed,
            device=device,
        )
    check_capture(model, tokenizer.pad_token_id, capture_tolerance(model), mcfg.name)
    return model, tokenizer
