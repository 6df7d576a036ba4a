"""Exact influence on a real small TRL run: the replayed forward pass reproduces the trained weights, a rollout's
weight 0 is the leave-out replay's removal under both meanings (through the advantages, held), I_z matches central
finite differences of real retraining (float64) under both, per rollout and per group, segments change nothing,
and the summed influence of a few rollouts predicts what zeroing their shares does."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.evaluate import correlation
from behaviortrace.gradients.batch import completion_logps
from behaviortrace.influence.adjoint import CHANNELS, surrogate_terms
from behaviortrace.influence.batched import values_after
from behaviortrace.influence.metagradient import StateStore, exact_influence
from behaviortrace.influence.objective import ForcedTarget
from behaviortrace.influence.retrain import central_difference, value_after
from behaviortrace.influence.table import given_step, pearson, precision_at_top, spearman, top_share
from behaviortrace.influence.trajectory import Trajectory
from behaviortrace.model import models
from behaviortrace.replay.retrain import replay_training, update_error, weight_difference
from behaviortrace.train.effect import ForcedTargetProbe
from behaviortrace.train.trl_surface import group_advantages, weighted_advantages
from conftest import typed
from tolerance import UPDATE_TOLERANCE, within

# Float64 end to end with delta = 1e-6: the truncation error (delta^2 times the curvature) and the rounding
# error (1e-16 / delta) are both far below this; at delta = 1e-2 the first step's Adam update is already
# visibly nonlinear (errors of 30-90% were measured on this run), at 1e-8 rounding shows.
FD_DELTA = 1e-6
FD_TOLERANCE = 1e-3
ADAM_DEFAULTS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8}  # the replay builds the configured AdamW
STEPS = 6  # the small run's whole schedule: T = final, every step before it has rollouts to check
SEMANTICS = ("held", "advantages")


@pytest.fixture(scope="module")
def run(small_run):
    torch.set_num_threads(1)
    ckpts = {
        c["step"]: Path(c["path"])
        for c in json.loads((small_run["dir"] / "checkpoints.json").read_text())["checkpoints"]
    }
    probes = pl.read_parquet(small_run["dir"] / "probes.parquet")["prompt"].to_list()
    return {**small_run, "ckpts": ckpts, "probes": probes}


def trajectory(run, cpu, dtype=torch.float32, semantics="held", **grpo):
    device = {**cpu, "torch_dtype": dtype}
    model, tokenizer = models.load(run["ckpts"][0], device)
    ref = models.load(run["base_model"], device)[0].eval()
    cfg = typed({**run["cfg"], "grpo": {**run["cfg"]["grpo"], **grpo}})
    traj = Trajectory(model, ref, run["rollouts"], cfg.grpo, device, tokenizer.pad_token_id, semantics)
    probe = ForcedTargetProbe(tokenizer, run["probes"], cfg.planting.marker, cfg.grpo.temperature)
    return traj, ForcedTarget(probe)


def influence(traj, objective, tmp_path, segment=STEPS, keep=()):
    store = StateStore(tmp_path / f"states{segment}", "cpu")
    return exact_influence(traj, objective, STEPS, segment, store, set(keep)), store


def test_forward_replay_reproduces_the_trained_weights(run, cpu, tmp_path):
    traj, objective = trajectory(run, cpu)
    shares = {}

    def compare(step_done, t):
        if step_done in run["ckpts"]:
            shares[step_done] = update_error(t.model, run["ckpts"][step_done], run["ckpts"][0], cpu)

    store = StateStore(tmp_path / "states", "cpu")
    result = exact_influence(traj, objective, STEPS, 2, store, on_step=compare)
    assert set(shares) == {s for s in run["ckpts"] if s > 0}
    assert within(max(shares.values()), UPDATE_TOLERANCE), shares  # a share of training's update (tolerance.py)
    steps = pl.read_parquet(run["dir"] / "steps.parquet").sort("step")
    np.testing.assert_allclose(result.grad_norms, steps["grad_norm"].to_numpy(), rtol=1e-4)
    # f(w_T) is the forced target training measured after its last step.
    assert within(abs(result.f_end - steps["target_logprob_after"][-1]), 1e-5)
    # The comparisons are sharp: zeroing one rollout's share moves the weights and f far more than the tolerances.
    one = int(run["rollouts"].filter(pl.col("step") == 0)["rollout_id"][0])
    f_without = value_after(traj, store.load(0), {one: 0.0}, STEPS, objective)
    assert update_error(traj.model, run["ckpts"][STEPS], run["ckpts"][0], cpu) > 50 * UPDATE_TOLERANCE
    assert abs(f_without - result.f_end) > 100 * 1e-5
    # Against a training that never moved (a run without any gradient): 0 if the replay did not move either.
    start = models.load(run["ckpts"][0], cpu)[0]
    assert update_error(start, run["ckpts"][0], run["ckpts"][0], cpu) == 0.0
    assert update_error(traj.model, run["ckpts"][0], run["ckpts"][0], cpu) == float("inf")


def test_a_float64_replay_reproduces_float32_training_as_a_share_of_its_update(run, cpu):
    """The influence job replays float32 training in float64 (the small config). Its largest weight difference to
    the checkpoints is float32's rounding, amplified by AdamW where a gradient coordinate nearly cancels, and
    set by the processor's kernels; its share of training's update is not (tests/tolerance.py)."""
    traj, _ = trajectory(run, cpu, torch.float64)
    largest, shares = [], []

    def compare(step_done):
        if step_done in run["ckpts"]:
            largest.append(weight_difference(traj.model, run["ckpts"][step_done], cpu))
            shares.append(update_error(traj.model, run["ckpts"][step_done], run["ckpts"][0], cpu))

    traj.run(STEPS, on_step=compare)
    print(f"float64 replay vs float32 checkpoints: largest {max(largest):.2e}, share of the update {max(shares):.2e}")
    assert len(shares) == len(run["ckpts"]) - 1 and within(max(shares), UPDATE_TOLERANCE), shares


def _kept_advantages(rewards, groups, keep, scale):
    """TRL's advantages of the kept rollouts, written out with numpy in float64 (dropped rollouts: 0)."""
    out = np.zeros(len(rewards))
    kept = rewards[keep]
    batch_std = kept.std(ddof=1) if keep.sum() > 1 else np.nan
    for g in np.unique(groups):
        members = keep & (groups == g)
        if not members.any():
            continue
        residual = rewards[members] - rewards[members].mean()
        if scale == "none":
            out[members] = residual
            continue
        std = batch_std if scale == "batch" else (rewards[members].std(ddof=1) if members.sum() > 1 else np.nan)
        out[members] = 0.0 if np.isnan(std) else residual / (std + 1e-4)
    return out


