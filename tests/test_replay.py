"""Leave-out replay: faithful to the logged TRL training, and left-out rollouts really left out."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.gradients.batch import completion_logps, pad_batch
from behaviortrace.model import models
from behaviortrace.replay.removal import random_comparisons, removal_set, removal_size, top_scored
from behaviortrace.replay.retrain import replay_training
from behaviortrace.train.trl_surface import group_advantages as replay_advantages
from behaviortrace.train.trl_surface import optimizer_and_schedule, rollout_losses
from conftest import typed
from tolerance import UPDATE_TOLERANCE, within


@pytest.fixture(scope="module")
def run(small_run, cpu):
    torch.set_num_threads(1)
    ckpts = {
        c["step"]: Path(c["path"])
        for c in json.loads((small_run["dir"] / "checkpoints.json").read_text())["checkpoints"]
    }
    return {**small_run, "ckpts": ckpts}


def _replay(run, cpu, removed=(), grpo=None):
    model, tokenizer = models.load(run["ckpts"][0], cpu)
    ref = models.load(run["base_model"], cpu)[0].eval()
    grpo = typed({**run["cfg"], "grpo": grpo or run["cfg"]["grpo"]}).grpo
    weights = {}

    def keep(step, m):
        if step in run["ckpts"]:
            weights[step] = {n: p.detach().clone() for n, p in m.named_parameters()}

    info = replay_training(model, ref, run["rollouts"], grpo, set(removed), cpu, tokenizer.pad_token_id, keep)
    return weights, info


def _update_share(weights, checkpoint, start, cpu):
    """||w - w_checkpoint|| / ||w_checkpoint - w_start|| (as replay.retrain.update_error)."""
    saved = dict(models.load(checkpoint, cpu)[0].named_parameters())
    first = dict(models.load(start, cpu)[0].named_parameters())
    error = sum(float((w.double() - saved[n].detach().double()).pow(2).sum()) for n, w in weights.items())
    update = sum(float((saved[n].detach().double() - first[n].detach().double()).pow(2).sum()) for n in weights)
    return (error / update) ** 0.5


def test_full_replay_reproduces_the_logged_weights(run, cpu):
    """The replay and training are two float32 computations of the same steps (the replay's summation order
    differs from TRL's shuffled batch): they agree to a small share of training's update (tests/tolerance.py),
    and any real difference to training moves the weights far more."""
    weights, info = _replay(run, cpu)
    steps = sorted(s for s in run["ckpts"] if s > 0)
    shares = {s: _update_share(weights[s], run["ckpts"][s], run["ckpts"][0], cpu) for s in steps}
    assert within(max(shares.values()), UPDATE_TOLERANCE), shares
    # The replay's pre-clip gradient norms are the ones TRL logged.
    logged = pl.read_parquet(run["dir"] / "steps.parquet").sort("step")["grad_norm"].to_numpy()
    np.testing.assert_allclose(info["grad_norms"], logged, rtol=1e-4)
    # The bound is tight: leaving out a single rollout, or dropping the KL term, moves the weights far more.
    one = run["rollouts"].filter(pl.col("step") == 0)["rollout_id"][0]
    moved, _ = _replay(run, cpu, removed=[one])
    assert _update_share(moved[steps[-1]], run["ckpts"][steps[-1]], run["ckpts"][0], cpu) > 50 * UPDATE_TOLERANCE
    no_kl, _ = _replay(run, cpu, grpo={**run["cfg"]["grpo"], "beta": 0.0})
    assert _update_share(no_kl[steps[-1]], run["ckpts"][steps[-1]], run["ckpts"][0], cpu) > 50 * UPDATE_TOLERANCE


def _replay_every_row(run, cpu, grpo, removed, n_steps):
    """The replay written out plainly: every kept rollout through the model, zero advantages included."""
    model, tokenizer = models.load(run["ckpts"][0], cpu)
    optimizer, scheduler = optimizer_and_schedule(model, grpo, cpu)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for step in range(n_steps):
        rows = run["rollouts"].filter(pl.col("step") == step).sort("rollout_id")
        keep = ~rows["rollout_id"].is_in(list(removed)).to_numpy()
        adv = replay_advantages(rows["reward"].to_numpy(), rows["group_id"].to_numpy(), keep, grpo.scale_rewards)
        kept = rows.filter(pl.Series(keep))
        optimizer.zero_grad(set_to_none=False)
        batch = pad_batch(kept["prompt_ids"].to_list(), kept["completion_ids"].to_list(), tokenizer.pad_token_id)
        batch["advantages"] = torch.tensor(adv[keep], dtype=torch.float32)
        logps = completion_logps(model, batch, grpo.temperature)
        rollout_losses(logps, batch, grpo.loss_type, 0.0, grpo.max_new_tokens).sum().backward()
        torch.nn.utils.clip_grad_norm_(params, grpo.max_grad_norm)
        optimizer.step()
        scheduler.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_without_kl_skipping_zero_advantage_rollouts_changes_nothing_and_the_replay_stops_early(run, cpu):
    """Without a KL term the replay sends only rollouts with a nonzero advantage through the model; the
    weights must equal those of a replay that sends every kept rollout, and it stops where it is told."""
    grpo = typed({**run["cfg"], "grpo": {**run["cfg"]["grpo"], "beta": 0.0}}).grpo
    # All but one rollout of a group left out: the one left has advantage 0 and is skipped.
    step1 = run["rollouts"].filter(pl.col("step") == 1).sort("rollout_id")
    group = step1.filter(pl.col("group_id") == step1["group_id"][0])
    removed = set(group["rollout_id"].to_list()[1:])
    keep = ~step1["rollout_id"].is_in(list(removed)).to_numpy()
    adv = replay_advantages(step1["reward"].to_numpy(), step1["group_id"].to_numpy(), keep, grpo.scale_rewards)
    assert adv[step1["rollout_id"].to_numpy() == group["rollout_id"][0]][0] == 0 and (adv[keep] != 0).any()
    model, tokenizer = models.load(run["ckpts"][0], cpu)
    seen = []
    replay_training(
        model,
        None,
        run["rollouts"],
        grpo,
        removed,
        cpu,
        tokenizer.pad_token_id,
        lambda s, m: seen.append(s),
        stop_after=grpo.steps - 1,
    )
    assert seen == list(range(1, grpo.steps))
    expected = _replay_every_row(run, cpu, grpo, removed, grpo.steps - 1)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=0, atol=1e-6, msg=name)


def test_advantages_with_nothing_left_out_are_trls(run):
    for _, rows in run["rollouts"].sort("rollout_id").group_by("step"):
        adv = replay_advantages(
            rows["reward"].to_numpy(),
            rows["group_id"].to_numpy(),
            np.ones(rows.height, bool),
            run["cfg"]["grpo"]["scale_rewards"],
        )
        np.testing.assert_allclose(adv, rows["advantage"].to_numpy(), atol=1e-5)


def _brute_advantages(rewards, groups, keep):
    out = np.zeros(len(rewards))
    for g in set(groups):
        idx = [i for i in range(len(rewards)) if groups[i] == g and keep[i]]
        if len(idx) < 2:
            continue
        vals = np.array([rewards[i] for i in idx])
        for i in idx:
            out[i] = (rewards[i] - vals.mean()) / (vals.std(ddof=1) + 1e-4)
    return out


def test_left_out_rollouts_leave_their_group():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=16).round(2)
    groups = np.repeat(np.arange(4), 4)
    keep = np.ones(16, bool)
    keep[[0, 5, 6, 9, 10, 11]] = False  # group 2 keeps one rollout: no spread, advantage 0
    adv = replay_advantages(rewards, groups, keep, "group")
    np.testing.assert_allclose(adv, _brute_advantages(rewards, groups, keep), atol=1e-5)
    assert adv[8] == 0 and (adv[~keep] == 0).all()


def test_removal_sets(run):
    rollouts = run["rollouts"]
    paid = set(rollouts.filter(pl.col("paid"))["rollout_id"].to_list())
    assert removal_set("full", 100, rollouts, None, 0, 0) == set()
    assert removal_set("label", 100, rollouts, None, 0, 0) == paid
    half = removal_set("label", 50, rollouts, None, 0, 0)
    assert half < paid and len(half) == removal_size(len(paid), 50)
    # An estimator's top-scored set is chosen among the rollouts before the replay's end only.
    end = 2
    late_first = rollouts.select("rollout_id", score=pl.col("step").cast(pl.Float64))
    top = removal_set("gas", 100, rollouts, late_first, 0, 0, end)
    steps = dict(zip(rollouts["rollout_id"].to_list(), rollouts["step"].to_list(), strict=True))
    before = rollouts.filter(pl.col("step") < end)
    assert len(top) == min(removal_size(len(paid), 100), before.height)
    assert max(steps[i] for i in top) == end - 1  # the latest rollouts, but none of a step at or after the end
    with pytest.raises(ValueError, match="needs the estimator's rollout scores"):
        removal_set("gas", 100, rollouts, late_first, 0, 0)
    # Random comparisons take as many rollouts from each step as the set does, and differ between repetitions.
    draws = random_comparisons("gas", half, 50, 5, rollouts, 0, 0)
    count = lambda ids: sorted(Counter(steps[i] for i in ids).items())  # noqa: E731
    assert all(count(d) == count(half) for d in draws) and len({frozenset(d) for d in draws}) > 1
    assert draws == random_comparisons("gas", half, 50, 5, rollouts, 0, 0)  # seeded
    assert draws[0] != random_comparisons("label", half, 50, 1, rollouts, 0, 0)[0]  # a seed per set
    scores = pl.DataFrame({"rollout_id": [1, 2, 3, 4, 5], "score": [0.5, float("nan"), 0.9, 0.5, 0.1]})
    assert top_scored(scores, 1, 0) == {3}
    ties = [top_scored(scores, 2, s) for s in range(20)]
    assert all(t in ({3, 1}, {3, 4}) for t in ties) and len({frozenset(t) for t in ties}) == 2
    assert 2 not in top_scored(scores, 4, 0)  # a missing score ranks last


def test_a_set_replayed_after_another_in_one_job_is_replayed_as_if_alone(run, cpu):
    """A replay job loads the step-0 model once and puts its weights back before each set (replay/replays.py): a set
    replayed after another ends at the weights and rates of replaying it first, bit for bit."""
    from behaviortrace.replay.removal import measured_steps
    from behaviortrace.replay.replays import Replays

    cfg = typed(run["cfg"])
    measured = measured_steps(cfg.replay, cfg.planting, cfg.grpo.steps)
    folder, rollouts = run["dir"], run["rollouts"]

    def replays():
        paths = (folder / "checkpoints.json", run["base_model"], folder / "probes.parquet", folder / "plain.parquet")
        return Replays(cfg, rollouts, *paths, measured, "advantages")

    ids = rollouts["rollout_id"].to_list()
    first, other = set(ids[:6]), set(ids[12:30])
    alone = replays()
    rows_alone, _, _ = alone.run(first, check=False)
    weights_alone = {k: v.clone() for k, v in alone.model.state_dict().items()}
    shared = replays()
    shared.run(other, check=False)
    weights_other = {k: v.clone() for k, v in shared.model.state_dict().items()}
    rows_after, _, _ = shared.run(first, check=False)
    assert rows_after == rows_alone
    assert any(not torch.equal(weights_other[k], w) for k, w in weights_alone.items())  # the two sets end apart
    for k, w in shared.model.state_dict().items():
        assert torch.equal(w, weights_alone[k]), k
