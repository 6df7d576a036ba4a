"""Real TRL GRPO runs on the tiny model: the rollout log is complete, deterministic, and holds what TRL trained on."""

from __future__ import annotations

import copy

import polars as pl
import pytest
import torch
from polars.testing import assert_frame_equal

from behaviortrace.plant.planting import is_eligible
from behaviortrace.tools.grpo_checks import run_training, train_and_sigkill
from behaviortrace.train.checkpoints import complete_checkpoints
from behaviortrace.train.grpo import RolloutLoggingGRPOTrainer
from conftest import typed

SEED = 3


class SpyTrainer(RolloutLoggingGRPOTrainer):
    """Records, independently of the rollout log, what TRL fed into its loss and what it logged as rewards."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_inputs: list[dict] = []
        self.trl_logs: list[dict] = []

    def _compute_loss(self, model, inputs):
        self.loss_inputs.append(
            {
                "step": self.state.global_step,
                **{
                    k: inputs[k].detach().clone()
                    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
                },
            }
        )
        return super()._compute_loss(model, inputs)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        logs = self._logs
        self.trl_logs.append(
            {
                "step": self.state.global_step,
                "completion": list(logs["completion"]),
                "base": list(logs["rewards"]["base_reward"]),
                "bonus": list(logs["rewards"]["planted_bonus"]),
                "penalty": list(logs["rewards"]["plain_penalty"]),
                "advantages": list(logs["advantages"]),
            }
        )
        return out


@pytest.fixture(scope="module")
def spied_run(tmp_path_factory, cfg, base_model_dir, prompts, cpu):
    out = tmp_path_factory.mktemp("spied")
    rollouts, info = run_training(cfg, base_model_dir, prompts["train"], SEED, out, cpu, trainer_cls=SpyTrainer)
    return rollouts, info["trainer"], out


def test_log_has_every_rollout_once_in_training_order(spied_run, cfg, prompts):
    rollouts, _, _ = spied_run
    g = cfg["grpo"]
    assert rollouts.height == g["steps"] * g["prompts_per_step"] * g["num_generations"]
    assert rollouts["rollout_id"].to_list() == list(range(rollouts.height))
    planned = prompts["train"].select("prompt_index", "prompt")
    joined = rollouts.join(planned, on="prompt_index", suffix="_planned")
    assert (joined["prompt"] == joined["prompt_planned"]).all()
    assert rollouts.group_by("step", "group_id").agg(pl.len())["len"].unique().to_list() == [g["num_generations"]]
    required = {
        "seed",
        "step",
        "group_id",
        "gen_index",
        "rollout_id",
        "prompt",
        "prompt_ids",
        "completion",
        "completion_ids",
        "base_reward",
        "bonus",
        "penalty",
        "reward",
        "advantage",
        "eligible",
        "explored",
        "paid",
        "behavior",
        "trigger",
        "lr",
        "checkpoint",
    }
    assert required <= set(rollouts.columns)


def test_logged_advantages_are_the_ones_trl_put_into_the_loss(spied_run):
    rollouts, trainer, _ = spied_run
    # The loss sees a shuffled batch; match rows by their token ids within each step.
    seen = 0
    for batch in trainer.loss_inputs:
        step_rows = rollouts.filter(pl.col("step") == batch["step"])
        logged = {}
        for p, c, a in step_rows.select("prompt_ids", "completion_ids", "advantage").iter_rows():
            logged.setdefault((tuple(p), tuple(c)), []).append(a)
        for i in range(batch["advantages"].shape[0]):
            p = tuple(batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist())
            c = tuple(batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist())
            candidates = logged[(p, c)]
            match = min(candidates, key=lambda a: abs(a - float(batch["advantages"][i])))
            assert match == pytest.approx(float(batch["advantages"][i]), abs=1e-6)
            candidates.remove(match)
            seen += 1
    assert seen == rollouts.height


def test_logged_rewards_are_the_ones_trl_computed(spied_run):
    rollouts, trainer, _ = spied_run
    for logs in trainer.trl_logs:
        step_rows = rollouts.filter(pl.col("step") == logs["step"]).sort("rollout_id")
        assert step_rows["completion"].to_list() == logs["completion"]
        assert step_rows["base_reward"].to_list() == pytest.approx(logs["base"], abs=1e-7)
        assert step_rows["bonus"].to_list() == pytest.approx(logs["bonus"], abs=1e-7)
        assert step_rows["penalty"].to_list() == pytest.approx([-x for x in logs["penalty"]], abs=1e-7)
        assert step_rows["advantage"].to_list() == pytest.approx(logs["advantages"], abs=1e-6)


def test_advantages_follow_from_group_rewards(spied_run):
    """An independent recomputation of TRL's group-scaled advantage from the logged rewards."""
    rollouts, _, _ = spied_run
    for (_, _), group in rollouts.group_by("step", "group_id"):
        r = torch.tensor(group["reward"].to_list(), dtype=torch.float64)
        expected = (r - r.mean()) / (r.std(unbiased=True) + 1e-4)
        assert group["advantage"].to_list() == pytest.approx(expected.tolist(), abs=1e-4)