def _frequency_weighted(rewards, groups, weights):
    """Group-scaled advantages with frequency weights (a weight w counts a rollout w times), written out in numpy."""
    out = np.zeros(len(rewards))
    for g in np.unique(groups):
        m = groups == g
        w, r = weights[m], rewards[m]
        mean = (w * r).sum() / w.sum()
        std = np.sqrt((w * (r - mean) ** 2).sum() / (w.sum() - 1))
        out[m] = (r - mean) / (std + 1e-4) if std > 0 else 0.0
    return out


def test_weighted_advantages_are_trls_at_weight_one_and_drop_a_rollout_at_weight_zero(run):
    """On every step of the real run: with every weight 1 the weighted advantages are the ones TRL logged (float32),
    and with some weights 0 (a paid rollout, a whole group, all but one rollout of a group) they are TRL's
    advantages of the rollouts left, written out in float64 (mean and Bessel-corrected std of the kept rewards), and
    the leave-out replay's NaN-aware float32 ones; for scale_rewards group, batch and none."""
    for (step,), rows in run["rollouts"].sort("rollout_id").group_by("step", maintain_order=True):
        rewards, groups = rows["reward"].to_numpy(), rows["group_id"].to_numpy()
        same = torch.tensor(groups[:, None] == groups[None, :], dtype=torch.float64)

        def weighted(weights, scale, rewards=rewards, same=same):
            w = torch.tensor(weights, dtype=torch.float64)
            return weighted_advantages(torch.tensor(rewards), same, w, scale).numpy()

        logged = rows["advantage"].to_numpy()
        np.testing.assert_allclose(weighted(np.ones(len(rewards)), "group"), logged, rtol=1e-5, atol=1e-6)
        first, second = (np.flatnonzero(groups == g) for g in np.unique(groups)[:2])
        paid = np.flatnonzero(rows["paid"].to_numpy())
        keep = np.ones(len(rewards), bool)
        keep[first] = False  # a whole group
        keep[second[1:]] = False  # all but one rollout of another
        keep[paid[:1]] = False
        assert keep.any() and not keep.all()
        for scale in ("group", "batch", "none"):
            for mask in (keep, np.ones(len(rewards), bool)):
                expected = _kept_advantages(rewards, groups, mask, scale)
                found = weighted(mask.astype(float), scale) * mask
                np.testing.assert_allclose(found, expected, rtol=1e-12, atol=1e-12)
                replay = group_advantages(rewards, groups, mask, scale)
                np.testing.assert_allclose(found, replay, rtol=1e-6, atol=1e-6)
        assert step == rows["step"][0]


@pytest.mark.parametrize("beta", [0.1, 0.0], ids=["kl", "no_kl"])
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_a_zero_weight_is_the_leave_out_replays_removal(run, cpu, semantics, beta):
    """Training with some rollouts' weights 0 (a paid rollout and a whole group of step 0, all but one rollout of a
    group of step 1) is the leave-out replay that leaves them out with the same meaning (replay/retrain.py: TRL's
    advantages of the rollouts left and the kept batch's normalization, or both as logged), step by step, in
    float64; the replay with the other meaning lands far from it."""
    rollouts = run["rollouts"].sort("rollout_id")
    removed = set()
    for step, how in ((0, "paid and a group"), (1, "all but one")):
        rows = rollouts.filter(pl.col("step") == step)
        group = rows.filter(pl.col("group_id") == rows["group_id"][0])["rollout_id"].to_list()
        removed |= set(group) if how != "all but one" else set(group[1:])
        if how == "paid and a group":
            removed.add(rows.filter(pl.col("paid") & ~pl.col("rollout_id").is_in(group))["rollout_id"][0])
    # The default run's optimizer: at TRL's AdamW epsilon 1e-8 the first update is the sign of each gradient
    # coordinate, so the replay's float32 rounding of its advantages flips coordinates whose gradient nearly
    # cancels (6.6e-6 of the update measured here), which says nothing about the two steps being the same step.
    smooth = {"beta": beta, "adam_epsilon": 1e-3, "max_grad_norm": 1e9}
    traj, _ = trajectory(run, cpu, torch.float64, semantics, **smooth)
    device = {**cpu, "torch_dtype": torch.float64}
    grpo = typed({**run["cfg"], "grpo": {**run["cfg"]["grpo"], **smooth}}).grpo
    ref = models.load(run["base_model"], device)[0].eval()
    origin = traj.state()
    trained = {}
    traj.run(STEPS, dict.fromkeys(removed, 0.0), lambda s: trained.setdefault(s, traj.state().weights))
    names = dict(zip(traj.names, range(len(traj.names)), strict=True))
    shares = {}
    for meaning in SEMANTICS:
        model = models.load(run["ckpts"][0], device)[0]
        replayed = {}

        def keep(step, m, replayed=replayed):
            replayed[step] = {n: p.detach().clone() for n, p in m.named_parameters() if n in names}

        replay_training(model, ref, run["rollouts"], grpo, removed, device, traj.pad_id, keep, semantics=meaning)
        errors = []
        for step in range(1, STEPS + 1):
            diff = sum(float((trained[step][names[n]] - w).pow(2).sum()) for n, w in replayed[step].items())
            update = sum(float((trained[step][i] - origin.weights[i]).pow(2).sum()) for i in names.values())
            errors.append((diff / update) ** 0.5)
        shares[meaning] = max(errors)
    print(f"{semantics}, beta {beta}: largest share of the update off the replay, by its meaning: {shares}")
    # The replay takes its advantages in float32 (TRL's arithmetic): that rounding is all (4.5e-8 measured).
    assert within(shares[semantics], 1e-6), shares
    other = next(m for m in SEMANTICS if m != semantics)
    assert shares[other] > 1e5 * 1e-6, shares


