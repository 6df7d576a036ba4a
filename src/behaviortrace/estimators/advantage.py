"""Log-only control: the rollout's logged GRPO advantage. No gradient, no target.

The bonus makes a paid rollout the highest reward of its prompt group, so this look-up of the rollout
log ranks the paid rollouts first inside every group by construction. An attribution score that does no
better knows nothing the reward log does not. At step level its sum is zero (GRPO centers advantages
within each group), so it ranks steps by rounding noise: chance.
"""

import numpy as np

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "sum"


def score(view, target):
    return view.rollouts["advantage"].to_numpy().astype(np.float64)
