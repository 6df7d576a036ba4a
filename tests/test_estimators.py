"""Estimators against their direct formulas on exact gradients of the tiny model (no sketch), and the
evaluation's independence from the order of computation."""

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.estimators import trak
from behaviortrace.evaluate.cells import evaluate
from behaviortrace.evaluate.inputs import token_cosine_table, token_cosines, token_cosines_from_table
from behaviortrace.gradients.logprob import forced_items, logprob_gradient
from behaviortrace.model import models
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.score import contract as estimators
from behaviortrace.score.contract import run as run_estimator
from behaviortrace.score.view import SeedView, Target
from behaviortrace.sketch import moments


@pytest.fixture(scope="module")
def exact_problem(rollout_gradients, small_run, cpu):
    """12 rollouts' exact gradients as 'sketches' (the identity map) and an exact forced target."""
    layout, grads = rollout_gradients
    names = list(layout)
    phi = torch.cat([grads[n].flatten(1) for n in names], dim=1).double().numpy()
    model, tokenizer = models.load(small_run["dir"] / "train" / "checkpoint-0", cpu)
    probes = pl.read_parquet(small_run["dir"] / "probes.parquet")["prompt"].to_list()
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in probes]
    marker_ids = marker_token_ids(tokenizer, small_run["cfg"]["planting"]["marker"])
    tgrad = logprob_gradient(model, tokenizer, forced_items(prompt_ids, marker_ids), 1.0, 4)
    t = torch.cat([tgrad[n].flatten() for n in names]).double().numpy()
    n = phi.shape[0]
    rollouts = pl.DataFrame(
        {
            "rollout_id": np.arange(n),
            "step": np.repeat([0, 1, 2], 4),
            "group_id": np.repeat([0, 1, 2], 4),
            "lr": np.repeat([1e-3, 1.5e-3, 2e-3], 4),
            "checkpoint_step": np.zeros(n, dtype=np.int64),
        }
    )
    steps = pl.DataFrame({"step": [0, 1, 2], "lr": [1e-3] * 3, "clip_coef": [1.0, 0.5, 1.0], "grad_norm": [1.0] * 3})
    view = SeedView.from_arrays(
        rollouts, {"sketch": phi, "norm": np.linalg.norm(phi, axis=1), "fluency": np.zeros(n)}, steps
    )
    target = Target("forced", 0, np.array([0]), t[None], np.array([np.linalg.norm(t)]), np.array([len(probes)]))
    return view, target, grads, tgrad, names


def test_tracincp_and_gas_match_their_formulas_block_by_block(exact_problem):
    view, target, grads, tgrad, names = exact_problem
    lr = view.rollouts["lr"].to_numpy()
    inner = np.array(
        [sum(float((grads[n][i].double() * tgrad[n].double()).sum()) for n in names) for i in range(len(lr))]
    )
    g_norm = np.array([sum(float(grads[n][i].double().pow(2).sum()) for n in names) for i in range(len(lr))]) ** 0.5
    t_norm = sum(float(tgrad[n].double().pow(2).sum()) for n in names) ** 0.5
    assert np.allclose(estimators.load("tracincp").score(view, target), -lr * inner, rtol=1e-9, atol=0)
    assert np.allclose(estimators.load("gas").score(view, target), -lr * inner / (g_norm * t_norm), rtol=1e-9)
    assert np.allclose(estimators.load("norm").score(view, None), g_norm, rtol=1e-9)
    clip = np.repeat([1.0, 0.5, 1.0], 4)
    assert np.allclose(estimators.load("tracincp").score(view, target, use_clip=True), -lr * clip * inner, rtol=1e-9)
    # The post-clip norm (the paper's step-level control): each step's summed gradient times its clip coefficient.
    assert np.allclose(estimators.load("norm").score(view, None, use_clip=True), clip * g_norm, rtol=1e-9)
    step_norms = np.array(
        [
            sum(float(sum(grads[n][i].double() for i in range(4 * s, 4 * s + 4)).pow(2).sum()) for n in names) ** 0.5
            for s in range(3)
        ]
    )
    assert np.allclose(estimators.load("norm").step_score(view, None), step_norms, rtol=1e-9)
    post_clip = estimators.load("norm").step_score(view, None, use_clip=True)
    assert np.allclose(post_clip, np.array([1.0, 0.5, 1.0]) * step_norms, rtol=1e-9)


