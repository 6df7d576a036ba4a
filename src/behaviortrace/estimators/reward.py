"""Log-only control: the rollout's logged total reward (task reward + bonus - penalty). No gradient, no
target. The bonus is the paid rollouts' defining mark, so this control finds it wherever the bonus is
larger than the task reward's spread; at step level its sum counts the bonuses a step paid."""

import numpy as np

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "sum"


def score(view, target):
    return view.rollouts["reward"].to_numpy().astype(np.float64)
