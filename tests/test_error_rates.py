"""The checklist's rules have the error rates they claim, by simulation through their own code
(report/error_rates.py), and docs/evaluation.md shows the table the diagnostic writes."""

from __future__ import annotations

import math
import re

import pytest

from behaviortrace.report import error_rates as E
from conftest import ROOT

TRIALS = 2000


def _slack(p: float) -> float:
    """Three binomial standard errors of a rate p over TRIALS trials."""
    return 3 * math.sqrt(max(p, 1e-3) * (1 - p) / TRIALS)


@pytest.fixture(scope="module")
def simulated():
    sizes = E.Sizes()
    return sizes, {row["kind"].split(" (")[0]: row for row in E.rates(sizes, TRIALS, seed=1)}


def test_a_null_method_passes_no_more_often_than_claimed(simulated):
    """At the least favourable null (one cell at the bar, the rest far past it) a row's pass hangs on one cell's
    test: 2.5% for an interval, 1 / (R + 1) for the replay's R random sets (0.25 at R = 3: that item's pass is weak
    evidence, and the table says so)."""
    sizes, rows = simulated
    for kind in ("threshold with interval", "paired comparison with a control",
                 "Holm tests against a null, pass by equivalence"):  # fmt: skip
        assert rows[kind]["false_pass"] <= 0.025 + _slack(0.025), kind
    chance = 1 / (sizes.repeats + 1)  # below all R random sets in the one exchangeable cell, by chance
    replay = rows["replay against step-matched random sets"]["false_pass"]
    assert abs(replay - chance) <= 2 * _slack(chance), replay  # it is that large, not smaller


def test_the_dense_endpoint_has_its_error_rates_through_its_own_statistic(simulated):
    """A method whose agreement with I equals the strongest log-only control's passes at most as often as one
    one-sided 2.5% test (both levels must pass); never FAILs at its bar; one 0.2 above it passes most of the time
    even at 40 groups per seed (the default run has 320)."""
    sizes, rows = simulated
    dense = rows["dense endpoint's margins"]
    trials = TRIALS // 20
    assert dense["false_pass"] <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / trials)
    assert dense["false_fail"] <= 3 * math.sqrt(0.01 * 0.99 / trials)
    assert dense["power"] >= 0.5


def test_a_method_at_its_bar_fails_no_more_often_than_alpha(simulated):
    sizes, rows = simulated
    per_row = [r["false_fail"] for k, r in rows.items() if not k.startswith("every")]
    assert all(rate <= sizes.alpha * 0.1 + _slack(0.0) for rate in per_row), per_row  # a row is a small part of m
    family = rows["every method test of the checklist at its bar"]["effect"]
    anywhere = float(re.search(r"any FAIL: ([0-9.]+)", family)[1])
    assert anywhere <= sizes.alpha + _slack(sizes.alpha)


def test_the_rules_have_power_at_the_stated_effects(simulated):
    _, rows = simulated
    assert rows["threshold with interval"]["power"] >= 0.6
    assert rows["paired comparison with a control"]["power"] >= 0.9
    unpaired = float(re.search(r"replaced: ([0-9.]+)", rows["paired comparison with a control"]["effect"])[1])
    assert unpaired < 0.2  # the non-overlap rule finds almost none of what the paired difference finds
    assert rows["Holm tests against a null, pass by equivalence"]["power"] >= 0.9
    assert rows["replay against step-matched random sets"]["power"] >= 0.7


def test_the_documented_table_is_what_the_diagnostic_writes():
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    block = re.search(r"<!-- error-rates:start -->\n(.*?)<!-- error-rates:end -->", doc, re.S)[1]
    given = re.search(r"Sizes: (.*?); (\d+) trials, seed (\d+)", block)
    values = dict(part.split(" ") for part in given[1].split(", "))
    sizes = E.Sizes(**{k: (float(v) if k == "alpha" else int(v)) for k, v in values.items()})
    trials, seed = int(given[2]), int(given[3])
    assert block == E.markdown(sizes, E.rates(sizes, trials, seed), trials, seed)
