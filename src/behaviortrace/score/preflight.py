"""Before a model trains: can every configured estimator that needs the model score rollouts on it?

Those estimators (ekfac, trackstar, dattri_trak, any later one with NEEDS_MODEL) run their libraries on the
checkpoints after training. A model a library cannot handle (a layer class it looks up by exact type, hooks whose
output the model then modifies in place, a layer that sees tokens flattened across the batch) would fail, or
mis-read gradients, only then. So each configured instance runs its own score function first, on the base model,
a handful of synthetic rollouts of unequal length and a synthetic target (`ProbeRun`, `probe_target`), with its
configured settings (less what its module's PREFLIGHT_SETTINGS shrinks for so few rollouts). The layers that
hook-based libraries read (`ModelRun.linear_modules`) are checked on the way: each must compute its weight's
matrix product and see [rollouts, tokens, features] inputs. An instance that fails, or scores every rollout 0, is
a problem naming it, its library, and the layer or operation that failed.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from behaviortrace.common.errors import describe
from behaviortrace.score import contract
from behaviortrace.score.model_run import ModelRun, ModelTarget, linear_modules, with_step_shapes

# Two steps of four rollouts of unequal prompt and completion lengths (both paddings occur), all nonzero advantages.
SHAPES = [(3, 4), (5, 2), (4, 5), (6, 3), (2, 3), (4, 4), (5, 5), (3, 2)]
ADVANTAGES = [1.0, -0.6, 0.9, -1.3, 0.4, -0.8, 1.1, -0.5]


class LayerProblem(ValueError):
    """A layer a hook-based library would read breaks what the library assumes of it."""


def _draw(vocab: int, pad_id: int | None, seed: int):
    """Token ids drawn from the whole vocabulary but the pad id, from a local generator (global state left alone)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        token = int(torch.randint(vocab, (), generator=gen))
        if token != pad_id:
            yield token


def synthetic_log(vocab: int, pad_id: int | None) -> pl.DataFrame:
    """A rollout log (score/model_run.py LOG_COLUMNS, with step shapes) of SHAPES, all at checkpoint 0."""
    ids = _draw(vocab, pad_id, 0)
    rows = [
        {
            "rollout_id": i,
            "step": i // 4,
            "group_id": i // 2,
            "advantage": ADVANTAGES[i],
            "lr": 1e-5,
            "checkpoint_step": 0,
            "prompt_ids": [next(ids) for _ in range(p)],
            "completion_ids": [next(ids) for _ in range(c)],
        }
        for i, (p, c) in enumerate(SHAPES)
    ]
    return with_step_shapes(pl.DataFrame(rows))


def probe_target(vocab: int, pad_id: int | None, temperature: float, device: dict) -> ModelTarget:
    """Three items: prompts of unequal length, each with a three-token 'marker' whose log-probs are f."""
    ids = _draw(vocab, pad_id, 1)
    marker = [next(ids) for _ in range(3)]
    items = [([next(ids) for _ in range(n)], marker, [0, 1, 2]) for n in (3, 5, 4)]
    return ModelTarget("forced", 0, np.array([0]), {0: items}, temperature, 2, device)


class ProbeRun(ModelRun):
    """A ModelRun of `synthetic_log` on an in-memory model, as of checkpoint 0: each `load` hands out a fresh copy
    (a library may wrap its layers), AdamW's divisors are synthetic, the KL term's reference is the model itself,
    and `linear_modules` checks the layers it names (`layer_problems`)."""

    def __init__(self, model, tokenizer, grpo, device: dict, scratch: Path):
        self.grpo, self.device, self.scratch = grpo, device, Path(scratch)
        self.checkpoints, self.second_moments, self.base_model = {0: None}, {0: None}, None
        self.pad_id = tokenizer.pad_token_id
        self.rollouts = synthetic_log(model.get_input_embeddings().num_embeddings, self.pad_id)
        self._model, self._tokenizer = model, tokenizer
        self._ref = copy.deepcopy(model).eval() if grpo.beta else None

    def load(self, step: int):
        return copy.deepcopy(self._model).eval(), self._tokenizer

    def adam_denominator(self, step: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(2)
        trainable = [(n, p) for n, p in self._model.named_parameters() if p.requires_grad]
        return {n: torch.rand(p.shape, generator=gen) * 1e-3 + 1e-4 for n, p in trainable}

    def linear_modules(self, model) -> list[str]:
        names = linear_modules(model)
        problems = layer_problems(model, names, self.batch(self.rows()))
        if problems:
            raise LayerProblem(problems[0] + (f" (and {len(problems) - 1} more layers)" if len(problems) > 1 else ""))
        return names


def layer_problems(model, names: list[str], batch: dict) -> list[str]:
    """What hook-based libraries would get wrong on the layers `names`: a layer whose forward is not its weight's
    matrix product (x W^T + b; x W + b for Conv1D), or one whose input is not [rollouts, tokens, features] on a
    forward pass of `batch` (they take each rollout's gradient from the rows of a layer's input)."""
    from transformers.pytorch_utils import Conv1D

    modules = {name: model.get_submodule(name) for name in names}
    problems, gen = [], torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, m in modules.items():
            conv = isinstance(m, Conv1D)
            x = torch.randn(2, 3, m.weight.shape[0 if conv else 1], generator=gen).to(m.weight)
            want = (x @ m.weight if conv else F.linear(x, m.weight)) + (0 if m.bias is None else m.bias)
            got = m(x)
            scale = float(want.abs().max())
            if not (
                isinstance(got, torch.Tensor)
                and got.shape == want.shape
                and torch.allclose(got, want, 1e-4, 1e-5 * scale)
            ):
                product = "x W + b" if conv else "x W^T + b"
                problems.append(
                    f"{name} ({type(m).__name__}): its forward is not its weight's matrix product {product}"
                )
    seen: dict[str, tuple] = {}

    def record(name):
        def hook(module, args, output):  # returns None: the output stays the layer's own
            if args and name not in seen:
                seen[name] = tuple(args[0].shape)

        return hook

    hooks = [m.register_forward_hook(record(name)) for name, m in modules.items()]
    device = next(model.parameters()).device
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1).to(device)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1).to(device)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    for name, shape in seen.items():
        if shape[:2] != tuple(ids.shape):
            problems.append(
                f"{name} ({type(modules[name]).__name__}) receives its input as {list(shape)}, not [rollouts, tokens, "
                f"features] = [{ids.shape[0]}, {ids.shape[1]}, ...]: hook-based libraries take each rollout's "
                "gradient from the rows of a layer's input"
            )
    return problems


def estimator_problem(name: str, entry: dict, run: ProbeRun, target: ModelTarget) -> str | None:
    """Why instance `name` (its config entry) cannot score `run`'s rollouts, or None when it can."""
    module = contract.Instance.of(name, entry).module
    settings = {**(entry or {}), **getattr(module, "PREFLIGHT_SETTINGS", {})}
    try:
        scores, _ = contract.run(name, settings, run, target)
    except Exception as err:  # whatever the library raises: the message says what and where
        return describe(err) if not isinstance(err, LayerProblem) else str(err)
    if not np.any(scores["score"].to_numpy() != 0):
        return "it scores every synthetic rollout 0 (nonzero advantages): it reads no gradient of this model"
    return None