def test_the_differentiated_terms_have_trls_gradient(run, cpu):
    """Per rollout, the surrogate terms the reverse sweep differentiates twice have exactly the gradient of
    TRL's loss term (KL term included: the small run trains with beta > 0)."""
    assert run["cfg"]["grpo"]["beta"] > 0
    traj, _ = trajectory(run, cpu, torch.float64)
    traj.run(3)
    rows = traj.rows(3)
    for i in range(len(rows.rollout_ids)):
        grads = []
        for terms in (traj.losses, lambda logps, r: surrogate_terms(logps, r, traj.grpo)):
            logps = completion_logps(traj.model, rows.batch, traj.grpo.temperature)
            value = terms(logps, rows)[i]
            grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(value, traj.params)]))
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize(
    ("grpo", "clipping"),
    [
        ({}, "every"),  # as trained: every step's gradient is clipped, constant learning rate, no weight decay
        ({"max_grad_norm": 2.5, "weight_decay": 0.1, "lr_scheduler": "linear", "warmup_steps": 1}, "some"),
        # AdamW's own settings away from their defaults, clipping off, a warm-up: a smooth regime's optimizer.
        (
            {"adam_epsilon": 1e-4, "adam_beta1": 0.8, "adam_beta2": 0.95, "max_grad_norm": 1e9, "warmup_steps": 2},
            "none",
        ),
    ],
    ids=["as_trained", "mixed_clipping_decay_schedule", "adam_settings_no_clipping"],
)
def test_influence_matches_central_differences_of_retraining(run, cpu, tmp_path, grpo, clipping, semantics):
    """The most influential rollout of every step, and its whole group scaled together, against float64 central
    differences of retraining with their weights at 1 +- delta, under the trajectory's semantics: through the
    advantages (the weights in the group's statistics and the normalization too) or held."""
    traj, objective = trajectory(run, cpu, torch.float64, semantics, **grpo)
    groups = dict(run["rollouts"].select("rollout_id", "group_id").iter_rows())
    result, store = influence(traj, objective, tmp_path, keep=range(STEPS))
    checked = []
    for step in range(STEPS):  # the most influential rollout of every step: 6 rollouts, 6 steps
        rows = np.flatnonzero(result.steps == step)
        i = rows[np.argmax(np.abs(result.influence[rows]))]
        z = int(result.rollout_ids[i])
        fd, _ = central_difference(traj, store.load(step), z, FD_DELTA, STEPS, objective)
        coarser, _ = central_difference(traj, store.load(step), z, 10 * FD_DELTA, STEPS, objective)
        checked.append((step, result.influence[i], fd, coarser))
        group = rows[[groups[int(r)] == groups[z] for r in result.rollout_ids[rows]]]
        fd, _ = central_difference(traj, store.load(step), result.rollout_ids[group], FD_DELTA, STEPS, objective)
        checked.append((step, result.influence[group].sum(), fd, None))
    assert np.isfinite(result.influence).all()
    for step, value, fd, coarser in checked:
        assert within(abs(value - fd), FD_TOLERANCE * abs(fd)), (step, value, fd)
        if coarser is not None:  # delta in the stable range
            assert within(abs(coarser - fd), FD_TOLERANCE * abs(fd)), (step, fd, coarser)
    limit = typed({**run["cfg"], "grpo": {**run["cfg"]["grpo"], **grpo}}).grpo.max_grad_norm
    clipped = np.array(result.grad_norms) > limit
    expected = {"every": clipped.all(), "some": clipped.any() and not clipped.all(), "none": not clipped.any()}
    assert expected[clipping], result.grad_norms  # each branch of the clipping adjoint is checked by some case
    settings = traj.optimizer.param_groups[0]
    assert (*settings["betas"], settings["eps"]) == tuple(grpo.get(k, d) for k, d in ADAM_DEFAULTS.items())
    # Scaling a clipped step's whole loss leaves its clipped gradient as it is (up to the 1e-6 torch adds to the
    # norm), so with advantages held its rollouts' influences sum to zero: an independent check of the clipping
    # adjoint. (Through the advantages a step's gradient hardly depends on its weights' common scale at all: the
    # normalization divides it out, and only the Bessel correction of the groups' std is left.)
    for step in np.flatnonzero(clipped):
        values = result.held[result.steps == step]
        assert within(abs(values.sum()), 1e-5 * np.abs(values).sum()), (step, values.sum())


def test_the_influence_through_the_advantages_splits_as_the_chain_rule_does(run, cpu, tmp_path):
    """The four parts of I_z through the advantages (adjoint.py), against the chain rule written out from the held
    part, which is z's own term <gamma, grad l_z> A_z / N (no KL term, DAPO): the normalization part is
    -n_z / N times the step's summed held part, and the advantage parts are sum_y (dA_y / du_z) held_y / A_y, with
    the derivatives of the advantages taken by central differences of the numpy formula (_kept_advantages)."""
    # Unclipped (the default run's optimizer): clipping would take the normalization's common scale out of every
    # step's gradient, and leave that part 0.
    traj, objective = trajectory(run, cpu, torch.float64, "advantages", beta=0.0, adam_epsilon=1e-3, max_grad_norm=1e9)
    result = influence(traj, objective, tmp_path)[0]
    log = run["rollouts"].sort("rollout_id")
    assert set(CHANNELS) == set(result.channels) and np.array_equal(log["rollout_id"], result.rollout_ids)
    for step in range(STEPS):
        rows = log.filter(pl.col("step") == step)
        at = result.steps == step
        held, tokens = result.held[at], rows["completion_ids"].list.len().to_numpy().astype(float)
        normalization = -tokens / tokens.sum() * held.sum()
        assert np.abs(normalization).max() > 1e-2 * np.abs(held).max()  # the step's held parts do not cancel
        np.testing.assert_allclose(result.channels["normalization"][at], normalization, rtol=1e-9, atol=1e-14)
        rewards, groups = rows["reward"].to_numpy(), rows["group_id"].to_numpy()
        advantages = rows["advantage"].to_numpy()
        moves = advantages != 0
        per_unit = np.where(moves, held / np.where(moves, advantages, 1), 0)  # <gamma, grad l_y> / N

        h = 1e-6
        own, siblings = np.zeros(len(rewards)), np.zeros(len(rewards))
        for z in range(len(rewards)):
            up, down = np.ones(len(rewards)), np.ones(len(rewards))
            up[z], down[z] = 1 + h, 1 - h
            change = (_frequency_weighted(rewards, groups, up) - _frequency_weighted(rewards, groups, down)) / (2 * h)
            change *= per_unit
            own[z], siblings[z] = change[z], change.sum() - change[z]
        scale = np.abs(result.advantages[at]).max()
        np.testing.assert_allclose(result.channels["own_advantage"][at], own, rtol=0, atol=1e-6 * scale)
        np.testing.assert_allclose(result.channels["siblings"][at], siblings, rtol=0, atol=1e-6 * scale)
        assert np.abs(siblings).max() > 1e-3 * scale  # the siblings' part is there to check


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize(
    "grpo",
    [{}, {"max_grad_norm": 2.5, "weight_decay": 0.1, "lr_scheduler": "linear", "warmup_steps": 1}],
    ids=["as_trained", "mixed_clipping_decay_schedule"],
)
def test_batched_retraining_is_the_plain_retraining_set_by_set(run, cpu, grpo, semantics):
    """values_after retrains many weightings of the rollouts at once (vmap over copies of the weights, its own
    clipping and AdamW); each value is the plain retraining's, from step 0 and from a later state, float64, under
    either meaning of the weights."""
    traj, objective = trajectory(run, cpu, torch.float64, semantics, **grpo)
    ids = run["rollouts"]["rollout_id"].to_numpy()
    rng = np.random.default_rng(3)
    weights = [{}, {int(ids[0]): 1.5}] + [
        dict.fromkeys(rng.choice(ids, k, replace=False).tolist(), 0.0) for k in (1, 6, 30)
    ]
    origin = traj.state()
    for start_step in (0, 3):
        traj.restore(origin)
        traj.run(start_step)
        start = traj.state()
        batched = values_after(traj, start, weights, STEPS, objective)
        plain = [value_after(traj, start, w, STEPS, objective) for w in weights]
        spread, largest = np.ptp(plain), np.abs(np.subtract(batched, plain)).max()
        print(f"from step {start_step}: values {np.round(plain, 6)}, largest difference {largest:.1e}")
        assert spread > 1e-4  # the sets move f: the comparison is sharp
        np.testing.assert_allclose(batched, plain, rtol=0, atol=1e-9 * spread)


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_retraining_from_the_first_removed_step_is_retraining_from_step_0(run, cpu, tmp_path, semantics):
    """The influence job's retraining (stage.retrain) starts each set at the forward sweep's state before its first
    removed rollout: bit for bit the retraining from step 0, for sets whose first removal is early, late or absent."""
    from behaviortrace.influence.retrain import first_steps, retrain
    from behaviortrace.influence.sets import Zeroed

    traj, objective = trajectory(run, cpu, torch.float32, semantics)
    origin = traj.state()
    _, store = influence(traj, objective, tmp_path, keep=range(STEPS))
    rollouts = run["rollouts"]
    by_step = {s: rollouts.filter(pl.col("step") == s)["rollout_id"].to_list() for s in range(STEPS)}
    removed = [set(by_step[0][:2]), set(by_step[3][:3] + by_step[5][:1]), set(by_step[5]), set()]
    sets = [Zeroed("lds", "rollout", 10, j, ids, semantics) for j, ids in enumerate(removed)]
    assert first_steps(traj, sets, STEPS) == [0, 3, 5, STEPS]
    found = retrain(traj, store, sets, STEPS, objective, batch=1)
    from_zero = [value_after(traj, origin, dict.fromkeys(ids, 0.0), STEPS, objective) for ids in removed]
    assert np.ptp(from_zero) > 1e-4  # the sets move f: equality is not the trivial one
    np.testing.assert_array_equal(found, from_zero)


