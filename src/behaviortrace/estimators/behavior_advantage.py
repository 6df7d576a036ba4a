"""Log-only control: the advantage where the completion shows the planted behavior, else 0. No gradient,
no target.

It is the sign and size of the push GRPO gave the behavior's tokens in that rollout, read off the log:
what a gradient estimator scored against a behavior target reduces to when its only signal is "these
tokens were rewarded". At step level its sum is the net advantage a step put on the behavior."""

import numpy as np

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "sum"


def score(view, target):
    rows = view.rollouts
    return np.where(rows["behavior"].to_numpy(), rows["advantage"].to_numpy(), 0.0).astype(np.float64)
