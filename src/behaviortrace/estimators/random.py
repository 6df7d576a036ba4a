"""The chance control: uniform random scores, seeded from config and the training seed of the view
(so that each seed gets its own draw)."""

import numpy as np

USES_TARGET = False
STEP_AGGREGATE = "mean"


def score(view, target, seed: int = 0):
    rng = np.random.default_rng([seed, int(view.rollouts["seed"][0]), view.rollouts.height])
    return rng.random(view.rollouts.height)