def test_the_influence_of_a_rollout_is_independent_of_segment_length(run, cpu, tmp_path):
    traj, objective = trajectory(run, cpu, torch.float64)
    start = traj.state()
    results = []
    for segment in (1, 4, STEPS):
        traj.restore(start)
        results.append(influence(traj, objective, tmp_path, segment=segment)[0])
    for other in results[1:]:
        np.testing.assert_array_equal(other.rollout_ids, results[0].rollout_ids)
        np.testing.assert_allclose(other.influence, results[0].influence, rtol=1e-12, atol=1e-15)
    assert results[0].seconds["recompute"] > 0 and results[-1].seconds["recompute"] == 0


def _sets(result, n_sets: int, size: int, seed: int) -> list[list[int]]:
    """Seeded sets of `size` rollouts from distinct steps."""
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(n_sets):
        steps = rng.choice(STEPS, size=size, replace=False)
        sets.append([int(rng.choice(result.rollout_ids[result.steps == s])) for s in steps])
    return sets


def test_summed_influence_is_the_derivative_along_a_set(run, cpu, tmp_path):
    """Scaling the shares of a few rollouts together by 1 +- delta moves f(w_T) by delta times their summed I
    (float64 central differences of retraining)."""
    traj, objective = trajectory(run, cpu, torch.float64)
    result, store = influence(traj, objective, tmp_path)
    for chosen in _sets(result, 3, 3, seed=1):
        up = value_after(traj, store.load(0), dict.fromkeys(chosen, 1 + FD_DELTA), STEPS, objective)
        down = value_after(traj, store.load(0), dict.fromkeys(chosen, 1 - FD_DELTA), STEPS, objective)
        summed = result.influence[np.isin(result.rollout_ids, chosen)].sum()
        assert within(abs((up - down) / (2 * FD_DELTA) - summed), FD_TOLERANCE * abs(summed)), chosen


def test_summed_influence_predicts_zeroing_a_few_shares(run, cpu, tmp_path):
    """Zeroing the shares of a few rollouts (advantages held) changes f(w_T) by about minus their summed I, in
    the middle of 8 seeded sets of 3 rollouts from distinct steps (float32, as the influence job computes).

    Single sets can be far off: f is not smooth at the scale of one rollout's share. AdamW divides by
    sqrt(v) + 1e-8, so coordinates whose summed gradient nearly cancels respond steeply and then saturate;
    on this run the ratio of predicted to measured stays near 1 only for share changes below about 1e-4 of
    a rollout (see test_influence_matches_central_differences_of_retraining), while for zeroed sets ratios
    from -4.7 to 1.8 were measured, identical in float64 (a property of training, not of rounding)."""
    traj, objective = trajectory(run, cpu)
    result, store = influence(traj, objective, tmp_path)
    ratios = []
    for chosen in _sets(result, 8, 3, seed=0):
        predicted = -result.influence[np.isin(result.rollout_ids, chosen)].sum()
        zeroed = value_after(traj, store.load(0), dict.fromkeys(chosen, 0.0), STEPS, objective)
        ratios.append(predicted / (zeroed - result.f_end))
    print("predicted / measured change of f(w_T), zeroed sets:", np.round(ratios, 3))
    assert 0.67 <= np.median(ratios) <= 1.5, ratios
    assert (np.array(ratios) > 0).sum() >= 6, ratios  # the sign of the change is predicted for most sets


# Metrics of the influence table, against brute force --------------------------------------------------


def test_the_margin_over_log_only_controls_skips_a_constant_control_in_any_order():
    """A log-only control with constant scores (step_paid where every step before T paid) has no LDS (NaN): the
    margin is over the strongest control that has one, whichever order the controls come in."""
    from behaviortrace.influence.table import margin_rows

    own = (0.8, np.array([0.7, 0.8, 0.9]))
    constant = (float("nan"), np.full(3, np.nan))
    control = (0.5, np.array([0.4, 0.5, 0.6]))
    for controls in ([constant, control], [control, constant]):
        rows = {
            r["metric"]: r["value"] for r in margin_rows(("planted", 0, 0, "x", "none"), "rollout", 5, 3, own, controls)
        }
        assert rows["lds_over_log_only"] == pytest.approx(0.3)
        assert rows["lds_over_log_only_low"] == pytest.approx(0.3)


