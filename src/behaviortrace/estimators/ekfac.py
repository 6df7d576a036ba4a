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

import numpy as np

USES_TARGET = True
NEEDS_MODEL = True
STEP_AGGREGATE = "sum"
REQUIRES = ("kronfluence",)
STRATEGIES = ("ekfac", "kfac", "diagonal", "identity")

log = logging.getLogger(__name__)


def check(strategy: str = "ekfac", damping: float | None = None, batch_size: int = 64) -> list[str]:
    """Problems with the settings, each naming its key (checked when the workflow starts)."""
    problems = [] if strategy in STRATEGIES else [f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}"]
    if damping is not None and not damping > 0:
        problems.append(f"damping {damping!r} must be positive, or null for kronfluence's heuristic")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        problems.append(f"batch_size {batch_size!r} must be a positive integer")
    return problems


def score(run, target, strategy: str = "ekfac", damping: float | None = None, batch_size: int = 64):
    """`damping` None is kronfluence's heuristic: 0.1 x the mean eigenvalue of each layer's factors."""
    if check(strategy, damping, batch_size):
        raise ValueError("; ".join(check(strategy, damping, batch_size)))
    checkpoint = run.rollouts["checkpoint_step"].to_numpy()
    used = run.rollouts["advantage"].to_numpy() != 0 if not run.grpo.beta else np.ones(len(checkpoint), bool)
    lr = run.rollouts["lr"].to_numpy()
    out = np.zeros(len(checkpoint))
    for c in np.unique(checkpoint):
        rows = (checkpoint == c) & used
        at = target.step_for(int(c))
        if not rows.any() or not target.items[at]:
            continue  # no rollout to score, or no target there (an in-context target no sample showed): 0
        model, tokenizer = run.load(int(c))
        values = influence(
            run, target, model, tokenizer.pad_token_id, run.rows(rows), at, strategy, damping, batch_size
        )
        out[rows] = -lr[rows] * values
        log.info("ekfac: checkpoint %d, %d rollouts scored against the target at %d", c, rows.sum(), at)
    return out


def influence(run, target, model, pad_id, rows, at, strategy, damping, batch_size) -> np.ndarray:
    """[rows] g_f^T (F + damping)^-1 g_z at `model`'s weights, F fitted on `rows` themselves."""
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.utils.dataset import DataLoaderKwargs

    task = _task(run, target, model)
    _register(model, task.get_influence_tracked_modules())
    model = prepare_model(model, task)
    queries = target.items[at]
    with tempfile.TemporaryDirectory(dir=run.scratch) as folder:
        level = logging.getLogger().level
        analyzer = Analyzer(
            "ekfac",
            model,
            task,
            cpu=run.device["device"] == "cpu",
            log_level=logging.WARNING,
            disable_tqdm=True,
            output_dir=folder,
        )
        logging.getLogger().setLevel(level)  # kronfluence sets the root logger's level to its own
        analyzer.set_dataloader_kwargs(DataLoaderKwargs(collate_fn=_Collate(run, target, pad_id)))
        analyzer.fit_all_factors(
            "factors",
            rows,
            per_device_batch_size=batch_size,
            factor_args=FactorArguments(strategy=strategy, use_empirical_fisher=True),
            overwrite_output_dir=True,
        )
        analyzer.compute_pairwise_scores(
            "scores",
            "factors",
            query_dataset=queries,
            train_dataset=rows,
            per_device_query_batch_size=target.chunk,
            per_device_train_batch_size=batch_size,
            score_args=ScoreArguments(damping_factor=damping, compute_per_module_scores=True),
            overwrite_output_dir=True,
        )
        per_module = analyzer.load_pairwise_scores("scores")  # module -> [items, rows]
    # f is the mean over items of each item's marker log-prob: its influence is the mean of theirs.
    return _sum_modules({name: v.double().mean(0).numpy() for name, v in per_module.items()})


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
