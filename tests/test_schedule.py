"""Which jobs a leave-out replay waits on (replay/schedule.py), on the default config."""

import pytest

from behaviortrace.replay import schedule
from behaviortrace.score.contract import instances
from conftest import default_config, typed


@pytest.fixture(scope="module")
def plan():
    cfg = typed(default_config())
    return cfg.replay, cfg.seeds, instances(cfg.estimators)


def feeds(plan, **job):
    replay, seeds, estimators = plan
    return schedule.feeds_replay(job, replay, seeds, estimators)


def test_replays_of_estimators_go_first_and_builtin_ones_fill_the_gaps():
    assert schedule.replay_priority("trak") == schedule.PRIORITY
    assert all(schedule.replay_priority(m) == 0 for m in schedule.BUILTIN)


def test_the_jobs_on_a_replayed_estimators_path_get_the_replay_priority(plan):
    replay, seeds, estimators = plan
    assert "trak" in replay.estimators and estimators["trak"].prepares and replay.target_kind == "in_context"
    high = schedule.PRIORITY
    # sketch_gram: trak (replayed) prepares from it.
    assert feeds(plan, arm="planted", seed="0") == high
    # The score job of a replayed estimator (every draw and target kind, the ranking one among them).
    assert feeds(plan, arm="planted", seed="1", estimator="trak") == high
    # A target-free control is ranked by its one undrawn score file, which its score job writes.
    assert "norm" in replay.estimators and not estimators["norm"].uses_target
    assert feeds(plan, arm="planted", seed="2", estimator="norm") == high


def test_other_jobs_keep_the_default_priority(plan):
    replay, seeds, estimators = plan
    assert "random" not in replay.estimators
    assert feeds(plan, arm="planted", seed="0", estimator="random") == 0
    # The placebo arm and seeds that are not planted are never replayed.
    assert feeds(plan, arm="placebo", seed="0", estimator="trak") == 0
    assert feeds(plan, arm="placebo", seed="0") == 0
    assert feeds(plan, arm="planted", seed=str(max(seeds) + 1), estimator="trak") == 0


def test_without_a_replayed_estimator_that_prepares_the_gram_job_waits(plan):
    replay, seeds, estimators = plan
    import dataclasses

    no_trak = dataclasses.replace(replay, estimators=[m for m in replay.estimators if not estimators[m].prepares])
    assert schedule.feeds_replay({"arm": "planted", "seed": "0"}, no_trak, seeds, estimators) == 0