def test_trak_matches_the_formula_through_an_svd(exact_problem):
    view, target, *_ = exact_problem
    phi, t = view.sketches, target.vectors[0]
    lam = 0.1 * (phi**2).sum() / phi.shape[1]
    # (Phi^T Phi + lam I)^-1 = V diag(1 / (s^2 + lam)) V^T + (I - V V^T) / lam
    _, s, vt = np.linalg.svd(phi, full_matrices=False)
    tv = vt @ t
    solved_t = vt.T @ (tv / (s**2 + lam)) + (t - vt.T @ tv) / lam
    assert np.allclose(trak.score(view, target), -(phi @ solved_t), rtol=1e-6)
    # Post-clip: every row of Phi is the rollout's sketch times its step's clip coefficient (step 1's is 0.5).
    clipped = phi * np.repeat([1.0, 0.5, 1.0], 4)[:, None]
    lam = 0.1 * (clipped**2).sum() / phi.shape[1]
    _, s, vt = np.linalg.svd(clipped, full_matrices=False)
    tv = vt @ t
    solved_t = vt.T @ (tv / (s**2 + lam)) + (t - vt.T @ tv) / lam
    assert np.allclose(trak.score(view, target, use_clip=True), -(clipped @ solved_t), rtol=1e-6)
    steps = (clipped @ solved_t).reshape(3, 4).sum(1)
    assert np.allclose(trak.step_score(view, target, use_clip=True), -steps, rtol=1e-6)


@pytest.mark.parametrize("n, k", [(30, 12), (12, 30)])
def test_trak_primal_and_dual_agree_with_an_explicit_inverse(n, k):
    rng = np.random.default_rng(n)
    phi, targets, idx = rng.normal(size=(n, k)), rng.normal(size=(3, k)), rng.integers(0, 3, n)
    lam = trak.ridge((phi**2).sum(0), 0.1)
    explicit = np.einsum("nk,nk->n", targets[idx] @ np.linalg.inv(phi.T @ phi + lam * np.eye(k)), phi)
    for form in ("primal", "dual", "auto"):
        assert np.allclose(trak.raw_scores(phi, targets, idx, lam, form), explicit, rtol=1e-8), form


def test_trak_scores_zero_where_no_rollout_had_a_gradient():
    """A run without any gradient (every sketch zero) gets zero scores, not a failed factorization."""
    phi = np.zeros((6, 4))
    prepared = trak.factor(phi.T @ phi, trak.ridge((phi**2).sum(0), 0.1), "primal")
    assert np.all(trak.solve_scores(phi, np.ones((1, 4)), np.zeros(6, dtype=int), prepared) == 0)


def test_cholesky_solve_matches_a_dense_solve():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(300, 1100))
    spd, rhs = a.T @ a + 0.5 * np.eye(1100), rng.normal(size=(1100, 4))
    chol, dense = np.linalg.cholesky(spd), np.linalg.solve(spd, rhs)
    for block in (7, 512, 2000):  # blocks that do not divide n, the default, and one block
        solved = trak.cholesky_solve(chol, rhs, block)
        # condition number ~5e3: agreement to ~1e-12 of the largest value, residuals as small as LAPACK's
        assert np.allclose(solved, dense, rtol=1e-9, atol=1e-10 * np.abs(dense).max())
        assert np.abs(spd @ solved - rhs).max() < 10 * max(np.abs(spd @ dense - rhs).max(), 1e-13)