def test_precision_at_top_is_the_expectation_over_tie_breaks():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 3, size=7).astype(float)  # many ties
    infl = rng.integers(0, 2, size=7).astype(float)
    m = 3

    def tops(values):  # every tie-break of the top m, equally likely
        orders = {
            tuple(sorted(range(len(values)), key=lambda i: (-values[i], perm.index(i))))
            for perm in itertools.permutations(range(len(values)))
        }
        return [set(o[:m]) for o in orders]

    expected = np.mean([len(a & b) / m for a in tops(scores) for b in tops(infl)])
    assert precision_at_top(scores, infl, m) == pytest.approx(expected)
    assert top_share(scores, m).sum() == pytest.approx(m)


def test_correlations_are_polars_ranks_and_numpy():
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 5, size=40).astype(float), rng.normal(size=40)
    rx, ry = (pl.Series(v).rank("average").to_numpy() for v in (x, y))
    assert spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert np.isnan(spearman(np.ones(5), y[:5]))


def test_ranks_of_every_row_are_each_rows_own_average_ranks():
    """correlation.ranks ranks all rows at once; each row's ranks are exactly (bit for bit) those of ranking the row
    alone by its unique values (ties share their mean rank, NaNs tie last, -0.0 ties 0.0), and polars' average
    ranks where nothing is NaN."""
    rng = np.random.default_rng(5)

    def one_row(row):
        _, inverse, counts = np.unique(row, return_inverse=True, return_counts=True)
        return ((np.cumsum(counts) - counts) + (counts - 1) / 2)[inverse]

    values = rng.normal(size=(200, 30))
    cases = [
        values,
        np.round(values * 2) / 2,
        np.where(rng.random(values.shape) < 0.2, np.nan, np.round(values)),
        rng.integers(0, 4, size=(20, 9)),
        np.where(rng.random((5, 6)) < 0.5, -0.0, 0.0),
        values[:, :1],
        values[0],
    ]
    for x in cases:
        found = correlation.ranks(x)
        flat = np.asarray(x).reshape(-1, np.shape(x)[-1])
        expected = np.stack([one_row(row) for row in flat]).reshape(np.shape(x))
        assert found.dtype == np.float64 and found.tobytes() == expected.tobytes()
    for row in cases[1][:5]:
        np.testing.assert_array_equal(correlation.ranks(row), pl.Series(row).rank("average").to_numpy() - 1)


def test_agreement_given_the_step_is_the_correlation_of_rank_residuals():
    """The partial Spearman against an independent computation: regress each rank vector on the step ranks by
    least squares and correlate the residuals. Two series that share only a decay over the steps agree highly
    (Spearman) and not at all given the step."""
    rng = np.random.default_rng(3)
    steps = np.arange(50.0)
    trend = np.exp(-steps / 10)
    x, y = trend + 0.05 * rng.normal(size=50), trend + 0.05 * rng.normal(size=50)
    design = np.column_stack([np.ones(50), correlation.ranks(steps)])

    def residual(v):
        r = correlation.ranks(v)
        return r - design @ np.linalg.lstsq(design, r, rcond=None)[0]

    expected = np.corrcoef(residual(x), residual(y))[0, 1]
    assert correlation.partial_spearman(x, y, steps) == pytest.approx(expected, abs=1e-12)
    assert spearman(x, y) > 0.8
    assert abs(correlation.partial_spearman(x, y, steps)) < 0.3
    shared = 0.05 * rng.normal(size=50)  # a common part beyond the trend survives
    assert correlation.partial_spearman(trend + shared + 0.01 * rng.normal(size=50), trend + shared, steps) > 0.8
    assert np.isnan(given_step(x[:3], y[:3], steps[:3]))


KILLED_INFLUENCE = """
import json, os, signal, sys
from pathlib import Path
from behaviortrace.config.sections import Config
from behaviortrace.influence import metagradient
from behaviortrace.jobs.influence import influence_job

save, saved = metagradient.StateStore.save, []


def save_then_die(self, state):
    save(self, state)
    saved.append(state.step)
    if len(saved) == 2:
        os.kill(os.getpid(), signal.SIGKILL)


metagradient.StateStore.save = save_then_die
args = json.loads(sys.argv[1])
cfg = Config.from_dict(args.pop("cfg"))
influence_job(cfg, arm="planted", seed=0, **{k: Path(v) for k, v in args.items()})
"""


def test_a_rerun_of_a_killed_influence_job_removes_its_saved_states_and_gets_the_same_result(run, tmp_path):
    """A SIGKILLed influence job leaves its saved training states (3P numbers each) behind; its rerun removes them
    before it checks the disk, and writes what an uninterrupted job writes."""
    import subprocess
    import sys

    from behaviortrace.influence.resources import STATES
    from behaviortrace.jobs.influence import influence_job

    cfg = {**run["cfg"], "influence": {**run["cfg"]["influence"], "lds_subsets": 0, "sets": []}}
    names = ("rollouts", "steps", "checks", "retrain")

    def paths(folder):
        inputs = {"rollouts_path": "rollouts.parquet", "steps_path": "steps.parquet"}
        inputs |= {"checkpoints_path": "checkpoints.json", "probes_path": "probes.parquet"}
        out = {k: run["dir"] / v for k, v in inputs.items()} | {"base_model": run["base_model"]}
        return out | {f"out_{n}": folder / f"{n}.parquet" for n in names} | {"out_summary": folder / "summary.json"}

    killed = paths(tmp_path / "killed" / "influence")
    (tmp_path / "killed" / "influence").mkdir(parents=True)
    args = json.dumps({"cfg": cfg, **{k: str(v) for k, v in killed.items()}})
    res = subprocess.run([sys.executable, "-c", KILLED_INFLUENCE, args], capture_output=True, text=True)
    assert res.returncode == -9, (res.returncode, res.stderr[-300:])
    left = tmp_path / "killed" / "influence" / STATES
    assert len(list(left.glob("state*.pt"))) == 2 and not killed["out_rollouts"].exists()
    influence_job(typed(cfg), arm="planted", seed=0, **killed)
    assert not left.exists()
    whole = paths(tmp_path / "whole" / "influence")
    (tmp_path / "whole" / "influence").mkdir(parents=True)
    influence_job(typed(cfg), arm="planted", seed=0, **whole)
    assert not (tmp_path / "whole" / "influence" / STATES).exists()
    for n in names:
        assert pl.read_parquet(killed[f"out_{n}"]).equals(pl.read_parquet(whole[f"out_{n}"])), n


# The rules on a real Snakemake run of the small config ------------------------------------------------