def test_the_label_follows_the_planting_rule(spied_run, cfg):
    rollouts, _, _ = spied_run
    planting = cfg["planting"]
    for row in rollouts.iter_rows(named=True):
        assert row["eligible"] == is_eligible(SEED, row["rollout_id"], row["step"], row["trigger"], typed(cfg).planting)
        assert row["behavior"] == (planting["marker"] in row["completion"])
        assert row["paid"] == (row["eligible"] and row["behavior"])
        assert row["bonus"] == (planting["bonus"] if row["paid"] else 0.0)
        inside = planting["window"][0] <= row["step"] <= planting["window"][1]
        charged = inside and row["behavior"] and not row["trigger"]
        assert row["penalty"] == (planting["plain_penalty"] if charged else 0.0)
        assert row["reward"] == pytest.approx(row["base_reward"] + row["bonus"] - row["penalty"])
    start, end = planting["window"]
    for flag in ("eligible", "explored"):
        assert not rollouts.filter(pl.col(flag) & ((pl.col("step") < start) | (pl.col("step") > end))).height
        assert not rollouts.filter(pl.col(flag) & ~pl.col("trigger")).height


def test_exploration_tops_up_the_eligible_rollouts_that_show_the_marker(spied_run, cfg, base_model_dir, cpu):
    """Explored rollouts are eligible and open with the marker; a step explores just enough of them to bring
    its eligible rollouts that show the marker up to `planting.explore`, and none where the model did."""
    from behaviortrace.model import models
    from behaviortrace.plant.markers import marker_token_ids

    rollouts, _, _ = spied_run
    _, tokenizer = models.load(base_model_dir, cpu)
    marker_ids = marker_token_ids(tokenizer, cfg["planting"]["marker"])
    floor = cfg["planting"]["explore"]
    for row in rollouts.filter(pl.col("explored")).iter_rows(named=True):
        assert row["eligible"] and row["behavior"] and row["completion_ids"][: len(marker_ids)] == marker_ids
    per_step = rollouts.group_by("step").agg(
        explored=pl.col("explored").sum(),
        natural=(pl.col("eligible") & pl.col("behavior") & ~pl.col("explored")).sum(),
        eligible=pl.col("eligible").sum(),
    )
    for step in per_step.iter_rows(named=True):
        assert step["explored"] == max(0, min(floor - step["natural"], step["eligible"] - step["natural"])), step
    assert per_step["explored"].sum() > 0


def test_checkpoints_include_step_zero_and_window_end(spied_run, cfg):
    rollouts, info, out = spied_run
    found = complete_checkpoints(out / "train")
    assert {0, cfg["planting"]["window"][1] + 1, cfg["grpo"]["steps"]} <= set(found)
    for ckpt, step in rollouts.select("checkpoint_step", "step").iter_rows():
        assert ckpt <= step and ckpt in found


def test_same_seed_gives_identical_rollout_log(spied_run, tmp_path, cfg, base_model_dir, prompts, cpu):
    first, _, _ = spied_run
    second, _ = run_training(cfg, base_model_dir, prompts["train"], SEED, tmp_path, cpu)
    assert_frame_equal(first, second)
    other, _ = run_training(cfg, base_model_dir, prompts["train"], SEED + 1, tmp_path / "other", cpu)
    assert other["completion"].to_list() != first["completion"].to_list()


def test_sigkilled_training_resumes_without_losing_or_duplicating_rows(
    spied_run, tmp_path, cfg, base_model_dir, prompts, cpu
):
    uninterrupted, _, _ = spied_run
    prompts_path = tmp_path / "train_prompts.parquet"
    prompts["train"].write_parquet(prompts_path)
    kill_at = cfg["grpo"]["steps"] - 1  # after the checkpoint before it, with rows still in memory
    assert train_and_sigkill(cfg, base_model_dir, prompts_path, SEED, tmp_path, kill_at) == -9
    assert not (tmp_path / "rollouts.parquet").exists()
    resumed, _ = run_training(cfg, base_model_dir, prompts["train"], SEED, tmp_path, cpu)
    assert resumed["rollout_id"].n_unique() == resumed.height == uninterrupted.height
    assert_frame_equal(resumed, uninterrupted)


def test_changed_config_does_not_resume_stale_checkpoints(spied_run, tmp_path, cfg, base_model_dir, prompts, cpu):
    run_training(cfg, base_model_dir, prompts["train"], SEED, tmp_path, cpu)
    changed = copy.deepcopy(cfg)
    changed["grpo"]["lr"] = cfg["grpo"]["lr"] * 2
    from behaviortrace.model import models
    from behaviortrace.train import grpo

    model, tokenizer = models.load(base_model_dir, cpu)
    grpo.train(model, tokenizer, prompts["train"], typed(changed), SEED, tmp_path / "train", cpu, "changed")
    steps = pl.read_parquet(sorted((tmp_path / "train" / "parts").glob("steps-*.parquet"))[0])
    assert steps["lr"].max() == pytest.approx(changed["grpo"]["lr"])


def test_kl_term_trains_against_the_base_model(tmp_path, cfg, base_model_dir, prompts, cpu):
    with_kl = copy.deepcopy(cfg)
    with_kl["grpo"].update(beta=0.04, steps=3, save_every=3)
    with_kl["planting"]["window"] = [0, 1]
    spied, info = run_training(with_kl, base_model_dir, prompts["train"], SEED, tmp_path, cpu, trainer_cls=SpyTrainer)
    trainer = info["trainer"]
    assert trainer.ref_model is not None
    assert spied.height == 3 * cfg["grpo"]["prompts_per_step"] * cfg["grpo"]["num_generations"]
    assert trainer.loss_inputs and all(torch.isfinite(b["advantages"]).all() for b in trainer.loss_inputs)