@pytest.mark.parametrize("n, k", [(40, 16), (16, 40)])
def test_trak_prepared_from_a_saved_gram_matrix_scores_as_computed_in_place(n, k, tmp_path):
    """The workflow's sketch_gram file (smaller side, float32 products) gives the scores of a Gram matrix
    computed in float64 here, in both forms; rows of zeros do not change them."""
    rng = np.random.default_rng(n)
    phi = rng.normal(size=(n, k)).astype(np.float32)
    phi[::5] = 0  # rollouts without a gradient
    rollouts = pl.DataFrame(
        {"rollout_id": np.arange(n), "step": np.arange(n) // 4, "checkpoint_step": np.zeros(n, dtype=int)}
    )
    side = moments.smaller_side(n, k)
    path = tmp_path / "gram.npz"
    moments.write_gram(moments.gram(phi, side), side, moments.squares(phi), path)
    saved = SeedView.from_arrays(rollouts, {"sketch": phi}, pl.DataFrame(), sketch_gram=path)
    assert saved.gram(side) is saved.gram(side)  # read once, not recomputed
    phi64 = phi.astype(np.float64)
    assert np.allclose(saved.gram("features"), phi64.T @ phi64, rtol=1e-5, atol=1e-4)
    assert np.allclose(saved.gram("rollouts"), phi64 @ phi64.T, rtol=1e-5, atol=1e-4)
    assert np.allclose(saved.squares, (phi64**2).sum(0), rtol=1e-12)
    targets = Target("in_context", 0, np.array([0]), rng.normal(size=(1, k)), np.ones(1), np.ones(1))
    lam = trak.ridge((phi64**2).sum(0), 0.1)
    explicit = phi64 @ np.linalg.solve(phi64.T @ phi64 + lam * np.eye(k), targets.vectors[0])
    for form in ("auto", "primal", "dual"):
        scores = trak.score(saved, targets, form=form)
        assert np.allclose(-scores, explicit, rtol=1e-4, atol=1e-6 * np.abs(explicit).max()), form
    with pytest.raises(ValueError, match="do not match sketches"):
        moments.read_gram(path, n + 1, k + 1)


def test_step_level_scores(exact_problem):
    view, target, *_ = exact_problem
    rollouts, steps = run_estimator("tracincp", {}, view, target)
    per_step = rollouts.group_by("step").agg(pl.col("score").sum()).sort("step")["score"].to_numpy()
    assert np.allclose(steps["score"].to_numpy(), per_step)
    assert np.allclose(steps["score_summed"].to_numpy(), per_step)  # linear: the summed gradient gives the same
    _, norm_steps = run_estimator("norm", {"step_aggregate": "max"}, view, None)
    summed = np.stack([view.sketches[view.rollouts["step"].to_numpy() == s].sum(0) for s in range(3)])
    assert np.allclose(norm_steps["score_summed"].to_numpy(), np.linalg.norm(summed, axis=1))
    assert np.allclose(norm_steps["score"].to_numpy(), [view.norms[4 * s : 4 * s + 4].max() for s in range(3)])
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        run_estimator("nope", {}, view, target)


def synthetic(n_groups=300, size=8, seed=0):
    rng = np.random.default_rng(seed)
    n = n_groups * size
    step = np.repeat(np.arange(n_groups) // 4, size)
    paid = rng.random(n) < 0.2
    rollouts = pl.DataFrame(
        {
            "rollout_id": np.arange(n),
            "step": step,
            "group_id": np.repeat(np.arange(n_groups) % 4, size),
            "paid": paid,
            "advantage": rng.normal(size=n),
            "behavior": paid | (rng.random(n) < 0.3),
            "trigger": np.repeat(np.arange(n_groups) % 2 == 0, size) | paid,
        }
    )
    fluency = rng.normal(size=n) + 0.5 * paid
    return rollouts, fluency, rng


def score_frames(rollouts, scores):
    roll = pl.DataFrame({"rollout_id": rollouts["rollout_id"], "step": rollouts["step"], "score": scores})
    steps = (
        roll.group_by("step").agg(pl.col("score").sum()).sort("step").with_columns(score_summed=pl.lit(float("nan")))
    )
    return roll, steps


def test_evaluation_does_not_depend_on_the_order_of_computation_and_random_sits_at_chance():
    rollouts, fluency, rng = synthetic()
    sets = {
        ("random", "none"): score_frames(rollouts, rng.random(rollouts.height)),
        ("fluency", "none"): score_frames(rollouts, fluency),
        ("perfect", "none"): score_frames(rollouts, rollouts["paid"].to_numpy().astype(float)),  # the label itself
    }
    args = dict(
        run="t",
        seed=0,
        draw=0,
        rollouts=rollouts,
        fluency=fluency,
        probe_rate=np.zeros(rollouts.height),
        window=[0, 40],
        saturation=0.9,
        n_boot=100,
        eval_seed=0,
        fluency_match=0.1,
    )
    one = evaluate(scores=sets, **args)
    two = evaluate(scores=dict(reversed(list(sets.items()))), **args)
    key = ["estimator", "target", "level", "stratum", "metric"]
    assert one.sort(key).equals(two.sort(key))
    only = evaluate(scores={("fluency", "none"): sets[("fluency", "none")]}, **args)
    assert only.sort(key).equals(one.filter(pl.col("estimator").is_in(["fluency", "label"])).sort(key))

    def cell(est, level, metric):
        return one.filter(
            (pl.col("estimator") == est)
            & (pl.col("level") == level)
            & (pl.col("stratum") == "all")
            & (pl.col("metric") == metric)
        ).row(0, named=True)

    auc = cell("random", "rollout", "within_group_auc")
    assert auc["ci_low"] <= 0.5 <= auc["ci_high"]
    lift = cell("random", "rollout", "lift")
    assert lift["ci_low"] <= 1.0 <= lift["ci_high"]
    band = cell("random", "step", "lift_chance_band")
    assert abs(band["value"] - 1.0) < 0.1 and band["ci_low"] < 1.0 < band["ci_high"]
    assert band["ci_low"] <= cell("random", "step", "lift")["value"] <= band["ci_high"]
    assert cell("perfect", "step", "lift")["value"] > band["ci_high"]
    assert cell("perfect", "rollout", "precision_at_paid")["value"] == 1.0
    assert cell("fluency", "rollout", "within_group_auc")["ci_low"] > 0.55
    # Fluency residualized on itself carries nothing.
    assert abs(cell("fluency", "rollout", "within_group_auc_fluency_resid")["value"] - 0.5) < 0.02
    assert set(one["stratum"]) >= {"all", "window", "after_window", "below_saturation"}
    pairs = cell("fluency", "rollout", "matched_pair_auc")["n"]
    assert cell("fluency", "rollout", "matched_pair_underpowered")["value"] == float(pairs < 100)
    few = evaluate(scores=sets, **{**args, "min_matched_pairs": pairs + 1})
    assert few.filter(pl.col("metric") == "matched_pair_underpowered")["value"].min() == 1.0
    assert set(one.columns) == {
        "run",
        "seed",
        "draw",
        "estimator",
        "target",
        "level",
        "stratum",
        "metric",
        "value",
        "ci_low",
        "ci_high",
        "n",
        "replicates",
    }
    # The compared metrics keep their bootstrap replicates (the paired checklist items read them): the interval is
    # their percentile interval; other metrics keep none.
    kept = cell("fluency", "rollout", "within_group_auc")
    reps = np.asarray(kept["replicates"], float)
    assert len(reps) == 100
    assert np.percentile(reps, [2.5, 97.5]) == pytest.approx([kept["ci_low"], kept["ci_high"]], abs=1e-6)
    assert cell("fluency", "rollout", "matched_pair_auc")["replicates"] is None


def test_token_cosines_follow_the_direction_the_marker_was_pushed():
    """Loss-gradient sketches b = -advantage x t: the marker pushed along t when the advantage is positive,
    against it when negative; both read as +1 after the sign correction. Null positions are random."""
    rng = np.random.default_rng(0)
    n, k = 40, 64
    t = rng.normal(size=k)
    advantage = np.where(np.arange(n) % 2 == 0, 1.5, -0.5)
    advantage[:4] = 0.0  # no direction: left out
    has_marker = np.arange(n) < 30
    behavior = np.where(has_marker[:, None], -advantage[:, None] * t[None], 0.0)
    null = np.where(has_marker[:, None], rng.normal(size=(n, k)), 0.0)
    rollouts = pl.DataFrame(
        {
            "rollout_id": np.arange(n),
            "step": np.zeros(n, dtype=np.int64),
            "advantage": advantage,
            "checkpoint_step": np.zeros(n, dtype=np.int64),
        }
    )
    view = SeedView.from_arrays(
        rollouts,
        {
            "behavior_sketch": behavior,
            "null_sketch": null,
            "has_marker": has_marker,
            "null_norm": np.linalg.norm(null, axis=1),
        },
        pl.DataFrame(),
    )
    target = Target("in_context", 0, np.array([0]), t[None], np.array([np.linalg.norm(t)]), np.array([5]))
    behavior_cos, null_cos = token_cosines(view, {"in_context": target})["in_context"]
    usable = has_marker & (advantage != 0)
    assert np.allclose(behavior_cos[usable], 1.0)
    assert np.isnan(behavior_cos[~usable]).all() and np.isnan(null_cos[~usable]).all()
    assert abs(np.nanmean(null_cos)) < 0.2
    # The token_cosines rule writes them as a table; evaluate reads back the same arrays.
    table = token_cosine_table(view, {"in_context": target})
    back = token_cosines_from_table(table, view)["in_context"]
    np.testing.assert_array_equal(back[0], behavior_cos)
    np.testing.assert_array_equal(back[1], null_cos)
    with pytest.raises(ValueError, match="do not match"):
        token_cosines_from_table(table.reverse(), view)


def test_an_estimator_that_needs_the_model_without_a_target_is_a_config_error(monkeypatch):
    """Rule score_model writes the scores of every draw and target kind of a seed, so a module that needs the model
    must use a target; the config check names the instance's key."""
    from behaviortrace.estimators import random as random_control
    from behaviortrace.score import contract

    assert contract.check_params("random", {}) == []
    monkeypatch.setattr(random_control, "NEEDS_MODEL", True, raising=False)
    (problem,) = contract.check_params("random", {})
    assert problem.startswith("config key estimators.random: ") and "NEEDS_MODEL requires USES_TARGET" in problem