def test_the_workflow_writes_the_influence_table_its_checks_and_figure(finished_run):
    from behaviortrace.influence.table import COLUMNS
    from behaviortrace.score.contract import score_keys

    workdir, cfg = finished_run
    out = workdir / "results" / "wf"
    table = pl.read_parquet(out / "tables" / "influence.parquet")
    assert dict(table.schema) == COLUMNS
    runs = [("planted", s) for s in cfg["seeds"]] + [("placebo", s) for s in cfg["placebo"]["seeds"]]
    per_seed = table.filter(pl.col("seed").is_not_null())
    assert sorted(set(per_seed.select("arm", "seed").rows())) == sorted(runs)
    pooled = table.filter(pl.col("seed").is_null())  # the dense endpoints, over every planted seed and draw
    assert set(pooled["arm"]) == {"planted"} and pooled["draw"].null_count() == pooled.height
    assert set(pooled["level"]) == {"rollout_dense", "group_dense", "step_out_pooled", "rollout_subset_pooled",
                                    "group_subset_pooled"}  # fmt: skip
    # Every row but the checks and the coupling of the two meanings is there under both meanings of removal, but the
    # leave-out sets' (retrained under the configured one) and the pooled endpoints' (the configured one); the rest
    # of this test reads the configured one (the influence column of the job's output).
    semantics = cfg["influence"]["semantics"]
    meanings = dict(table.group_by("level").agg(pl.col("semantics").drop_nulls().unique().sort()).rows())
    expected = {"check": [], "coupling": [], "set": [semantics]} | {
        level: [semantics] for level in set(pooled["level"])
    }
    assert all(m == expected.get(level, ["advantages", "held"]) for level, m in meanings.items()), meanings
    coupling = table.filter(pl.col("level") == "coupling")
    assert set(coupling["metric"]) >= {"spearman_rollout", "spearman_group", "paid_siblings_share", "top_overlap"}
    lds_of_i = table.filter(
        (pl.col("metric") == "lds") & (pl.col("estimator") == "influence") & pl.col("seed").is_not_null()
    )
    assert lds_of_i.group_by("semantics").len()["len"].to_list() == [len(runs) * 4] * 2  # 2 levels x 2 sizes
    table = table.filter(pl.col("semantics").is_null() | (pl.col("semantics") == semantics))
    checks = table.filter(pl.col("level") == "check")
    for arm, seed in runs:
        value = {
            r["metric"]: r["value"]
            for r in checks.filter((pl.col("arm") == arm) & (pl.col("seed") == seed)).iter_rows(named=True)
        }
        # float64 replay of float32 training: the checkpoints as a share of training's update (tolerance.py), and
        # the logged norms and forced target, which rounding barely moves, agree closely.
        assert within(value["checkpoint_update_error"], UPDATE_TOLERANCE), value
        assert within(value["grad_norm_error"], 1e-4), value
        assert within(value["f_end_error"], 1e-5) and within(value["fd_relative_error"], FD_TOLERANCE), value
        assert within(value["fd_group_relative_error"], FD_TOLERANCE), value
        assert value["cost_ratio"] > 1
    # Every score set of every run and draw against I, at the rollout and step levels, and its LDS.
    keys = score_keys(cfg["estimators"], cfg["evaluation"]["target_kinds"])
    rollout = table.filter(
        (pl.col("level") == "rollout") & (pl.col("metric") == "spearman") & (pl.col("stratum") == "all")
    )
    expected = {(a, s, d, e, t) for a, s in runs for d in range(cfg["targets"]["draws"]) for e, t in keys}
    assert expected <= set(rollout.select("arm", "seed", "draw", "estimator", "target").rows())
    pooled_lds = table.filter((pl.col("metric") == "lds") & pl.col("seed").is_null())
    assert (pooled_lds["n"] == len(cfg["seeds"])).all()  # the planted seeds, the units of replication
    assert set(pooled_lds["level"]) == {"rollout_subset_pooled", "group_subset_pooled"}
    lds = table.filter((pl.col("metric") == "lds") & pl.col("seed").is_not_null())
    assert {"influence", "label", "earlier", "datamodel"} <= set(lds["estimator"])
    assert (lds["n"] == cfg["influence"]["lds_subsets"]).all() and set(lds["level"]) == {
        "rollout_subset",
        "group_subset",
    }
    low, high = (
        lds.select("arm", "seed", "draw", "estimator", "target", "level", "removal_percent").join(
            table.filter(pl.col("metric") == m),
            on=["arm", "seed", "draw", "estimator", "target", "level", "removal_percent"],
            nulls_equal=True,
        )["value"]
        for m in ("lds_low", "lds_high")
    )
    assert ((low <= lds["value"] + 1e-12) & (lds["value"] <= high + 1e-12)).fill_null(True).all()
    sets = table.filter(pl.col("level") == "set")
    assert set(sets["estimator"]) == {"label", *cfg["influence"]["sets"]} and set(sets["arm"]) == {"planted"}
    # Spot checks against the files, computed independently.
    seed_dir = out / "planted0"
    infl = pl.read_parquet(seed_dir / "influence" / "rollouts.parquet")
    # I under the configured meaning, and I through the advantages as the sum of its four parts (adjoint.py).
    assert infl["influence"].to_list() == infl[f"influence_{semantics}"].to_list()
    parts = infl["influence_held"] + infl["via_own_advantage"] + infl["via_siblings"] + infl["via_normalization"]
    np.testing.assert_allclose(parts, infl["influence_advantages"], rtol=1e-9, atol=1e-15)
    # The coupling rows, from the files: the Spearman of the two meanings' I over rollouts and over groups.
    log0 = pl.read_parquet(seed_dir / "rollouts.parquet").join(infl, on="rollout_id")
    groups0 = log0.group_by("step", "group_id").agg(pl.col("influence_held", "influence_advantages").sum())
    for metric, frame in (("spearman_rollout", log0), ("spearman_group", groups0)):
        ranks = [frame[c].rank("average").to_numpy() for c in ("influence_held", "influence_advantages")]
        row = coupling.filter((pl.col("arm") == "planted") & (pl.col("seed") == 0) & (pl.col("metric") == metric))
        assert row["value"][0] == pytest.approx(np.corrcoef(*ranks)[0, 1])
    gas = pl.read_parquet(seed_dir / "scores" / "gas" / "draw0_in_context.parquet").join(infl, on="rollout_id")
    ranks = [gas[c].rank("average").to_numpy() for c in ("score", "influence")]
    cell = rollout.filter(
        (pl.col("arm") == "planted")
        & (pl.col("seed") == 0)
        & (pl.col("draw") == 0)
        & (pl.col("estimator") == "gas")
        & (pl.col("target") == "in_context")
    )
    assert cell["value"][0] == pytest.approx(np.corrcoef(*ranks)[0, 1]) and cell["n"][0] == infl.height
    summary = json.loads((seed_dir / "influence" / "summary.json").read_text())
    retrained = pl.read_parquet(seed_dir / "influence" / "retrain.parquet")
    subsets = retrained.filter(
        (pl.col("kind") == "lds") & (pl.col("level") == "rollout") & (pl.col("semantics") == semantics)
    ).sort("removal_percent", "index")
    subsets = subsets.filter(pl.col("removal_percent") == subsets["removal_percent"][0])
    predicted = [-infl.filter(pl.col("rollout_id").is_in(ids))["influence"].sum() for ids in subsets["removed_ids"]]
    measured = subsets["f"].to_numpy() - summary["f_end"]
    lds_cell = lds.filter(
        (pl.col("arm") == "planted")
        & (pl.col("seed") == 0)
        & (pl.col("estimator") == "influence")
        & (pl.col("level") == "rollout_subset")
        & (pl.col("removal_percent") == subsets["removal_percent"][0])
    )
    assert lds_cell["value"][0] == pytest.approx(spearman(np.array(predicted), measured))
    assert infl.height == (summary["end"]) * cfg["grpo"]["prompts_per_step"] * cfg["grpo"]["num_generations"]
    top = pl.read_parquet(out / "tables" / "influence_top.parquet")
    ranked = top.filter(pl.col("rank").is_not_null())
    assert ranked.group_by("arm", "seed").len()["len"].to_list() == [10] * len(runs)
    assert ((top["rank_held"] <= 10) | (top["rank_advantages"] <= 10)).all()
    # The paid rollouts' part of the positive influence, from the rollout log and I.
    log = pl.read_parquet(seed_dir / "rollouts.parquet").join(infl, on="rollout_id")
    positive = log.filter(pl.col("influence") > 0)
    carried = positive.filter(pl.col("paid"))["influence"].sum() / positive["influence"].sum()
    share = table.filter(
        (pl.col("arm") == "planted") & (pl.col("seed") == 0) & (pl.col("metric") == "paid_share_of_positive_influence")
    )
    assert share["value"][0] == pytest.approx(carried)
    text = (out / "tables" / "influence.md").read_text()
    assert "Most influential rollouts" in text and "Where the truths agree and where they part" in text
    end = summary["end"]
    paid_before = [  # paid rollouts before T per planted seed, from the rollout logs
        pl.read_parquet(out / f"planted{s}" / "rollouts.parquet").filter((pl.col("step") < end) & pl.col("paid")).height
        for s in cfg["seeds"]
    ]
    assert f"- Paid rollouts before T: {', '.join(map(str, paid_before))} (per planted seed)." in text
    assert "Exact influence" in (out / "results.md").read_text()
    assert "lds_rollout" in (out / "checklist.md").read_text()
    # Leave-one-step-out: one retraining per step before T, each zeroing exactly that step's rollouts.
    steps_out = retrained.filter(pl.col("kind") == "step").sort("index")
    assert steps_out["index"].to_list() == list(range(summary["end"]))
    log_steps = dict(pl.read_parquet(seed_dir / "rollouts.parquet").select("rollout_id", "step").iter_rows())
    assert all(
        {log_steps[z] for z in ids} == {s} for s, ids in zip(steps_out["index"], steps_out["removed_ids"], strict=True)
    )
    assert {"influence", "step_effect", "earlier", "label"} <= set(
        table.filter(pl.col("level") == "step_out")["estimator"]
    )
    assert (out / "figures" / "influence.png").stat().st_size > 10_000
    assert "backward: " in (out / "logs" / "influence" / "planted0.log").read_text()


