"""Every job that needs the model, tried on it before anything trains (rule preflight): the model is refused,
naming each job that cannot run and the ways out, before the SFT warm-up and training spend their time."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from behaviortrace.config.sections import Config
from behaviortrace.influence.preflight import influence_problems
from behaviortrace.model import lora, tiny
from behaviortrace.model.models import load_pretrained
from behaviortrace.score import contract
from behaviortrace.score.preflight import ProbeRun, estimator_problem, probe_target
from behaviortrace.sketch.preflight import capture_problems, capture_tolerance

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
