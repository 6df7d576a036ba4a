"""The estimator contract, and the one place that loads, checks and runs estimators.

An estimator is a module in `behaviortrace.estimators` that satisfies `Estimator`. The config names
instances: each entry under `estimators:` is an `Instance` of a module (its `module` key, else the entry's
own name) with the module's keyword arguments, so one module can run under several settings side by side.
`load` finds a module, `check_params` checks a config entry against its module's `score` signature (at
workflow parse time), `prepare` runs an instance's optional per-seed preparation, `run` scores one seed and
target, and `source_digest` fingerprints the code a score job runs, so that editing an estimator or any
project module it depends on reruns exactly the jobs of the instances that run it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import pkgutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol, runtime_checkable

import numpy as np
import polars as pl

import behaviortrace.estimators as estimators_package
from behaviortrace.common.imports import code_digest, dependency_files, module_name
from behaviortrace.score.view import SeedView, Target

log = logging.getLogger(__name__)
AGGREGATES = ("sum", "mean", "max")
# Config keys of an estimator entry that are not arguments of its score function.
RESERVED = ("module", "step_aggregate")
# Arguments of a score function that the contract fills in, never the config.
SUPPLIED = ("prepared",)
# Controls without a target do not depend on the generation draw: each seed's are scored once, as this draw,
# and every draw's evaluation reads that file.
UNDRAWN = 0


@runtime_checkable
class Estimator(Protocol):
    """What an estimator module provides. Higher scores mean "more likely taught the behavior".

    `view` is a read-only SeedView of one seed's sketches and rollout log (rows in view order);
    `target` a Target, or None when USES_TARGET is False; `params` the estimator's config entry.
    An optional `check(**params) -> list[str]` names problems with the settings' values (run when the workflow
    starts), and optional REQUIRES names the libraries it imports (their absence is a config error).
    An optional `step_score(view, target, **params)` gives a step-level variant, one score per step
    in ascending step order.

    An optional `prepare(view, **params) -> dict[str, np.ndarray]` computes, once per seed, what every
    score job of the seed would otherwise compute for itself (it must not depend on the target or the
    draw); `score` and `step_score` then get it as their `prepared` argument.

    An estimator that needs the model (module attribute NEEDS_MODEL = True) gets a ModelRun
    (score/model_run.py: the rollout log in rollout-id order, the checkpoints, each rollout's loss) in place of
    `view`, and a ModelTarget (the target's items and its value as a function of the weights) in place of
    `target`; it reads no sketches, and its optional `prepare(run, folder, **params) -> None` writes what it fits once
    per seed (kronfluence's factors, TrackStar's rollout gradients) into `folder`, which `score` gets as `prepared`
    (rule score_model fits it first, then scores every cell). Its score files are the same. Before anything trains, the
    rule preflight runs its `score` on the base model with a handful of synthetic rollouts (score/preflight.py),
    with its configured settings updated by an optional module attribute PREFLIGHT_SETTINGS (what so few rollouts
    need), and refuses the model if it fails.
    """

    USES_TARGET: bool  # False for controls that use no target
    # Optional LOG_ONLY = True: a control that reads only the rollout log (see `log_only`).
    STEP_AGGREGATE: str  # how rollout scores make a step score: sum, mean or max

    def score(self, view: SeedView, target: Target | None, **params) -> np.ndarray:
        """One score per rollout, in view order."""


def available() -> list[str]:
    folder = Path(estimators_package.__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if not m.name.startswith("_"))


def module_path(name: str) -> Path:
    return Path(estimators_package.__file__).parent / f"{name}.py"


def load(name: str) -> ModuleType:
    """The estimator module `name`, checked against the contract."""
    if name not in available():
        raise ValueError(
            f"unknown estimator {name!r}; available: {', '.join(available())} "
            f"(add one as src/behaviortrace/estimators/{name}.py)"
        )
    module = importlib.import_module(f"{estimators_package.__name__}.{name}")
    missing = [attr for attr in ("USES_TARGET", "STEP_AGGREGATE", "score") if not hasattr(module, attr)]
    if missing:
        raise TypeError(f"estimator module {module.__name__} lacks {', '.join(missing)} (see score/contract.py)")
    if module.STEP_AGGREGATE not in AGGREGATES:
        raise TypeError(f"estimator module {module.__name__}: STEP_AGGREGATE must be one of {AGGREGATES}")
    if getattr(module, "NEEDS_MODEL", False) and not module.USES_TARGET:
        # Rule score_model writes every draw and target kind of a seed in one job, so its files are fixed.
        raise TypeError(f"estimator module {module.__name__}: NEEDS_MODEL requires USES_TARGET = True")
    return module


@dataclass(frozen=True)
class Instance:
    """One configured estimator: the name its score files and table rows carry, the module it runs, and that
    module's keyword arguments (its config entry less `module` and `step_aggregate`)."""

    name: str
    module_name: str
    arguments: dict
    step_aggregate: str | None = None

    @classmethod
    def of(cls, name: str, entry: dict | None) -> Instance:
        entry = entry or {}
        arguments = {k: v for k, v in entry.items() if k not in RESERVED}
        return cls(name, entry.get("module", name), arguments, entry.get("step_aggregate"))

    @property
    def module(self) -> ModuleType:
        return load(self.module_name)

    @property
    def uses_target(self) -> bool:
        return bool(self.module.USES_TARGET)

    @property
    def log_only(self) -> bool:
        """A log-only control: it reads the rollout log and nothing else (module attribute LOG_ONLY), so anything
        it finds, the reward log already says."""
        return bool(getattr(self.module, "LOG_ONLY", False))

    @property
    def predicts_change(self) -> bool:
        """Whether its step scores are first-order predictions of the target's change, in its units (module
        attribute PREDICTS_CHANGE; evaluate/effect.py reports their share of the measured change)."""
        return bool(getattr(self.module, "PREDICTS_CHANGE", False))

    @property
    def needs_model(self) -> bool:
        """Whether it needs the model, the checkpoints and the probe targets rather than the sketches (module
        attribute NEEDS_MODEL; rule score_model)."""
        return bool(getattr(self.module, "NEEDS_MODEL", False))

    @property
    def prepares(self) -> bool:
        """Whether the module has a per-seed `prepare` step."""
        return hasattr(self.module, "prepare")

    @property
    def requires(self) -> tuple[str, ...]:
        """The libraries the module imports (module attribute REQUIRES)."""
        return tuple(getattr(self.module, "REQUIRES", ()))

    def source_digest(self) -> str:
        return source_digest(self.module_name)


def instances(estimators: dict[str, dict]) -> dict[str, Instance]:
    """Every configured estimator, by instance name."""
    return {name: Instance.of(name, entry) for name, entry in estimators.items()}


def check_params(name: str, params: dict) -> list[str]:
    """Problems with an estimator's config entry, each naming its key (empty when fine)."""
    instance = Instance.of(name, params)
    try:
        module = instance.module
    except (ValueError, TypeError) as err:
        key = f"estimators.{name}.module" if "module" in (params or {}) else f"estimators.{name}"
        return [f"config key {key}: {err}"]
    accepted = (set(list(inspect.signature(module.score).parameters)[2:]) - set(SUPPLIED)) | set(RESERVED)
    problems = [
        f"config key estimators.{name}.{key}: not a parameter of {instance.module_name} "
        f"(accepted: {', '.join(sorted(accepted))})"
        for key in sorted(set(params) - accepted)
    ]
    if hasattr(module, "check") and not problems:  # the module's own checks of its settings' values
        problems += [f"config key estimators.{name}: {p}" for p in module.check(**instance.arguments)]
    missing = [lib for lib in instance.requires if importlib.util.find_spec(lib) is None]
    if missing:
        problems.append(
            f"config key estimators.{name}: {instance.module_name} needs {', '.join(missing)}, which is not "
            "installed (the peers extra: pip install -e '.[peers]' and pip install --no-deps kronfluence==1.0.1 "
            "bergson==2.5.1, as `make run` does; see docs/estimators.md)"
        )
    aggregate = params.get("step_aggregate", "sum")
    if aggregate not in AGGREGATES:
        problems.append(
            f"config key estimators.{name}.step_aggregate = {aggregate!r}: use one of {', '.join(AGGREGATES)}"
        )
    return problems


def score_keys(estimators: dict[str, dict], target_kinds: list[str]) -> list[tuple[str, str]]:
    """(estimator, target) pairs: each target kind for estimators that use one, 'none' for controls."""
    keys = []
    for name, instance in instances(estimators).items():
        keys += [(name, t) for t in target_kinds] if instance.uses_target else [(name, "none")]
    return keys


def prepare(name: str, params: dict, view: SeedView) -> dict[str, np.ndarray]:
    """The estimator's per-seed preparation (see Estimator), as named arrays."""
    instance = Instance.of(name, params)
    if not instance.prepares:
        raise ValueError(f"estimator {name} ({instance.module_name}) has no prepare function")
    started = time.time()
    raw = instance.module.prepare(view, **instance.arguments)
    prepared = {key: np.asarray(value) for key, value in raw.items()}
    log.info("%s: prepared %s in %.1f s", name, ", ".join(sorted(prepared)), time.time() - started)
    return prepared


def prepare_model(name: str, params: dict, run, folder: Path) -> Path:
    """An estimator that needs the model: its per-seed preparation (see Estimator), written into `folder`."""
    instance = Instance.of(name, params)
    if not instance.prepares:
        raise ValueError(f"estimator {name} ({instance.module_name}) has no prepare function")
    started = time.time()
    Path(folder).mkdir(parents=True, exist_ok=True)
    instance.module.prepare(run, Path(folder), **instance.arguments)
    log.info("%s: prepared in %.1f s: %s", name, time.time() - started, folder)
    return Path(folder)


def save_prepared(prepared: dict[str, np.ndarray], path: Path) -> None:
    """Uncompressed .npz, written under a temporary name and renamed when complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        np.savez(handle, **prepared)
    os.replace(tmp, path)


def load_prepared(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def run(
    name: str, params: dict, view: SeedView, target: Target | None, prepared: dict[str, np.ndarray] | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Score one seed against one target: a rollout table and a step table, both checked.

    An estimator with a `prepare` step gets `prepared` (the saved result of `prepare` for this seed and
    config entry: arrays, or a folder for an estimator that needs the model), or prepares here when it is None (an
    estimator that needs the model into the run's scratch folder).
    """
    instance = Instance.of(name, params)
    module, kwargs = instance.module, dict(instance.arguments)
    if module.USES_TARGET and target is None:
        raise ValueError(f"estimator {name} needs a target")
    started = time.time()
    if instance.prepares and prepared is None:
        if instance.needs_model:
            prepared = prepare_model(name, params, view, view.scratch / f"prepared-{name}")
        else:
            prepared = prepare(name, params, view)
    if instance.prepares:
        kwargs["prepared"] = prepared
    scores = np.asarray(module.score(view, target, **kwargs), dtype=np.float64)
    if scores.shape != (view.rollouts.height,):
        raise ValueError(f"estimator {name} returned shape {scores.shape}, expected ({view.rollouts.height},)")
    if not np.isfinite(scores).all():
        raise ValueError(f"estimator {name} returned {int((~np.isfinite(scores)).sum())} non-finite scores")
    variant = module.step_score(view, target, **kwargs) if hasattr(module, "step_score") else None
    aggregate = instance.step_aggregate or module.STEP_AGGREGATE
    rollouts = pl.DataFrame({"rollout_id": view.rollouts["rollout_id"], "step": view.rollouts["step"], "score": scores})
    steps = step_table(view, scores, aggregate, variant)
    log.info(
        "%s: %d rollouts and %d steps scored in %.1f s", name, rollouts.height, steps.height, time.time() - started
    )
    return rollouts, steps


def step_table(view: SeedView, rollout_scores: np.ndarray, aggregate: str, variant: np.ndarray | None) -> pl.DataFrame:
    """Step-level scores: the aggregate of the step's rollout scores, and the step-level variant if any.

    Each step's scores are aggregated in rollout order by numpy, so the same scores give the same step scores to the
    bit (a polars group-by summed in an order that depended on its threads)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"step_aggregate {aggregate!r} is not one of {AGGREGATES}")
    steps = view.rollouts["step"].to_numpy()
    order = np.argsort(steps, kind="stable")
    uniq, starts = np.unique(steps[order], return_index=True)
    reduce = {"sum": np.sum, "mean": np.mean, "max": np.max}[aggregate]
    parts = np.split(np.asarray(rollout_scores, dtype=np.float64)[order], starts[1:])
    out = pl.DataFrame({"step": uniq, "score": np.array([reduce(part) for part in parts], dtype=np.float64)})
    summed = np.full(len(uniq), np.nan) if variant is None else np.asarray(variant, dtype=float)
    if len(summed) != len(uniq):
        raise ValueError(f"step-level variant gave {len(summed)} scores for {len(uniq)} steps")
    return out.with_columns(score_summed=pl.Series(summed))


def dependencies(module: str) -> list[Path]:
    """An estimator module, this module (which runs it), and every project module either imports,
    transitively."""
    return dependency_files([module_name(module_path(module)), module_name(Path(__file__))])


def source_digest(module: str) -> str:
    """A digest of the code a score job of `module` runs (see `dependencies`), independent of where the
    checkout lies: editing any of it reruns the jobs of the instances of that module, and nothing else."""
    return code_digest(dependencies(module))


def config_problems(cfg) -> list[str]:
    """Every estimator exists and gets only keyword arguments its score function takes (a config rule)."""
    return [problem for name, params in cfg.estimators.items() for problem in check_params(name, params)]