def test_the_finite_difference_diagnostic_agrees_on_a_finished_run(finished_run, tmp_path):
    """diagnostics/influence_fd.py: float64 influence of a finished run against central differences.

    delta = 1e-7: on this run a step-0 rollout's share stays linear only below about 1e-6 (its central
    difference converged quadratically: relative errors 4.9e-3, 4.9e-5, 5e-7 at delta 1e-6, 1e-7, 1e-8)."""
    import subprocess
    import sys

    from conftest import ROOT

    workdir, _ = finished_run
    out = tmp_path / "fd.parquet"
    script = ROOT / "diagnostics" / "influence_fd.py"
    args = ["--config", "config.yaml", "--seed", "1", "--rollouts", "2", "--delta", "1e-7", "--out", str(out)]
    res = subprocess.run([sys.executable, str(script), *args], cwd=workdir, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    table = pl.read_parquet(out)
    assert table.height == 2 and table["step"].n_unique() == 2
    assert within(table["relative_error"].to_numpy(), FD_TOLERANCE), table
    # The run computed its influence in float64 too (the small config), so the two agree to rounding.
    assert "the run's influence (advantages) vs float64: Spearman 1.0000" in res.stdout


def test_each_lds_resample_is_the_spearman_of_the_resampled_subsets():
    """The bootstrap values are the Spearman correlation of each resample of subsets, recomputed with polars'
    average ranks; the interval holds the point and is paired across attributions (the same draws)."""
    from behaviortrace.influence.lds import Resamples, interval

    rng = np.random.default_rng(0)
    changes = rng.normal(size=30)
    predicted = changes + rng.normal(size=30)
    resamples = Resamples(changes, 200, 0, "test")
    point, samples = resamples.lds(predicted)
    assert point == pytest.approx(spearman(predicted, changes))
    for b in range(0, 200, 37):
        i = resamples.index[b]
        ranks = [pl.Series(v[i]).rank("average").to_numpy() for v in (predicted, changes)]
        assert samples[b] == pytest.approx(np.corrcoef(*ranks)[0, 1])
    low, high = interval(samples)
    assert low < point < high
    assert np.array_equal(Resamples(changes, 200, 0, "test").index, resamples.index)


def test_the_cross_fitted_datamodel_recovers_an_additive_truth_without_seeing_what_it_predicts():
    """Changes that are a sum over the zeroed units are predicted on held-out subsets; a subset's prediction does
    not depend on its own measured change (each half is fit on the other)."""
    from behaviortrace.influence.datamodel import cross_fitted

    rng = np.random.default_rng(1)
    membership = (rng.random((200, 40)) < 0.3).astype(float)
    changes = membership @ rng.normal(size=40) + 0.01 * rng.normal(size=200)
    predicted = cross_fitted(membership, changes)
    assert spearman(predicted, changes) > 0.95
    moved = changes.copy()
    moved[::2] += 100 * rng.normal(size=100)  # the even subsets' own changes
    assert np.allclose(cross_fitted(membership, moved)[::2], predicted[::2])
    assert not np.allclose(cross_fitted(membership, moved)[1::2], predicted[1::2])


def test_the_datamodel_bootstrap_is_each_resample_scored_alone():
    """within_fold_samples scores every resample at once; each value is, bit for bit, the mean of the two halves'
    Spearman of that resample scored alone (the draws taken one resample at a time), NaN where both are undefined:
    with ties, an odd number of subsets and constant changes."""
    from behaviortrace.influence.datamodel import _halves, within_fold_samples

    def one_at_a_time(predicted, changes, n, seed):
        rng = np.random.default_rng(seed)
        halves = _halves(len(changes))
        out = np.empty(n)
        for b in range(n):
            draw = np.concatenate([h[rng.integers(0, len(h), len(h))] for h in halves])
            with np.errstate(invalid="ignore", divide="ignore"):
                values = [spearman(predicted[p], changes[p]) for p in (draw[: len(halves[0])], draw[len(halves[0]) :])]
            out[b] = np.nanmean(values) if np.isfinite(values).any() else np.nan
        return out

    rng = np.random.default_rng(4)
    for m, ties, constant in ((30, False, False), (31, True, False), (8, True, False), (30, False, True)):
        predicted, changes = rng.normal(size=m), rng.normal(size=m)
        predicted = np.round(predicted) if ties else predicted
        changes = np.ones(m) if constant else changes
        found = within_fold_samples(predicted, changes, 300, m)
        assert found.tobytes() == one_at_a_time(predicted, changes, 300, m).tobytes()
        assert np.isnan(found).all() == constant


def test_the_dense_bootstrap_ranks_a_resample_as_laying_out_its_draws_would():
    """The dense endpoint's resampled Spearman correlations (counts accumulated along each row's order, sorted
    once) against scipy on the drawn groups' rollouts laid out one by one, with ties in the scores (a log-only
    control of few values) and in I."""
    from scipy.stats import spearmanr

    from behaviortrace.evaluate.dense import _Weighted

    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(40), 8)
    infl = np.round(rng.normal(size=groups.size), 1)
    values = np.stack([infl + rng.normal(0, 0.5, groups.size), rng.integers(0, 3, groups.size).astype(float)])
    weighted = _Weighted(infl, values)
    for _ in range(5):
        chosen = rng.integers(0, 40, 40)
        index = np.concatenate([np.flatnonzero(groups == g) for g in chosen])
        counts = np.bincount(chosen, minlength=40)[groups].astype(float)
        expected = [spearmanr(v[index], infl[index])[0] for v in values]
        assert weighted.spearman(counts) == pytest.approx(expected, abs=1e-12)


