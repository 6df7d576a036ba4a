"""The harness's trak and tracincp against dattri's TRAK and TracIn on the same inputs: the same features (the
rollouts' sketches, or their post-clip rows), the same targets and the same damping.

dattri takes a model and a loss, not features, so the features enter through a model with one weight vector w
and the loss <w, phi>: its gradient is exactly phi, at every checkpoint. dattri's TRAK divides every gradient by
sqrt(P) before projecting (P = k here), so the harness's ridge lambda is given to it as lambda / k; with the
probability of the correct answer set to 0, TRAK's Q is 1, as in the harness.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from dattri.algorithm.tracin import TracInAttributor
from dattri.algorithm.trak import TRAKAttributor
from dattri.task import AttributionTask
from torch.utils.data import DataLoader, TensorDataset

from behaviortrace.estimators import tracincp, trak
from behaviortrace.score.view import SeedView, Target

N, DIM, STEPS = 24, 10, 3
IDENTITY = {"proj_type": "identity", "proj_dim": DIM, "proj_seed": 0}  # a full dict: dattri mutates its default


class Features(torch.nn.Module):
    """A model whose per-example loss gradient is the example's feature vector."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(DIM, dtype=torch.float64))


def _loss(params, data):
    phi, _ = data
    return params["w"] @ phi


def _probability(params, data):  # TRAK's Q = 1 - p: p = 0 gives the harness's unweighted TRAK
    return torch.zeros((), dtype=torch.float64)


def _loader(rows: np.ndarray) -> DataLoader:
    phi = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float64))
    return DataLoader(TensorDataset(phi, torch.zeros(len(phi), dtype=torch.float64)), batch_size=7, shuffle=False)


@pytest.fixture(scope="module")
def problem():
    """A seed of 24 rollouts in 3 steps (one clipped), with two target vectors and rollouts split between them."""
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(N, DIM))
    rollouts = pl.DataFrame(
        {
            "rollout_id": np.arange(N),
            "step": np.repeat(np.arange(STEPS), N // STEPS),
            "group_id": np.repeat(np.arange(STEPS), N // STEPS),
            "lr": np.repeat([1e-3, 8e-4, 6e-4], N // STEPS),
            "checkpoint_step": np.repeat(np.arange(STEPS), N // STEPS),
        }
    )
    steps = pl.DataFrame(
        {"step": np.arange(STEPS), "lr": [1e-3, 8e-4, 6e-4], "clip_coef": [1.0, 0.4, 1.0], "grad_norm": [1.0] * 3}
    )
    view = SeedView.from_arrays(rollouts, {"sketch": phi, "norm": np.linalg.norm(phi, axis=1)}, steps)
    vectors = rng.normal(size=(2, DIM))
    target = Target("in_context", 0, np.array([0, 1]), vectors, np.linalg.norm(vectors, axis=1), np.array([4, 4]))
    idx, has = target.for_rows(view)
    assert has.all() and set(idx) == {0, 1}
    return view, target, idx


def _dattri_trak(features: np.ndarray, targets: np.ndarray, lam: float) -> np.ndarray:
    """[n, targets] TRAK scores by dattri, at ridge `lam` on the unscaled features."""
    model = Features()
    task = AttributionTask(loss_func=_loss, model=model, checkpoints=model.state_dict())
    attributor = TRAKAttributor(
        task=task,
        correct_probability_func=_probability,
        device="cpu",
        projector_kwargs=dict(IDENTITY),
        regularization=lam / DIM,
    )
    attributor.cache(_loader(features))
    return attributor.attribute(_loader(targets)).numpy()


@pytest.mark.parametrize("use_clip", [False, True])
@pytest.mark.parametrize("form", ["primal", "dual"])
def test_trak_is_dattris_trak_on_the_same_features_and_damping(problem, form, use_clip):
    view, target, idx = problem
    features = trak.features(view, use_clip)
    lam = trak.ridge((features**2).sum(0), 0.1)
    ours = trak.score(view, target, lambda_scale=0.1, form=form, use_clip=use_clip)
    theirs = _dattri_trak(features, target.vectors, lam)[np.arange(N), idx]
    # The harness reports minus the value (positive: the rollout's update raised the target).
    np.testing.assert_allclose(ours, -theirs, rtol=1e-10, atol=1e-12 * np.abs(theirs).max())
    assert np.abs(theirs).max() > 1e-3  # not a comparison of zeros
    # The damping is the definition's: another ridge gives other scores.
    other = _dattri_trak(features, target.vectors, 10 * lam)[np.arange(N), idx]
    assert np.abs(other - theirs).max() > 1e-3 * np.abs(theirs).max()


def _dattri_tracin(features: np.ndarray, targets: np.ndarray, weights: list[float]) -> np.ndarray:
    """[n, targets] TracIn scores by dattri: sum over checkpoints of weight x <g(train), g(test)>."""
    model = Features()
    task = AttributionTask(loss_func=_loss, model=model, checkpoints=[model.state_dict()] * len(weights))
    attributor = TracInAttributor(
        task=task,
        weight_list=torch.tensor(weights, dtype=torch.float64),
        normalized_grad=False,
        device="cpu",
        projector_kwargs=dict(IDENTITY),
    )
    return attributor.attribute(_loader(features), _loader(targets)).numpy()


@pytest.mark.parametrize("use_clip", [False, True])
def test_tracincp_is_dattris_tracin_at_the_checkpoint_that_generated_each_rollout(problem, use_clip):
    """tracincp scores each rollout at its own step, with that step's learning rate (times its clip coefficient
    with `use_clip`). dattri's TracIn on the step's rollouts, with that one checkpoint and weight, is the same
    value. Over all checkpoints at once dattri scores every rollout at every checkpoint: the sum differs from the
    harness's by exactly the other steps' terms, a difference of definition."""
    view, target, idx = problem
    ours = tracincp.score(view, target, use_clip=use_clip)
    steps = view.rollouts["step"].to_numpy()
    coef = view.steps.sort("step")["clip_coef"].to_numpy() if use_clip else np.ones(STEPS)
    rates = view.steps.sort("step")["lr"].to_numpy() * coef
    per_step = np.empty(N)
    for s in range(STEPS):
        rows = steps == s
        scores = _dattri_tracin(view.sketches[rows], target.vectors, [rates[s]])
        per_step[rows] = scores[np.arange(rows.sum()), idx[rows]]
    # dattri's TracIn keeps its scores in a float32 tensor (torch.zeros at the default dtype): 2.6e-8 of the
    # largest score was measured here, so the comparison allows float32's rounding of each value and no more.
    scale = np.abs(per_step).max()
    np.testing.assert_allclose(ours, -per_step, rtol=2e-7, atol=2e-7 * scale)
    assert scale > 1e-4
    every = _dattri_tracin(view.sketches, target.vectors, list(rates))[np.arange(N), idx]
    inner = np.einsum("nk,nk->n", view.sketches, target.vectors[idx])
    np.testing.assert_allclose(every - per_step, (rates.sum() - rates[steps]) * inner, rtol=0, atol=1e-6 * scale)
