"""Holm's step-down rule, for checklist items judged on many cells at once.

An item that passes only when no seed or draw departs from a null (the random control at chance, no
enrichment in the placebo) would fail by chance alone ever more often as cells are added: at 95% per
check, 18 independent checks all hold only 40% of the time. Such items test every check at once with
Holm's procedure, which keeps the chance of any false rejection at `alpha` under any dependence between
cells. Items that pass only when every cell rejects (beats a control on every seed and draw) are
intersection-union tests and keep their level without a correction. The p-values themselves come from the
evaluation (evaluate/metrics.py: tests against a random ordering of the rows or steps).
"""

from __future__ import annotations

import math


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise error `alpha` (NaN: never)."""
    order = sorted(range(len(p_values)), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if math.isnan(p_values[i]) or p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected
