"""Influence functions with EK-FAC (or K-FAC, a diagonal or no preconditioner), by kronfluence: an estimator that
needs the model (score/model_run.py), from the `peers` extra.

At each checkpoint c, kronfluence fits its factors on the rollouts that c generated (each rollout's loss: its share
of the step's GRPO loss with its logged advantage, so the Fisher is the empirical one of the objective training
optimized) and scores each of them against the target's gradient at the analysis checkpoint at or before c:
g_f^T (F_c + damping)^-1 g_z. An update along the preconditioned rollout gradient moves f by minus that times the
learning rate, so the score is -lr x the value, in tracincp's units. kronfluence tracks the linear layers only
(score/model_run.py `linear_modules`: not the embedding, the norms, or an output layer tied to the embedding);
rollouts with advantage 0 and no KL term have a zero loss gradient and score 0.

kronfluence wraps a layer by its exact class (`TrackedModule.SUPPORTED_MODULES`, nn.Linear and nn.Conv2d): a
subclass of nn.Linear (Falcon's FalconLinear) or transformers' Conv1D (GPT-2) gets a `TrackedLinear` subclass
registered for its class through kronfluence's own registration (`module_type=`); the estimator preflight
(score/preflight.py) checks that such a layer computes its matrix product.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

USES_TARGET = True
NEEDS_MODEL = True
STEP_AGGREGATE = "sum"
REQUIRES = ("kronfluence",)
STRATEGIES = ("ekfac", "kfac", "diagonal", "identity")
# kronfluence's analysis and factors names: its files go to <folder>/ekfac/factors_factors.
NAME, FACTORS = "ekfac", "factors"

log = logging.getLogger(__name__)


def check(strategy: str = "ekfac", damping: float | None = None, batch_size: int = 64) -> list[str]:
    """Problems with the settings, each naming its key (checked when the workflow starts)."""
    problems = [] if strategy in STRATEGIES else [f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}"]
    if damping is not None and not damping > 0:
        problems.append(f"damping {damping!r} must be positive, or null for kronfluence's heuristic")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        problems.append(f"batch_size {batch_size!r} must be a positive integer")
    return problems


def prepare(run, folder, strategy: str = "ekfac", damping: float | None = None, batch_size: int = 64) -> None:
    """Fit the factors at each checkpoint on the rollouts it scores, into `folder` (one subfolder per checkpoint, in
    kronfluence's own layout): they depend on the seed's checkpoints and rollouts only, so every draw and target
    kind of the seed scores against the same fit."""
    from kronfluence.analyzer import prepare_model
    from kronfluence.arguments import FactorArguments
    from kronfluence.utils.dataset import DataLoaderKwargs

    if check(strategy, damping, batch_size):
        raise ValueError("; ".join(check(strategy, damping, batch_size)))
    for c, rows in run.checkpoint_rows():
        model, tokenizer = run.load(c)
        task = _task(run, None, model)
        _register(model, task.get_influence_tracked_modules())
        model = prepare_model(model, task)
        analyzer = _analyzer(run, model, task, Path(folder) / f"checkpoint-{c}")
        analyzer.set_dataloader_kwargs(DataLoaderKwargs(collate_fn=_Collate(run, None, tokenizer.pad_token_id)))
        analyzer.fit_all_factors(
            FACTORS,
            run.rows(rows),
            per_device_batch_size=batch_size,
            factor_args=FactorArguments(strategy=strategy, use_empirical_fisher=True),
            overwrite_output_dir=True,
        )
        log.info("ekfac: checkpoint %d, factors fitted on %d rollouts", c, rows.sum())


def score(run, target, strategy: str = "ekfac", damping: float | None = None, batch_size: int = 64, prepared=None):
    """`damping` None is kronfluence's heuristic: 0.1 x the mean eigenvalue of each layer's factors. `prepared`: the
    folder `prepare` fitted the factors into."""
    if check(strategy, damping, batch_size):
        raise ValueError("; ".join(check(strategy, damping, batch_size)))
    lr = run.rollouts["lr"].to_numpy()

    def values(c, rows, at):
        model, tokenizer = run.load(c)
        factors = Path(prepared) / f"checkpoint-{c}"
        pad_id = tokenizer.pad_token_id
        return lr[rows] * influence(run, target, model, pad_id, run.rows(rows), at, factors, damping, batch_size)

    return run.score_per_checkpoint(target, "ekfac", values)


def influence(run, target, model, pad_id, rows, at, factors, damping, batch_size) -> np.ndarray:
    """[rows] g_f^T (F + damping)^-1 g_z at `model`'s weights, F the factors fitted on `rows` (in `factors`)."""
    from kronfluence.analyzer import prepare_model
    from kronfluence.arguments import ScoreArguments
    from kronfluence.utils.dataset import DataLoaderKwargs

    task = _task(run, target, model)
    _register(model, task.get_influence_tracked_modules())
    model = prepare_model(model, task)
    with tempfile.TemporaryDirectory(dir=run.scratch) as folder:
        # kronfluence reads the factors from its output folder: link the fitted ones in, and write the scores beside.
        (Path(folder) / NAME).mkdir()
        fitted = f"factors_{FACTORS}"
        (Path(folder) / NAME / fitted).symlink_to((factors / NAME / fitted).resolve(), target_is_directory=True)
        analyzer = _analyzer(run, model, task, Path(folder))
        analyzer.set_dataloader_kwargs(DataLoaderKwargs(collate_fn=_Collate(run, target, pad_id)))
        analyzer.compute_pairwise_scores(
            "scores",
            FACTORS,
            query_dataset=target.items[at],
            train_dataset=rows,
            per_device_query_batch_size=target.chunk,
            per_device_train_batch_size=batch_size,
            score_args=ScoreArguments(damping_factor=damping, compute_per_module_scores=True),
            overwrite_output_dir=True,
        )
        per_module = analyzer.load_pairwise_scores("scores")  # module -> [items, rows]
    # f is the mean over items of each item's marker log-prob: its influence is the mean of theirs.
    return _sum_modules({name: v.double().mean(0).numpy() for name, v in per_module.items()})


def _analyzer(run, model, task, folder: Path):
    """kronfluence's Analyzer writing into `folder`, quiet, on the run's device."""
    from kronfluence.analyzer import Analyzer

    level = logging.getLogger().level
    analyzer = Analyzer(
        NAME,
        model,
        task,
        cpu=run.device["device"] == "cpu",
        log_level=logging.WARNING,
        disable_tqdm=True,
        output_dir=str(folder),
    )
    logging.getLogger().setLevel(level)  # kronfluence sets the root logger's level to its own
    return analyzer


def _sum_modules(per_module: dict[str, np.ndarray]) -> np.ndarray:
    """The layers' scores summed. A layer whose every score is non-finite had a zero Fisher (a LoRA B matrix at
    zero leaves its A matrix no gradient), where kronfluence's heuristic damping, 0.1 x the mean eigenvalue, is 0
    and 0/0 results: its gradients are zero, so it adds exactly 0. Anything else non-finite is an error."""
    total, empty = 0.0, []
    for name, values in per_module.items():
        finite = np.isfinite(values)
        if finite.all():
            total = total + values
        elif not finite.any():
            empty.append(name)
        else:
            raise FloatingPointError(f"ekfac: layer {name} gave {int((~finite).sum())} non-finite scores")
    if empty:
        log.warning("ekfac: %d layers without gradient at this checkpoint add 0: %s", len(empty), ", ".join(empty))
    return np.broadcast_to(np.asarray(total, dtype=float), next(iter(per_module.values())).shape).copy()


def _register(model, names: list[str]) -> None:
    """A TrackedLinear subclass for each tracked layer class kronfluence does not know by its exact class."""
    import types

    from kronfluence.module.linear import TrackedLinear
    from kronfluence.module.tracked_module import TrackedModule
    from transformers.pytorch_utils import Conv1D

    # Conv1D stores its weight [in, out]; kronfluence reads only its input and output sizes from the layer.
    conv1d = {
        "in_features": property(lambda self: self.original_module.nx),
        "out_features": property(lambda self: self.original_module.nf),
    }
    for cls in {type(model.get_submodule(name)) for name in names} - set(TrackedModule.SUPPORTED_MODULES):
        body = conv1d if issubclass(cls, Conv1D) else {}
        types.new_class(
            f"Tracked{cls.__name__}", (TrackedLinear,), {"module_type": cls}, lambda ns, b=body: ns.update(b)
        )


def _task(run, target, model):
    import torch
    from kronfluence.task import Task

    tracked = run.linear_modules(model)

    class RolloutTask(Task):
        def compute_train_loss(self, batch, model, sample=False):
            return run.losses(model, batch).sum()

        def compute_measurement(self, batch, model):
            return target.value_sum(model, batch)

        def get_influence_tracked_modules(self):
            return tracked

        def get_attention_mask(self, batch):
            return torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)

    return RolloutTask()


class _Collate:
    """Batches for both of kronfluence's loaders: target items (tuples) as the targets job batched them, rollouts
    (dicts) in their steps' layout."""

    def __init__(self, run, target, pad_id):
        self.run, self.target, self.pad_id = run, target, pad_id

    def __call__(self, part):
        if isinstance(part[0], tuple):
            return self.target.batch(part, self.pad_id)
        return self.run.batch(part)
