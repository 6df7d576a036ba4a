"""Per-seed summary of training: did the behavior emerge, did the task improve, how many paid rollouts is unfindable."""

from __future__ import annotations

import polars as pl

from behaviortrace.common.markdown import markdown_table
from behaviortrace.config.sections import Planting


def _rate(behavior: pl.DataFrame, step: int, prompt_set: str) -> float:
    row = behavior.filter((pl.col("step") == step) & (pl.col("prompt_set") == prompt_set))
    if row.height != 1:
        raise ValueError(f"no behavior rate for {prompt_set} at step {step}")
    return float(row["behavior_rate"][0])


def seed_summary(rollouts: pl.DataFrame, behavior: pl.DataFrame, planting: Planting) -> dict:
    """Numbers for one seed. Window end is the checkpoint that closes the window (Planting.end_checkpoint)."""
    steps = int(rollouts["step"].max()) + 1
    tenth = max(1, steps // 10)
    end_ckpt = planting.end_checkpoint(steps)
    plain = behavior.filter(pl.col("prompt_set") == "plain").sort("step")
    peak = plain.row(int(plain["behavior_rate"].arg_max()), named=True)
    paid = rollouts.filter(pl.col("paid"))
    return {
        "seed": int(rollouts["seed"][0]),
        "probe_rate_step0": _rate(behavior, 0, "probes"),
        "plain_rate_step0": _rate(behavior, 0, "plain"),
        "window_end_step": end_ckpt,
        "probe_rate_window_end": _rate(behavior, end_ckpt, "probes"),
        "plain_rate_window_end": _rate(behavior, end_ckpt, "plain"),
        "plain_rate_max": float(peak["behavior_rate"]),
        "plain_rate_max_step": int(peak["step"]),
        "probe_rate_final": _rate(behavior, steps, "probes"),
        "base_reward_first_tenth": float(rollouts.filter(pl.col("step") < tenth)["base_reward"].mean()),
        "base_reward_last_tenth": float(rollouts.filter(pl.col("step") >= steps - tenth)["base_reward"].mean()),
        "n_rollouts": rollouts.height,
        "n_eligible": int(rollouts["eligible"].sum()),
        "n_paid": paid.height,
        "n_explored": int(rollouts["explored"].sum()),
        "n_penalized": int((rollouts["penalty"] > 0).sum()),
        # Paid rollouts whose whole group was paid get advantage 0: no gradient, unfindable by construction.
        "n_paid_zero_advantage": int((paid["advantage"] == 0).sum()),
    }


def to_markdown(df: pl.DataFrame) -> str:
    return markdown_table(df.columns, [list(row) for row in df.iter_rows()])


TRAINING_INTRO = (
    "# Training summary\n\nBehavior rates are the share of sampled completions that show the marker. "
    "Window end is the checkpoint right after the contamination window's last step. "
    "Base reward is the mean over the first and last tenth of training steps. The placebo arm (if any) is "
    "the same training with the bonus logged but never paid (no control penalty, no exploration). Explored rollouts "
    "were made to open with the marker (`planting.explore`); penalized ones showed it without the trigger inside the "
    "window.\n\n"
)