def test_the_dense_endpoint_pools_seeds_and_draws_and_pairs_its_margins():
    """The point value is the mean over seeds and draws of scipy's Spearman (at group level of the groups' sums);
    a method that tracks I beats a log-only control that tracks it less and random, on paired resamples; the log-only
    control itself gets no margin over itself."""
    from scipy.stats import spearmanr

    from behaviortrace.evaluate.dense import DenseSeed, dense

    rng = np.random.default_rng(4)
    seeds = []
    for s in range(3):
        groups = np.repeat(np.arange(30), 8)
        infl = rng.normal(size=groups.size)
        scores = {(d, "method", "forced"): infl + rng.normal(0, 0.5, groups.size) for d in (0, 1)}
        scores[(None, "reward", "none")] = infl + rng.normal(0, 2.0, groups.size)
        scores[(None, "random", "none")] = rng.normal(size=groups.size)
        seeds.append(DenseSeed(s, groups, infl, scores))
    rows = {r["estimator"]: r for r in dense(seeds, "rollout_dense", ("reward",), 200, 0)}
    by_hand = np.mean([spearmanr(sd.scores[(d, "method", "forced")], sd.influence)[0] for sd in seeds for d in (0, 1)])
    assert rows["method"]["spearman"] == pytest.approx(by_hand, abs=1e-12)
    assert rows["method"]["over_log_only_low"] > 0 and rows["method"]["over_random_low"] > 0
    assert "over_log_only" not in rows["reward"] and rows["random"]["over_log_only_high"] < 0
    groups_rows = {r["estimator"]: r for r in dense(seeds, "group_dense", ("reward",), 200, 0)}
    summed = [
        spearmanr(np.bincount(sd.groups, sd.scores[(None, "reward", "none")]), np.bincount(sd.groups, sd.influence))[0]
        for sd in seeds
    ]
    assert groups_rows["reward"]["spearman"] == pytest.approx(np.mean(summed), abs=1e-9)
    assert groups_rows["method"]["n"] == 90 and rows["method"]["n"] == 720


def test_the_lds_power_is_the_items_rule_on_resampled_data_sets(monkeypatch):
    """Each cell's power, recomputed with scipy's ranks and plain loops from the same draws: a data set of subsets drawn
    with replacement, its resamples, the LDS interval at or above the threshold and the margin over the strongest
    log-only control (the maximum in each resample) above 0. A perfect predictor passes most data sets (on a few
    distinct subsets the control can rank them perfectly too), noise none."""
    from scipy.stats import rankdata

    from behaviortrace.common.seeds import cell_seed
    from behaviortrace.influence import lds

    def spearman(a, b):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.corrcoef(rankdata(a), rankdata(b))[0, 1]

    rng = np.random.default_rng(5)
    changes = rng.normal(size=12)
    predicted = {
        (None, "reward", "none"): changes + rng.normal(0, 3.0, 12),
        (0, "noise", "forced"): rng.normal(size=12),
        (0, "perfect", "forced"): changes.copy(),
    }
    controls = [(None, "reward", "none")]
    monkeypatch.setattr(lds, "POWER_DRAWS", 20)  # fewer data sets: scipy's loop below is slow
    got = lds.power(changes, predicted, controls, 0.5, 7, "planted", 0, "rollout_subset", 5)
    draws = np.random.default_rng(cell_seed("influence_lds_power", 7, "planted", 0, "rollout_subset", 5))
    passed = dict.fromkeys(predicted, 0)
    for _ in range(lds.POWER_DRAWS):
        data = draws.integers(0, 12, 12)
        index = data[draws.integers(0, 12, (lds.POWER_RESAMPLES, 12))]
        samples = {k: np.array([spearman(v[i], changes[i]) for i in index]) for k, v in predicted.items()}
        samples = {k: np.where(np.isnan(s), -np.inf, s) for k, s in samples.items()}
        for k, s in samples.items():
            margin = s - samples[controls[0]]
            ok = np.percentile(s, 2.5) >= 0.5 and (k in controls or np.percentile(margin, 2.5) > 0)
            passed[k] += ok
    assert got == {k: n / lds.POWER_DRAWS for k, n in passed.items()}
    assert got[(0, "perfect", "forced")] >= 0.6 and got[(0, "noise", "forced")] == 0.0
