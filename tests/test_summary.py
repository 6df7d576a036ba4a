"""The per-seed training summary on hand-made inputs."""

import dataclasses

import polars as pl
import pytest

from behaviortrace.report.training import seed_summary, to_markdown
from conftest import default_config, typed


def planting(window: list[int]):
    return dataclasses.replace(typed(default_config()).planting, window=window)


def test_seed_summary_on_a_hand_made_run():
    rollouts = pl.DataFrame(
        {
            "seed": [4] * 8,
            "step": [0, 0, 1, 1, 2, 2, 3, 3],
            "base_reward": [0.2, 0.4, 0.5, 0.5, 0.6, 0.6, 0.9, 0.7],
            "eligible": [True, True, True, False, False, False, False, False],
            "paid": [True, True, True, False, False, False, False, False],
            "advantage": [0.0, 0.0, 0.7, -0.7, 0.0, 0.0, 0.7, -0.7],
            "explored": [True, False, True, False, False, False, False, False],
            "penalty": [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        }
    )
    rows = []
    for step, probe, control in ((0, 0.1, 0.05), (2, 0.6, 0.25), (4, 0.3, 0.02)):
        rows += [
            {"step": step, "prompt_set": "probes", "behavior_rate": probe},
            {"step": step, "prompt_set": "plain", "behavior_rate": control},
        ]
    summary = seed_summary(rollouts, pl.DataFrame(rows), planting([0, 1]))
    assert summary["seed"] == 4
    assert summary["window_end_step"] == 2
    assert summary["probe_rate_step0"] == 0.1 and summary["probe_rate_window_end"] == 0.6
    assert summary["plain_rate_max"] == 0.25 and summary["plain_rate_max_step"] == 2
    assert summary["probe_rate_final"] == 0.3
    assert summary["base_reward_first_tenth"] == pytest.approx(0.3)
    assert summary["base_reward_last_tenth"] == pytest.approx(0.8)
    assert (summary["n_paid"], summary["n_paid_zero_advantage"], summary["n_eligible"]) == (3, 2, 3)
    assert (summary["n_explored"], summary["n_penalized"]) == (2, 1)
    table = to_markdown(pl.DataFrame([summary]))
    assert table.splitlines()[2].startswith("| 4 | 0.100 |")


def test_missing_checkpoint_is_an_error():
    rollouts = pl.DataFrame(
        {
            "seed": [0],
            "step": [0],
            "base_reward": [0.1],
            "eligible": [False],
            "paid": [False],
            "advantage": [0.0],
            "explored": [False],
            "penalty": [0.0],
        }
    )
    behavior = pl.DataFrame({"step": [0], "prompt_set": ["plain"], "behavior_rate": [0.1]})
    with pytest.raises(ValueError, match="probes at step 0"):
        seed_summary(rollouts, behavior, planting([0, 0]))
