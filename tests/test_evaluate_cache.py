"""The evaluation's metric cache on a finished workflow run: a cached evaluation gives the table of an
uncached one, a changed score set is re-evaluated alone (and gives what a fresh evaluation gives), and a
change of config, code or shared input reuses nothing."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest
import yaml
from polars.testing import assert_frame_equal

from behaviortrace.evaluate import cache as metric_cache
from behaviortrace.jobs.evaluate import evaluate_job
from behaviortrace.score.contract import instances, score_keys
from conftest import typed

SEED, DRAW = 0, 0


@pytest.fixture()
def job(finished_run, tmp_path):
    """evaluate_job's inputs for seed 0, draw 0 of the finished run, with the score files copied (editable)."""
    workdir, _ = finished_run
    seed_dir = workdir / "results" / "wf" / f"planted{SEED}"
    config = typed(yaml.safe_load((workdir / "config.yaml").read_text()))  # as the workflow read it
    score_files = {}
    for name in sorted(p.name for p in (seed_dir / "scores").iterdir()):
        for table in sorted((seed_dir / "scores" / name).glob(f"draw{DRAW}_*.parquet")):
            if table.name.endswith("_steps.parquet"):
                continue
            target = table.stem.split("_", 1)[1]
            steps = table.with_name(f"{table.stem}_steps.parquet")
            copies = [tmp_path / "scores" / name / p.name for p in (table, steps)]
            for src, dst in zip((table, steps), copies, strict=True):
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, dst)
            score_files[(name, target)] = tuple(copies)
    # In the order the workflow gives them (SCORE_KEYS in common.smk).
    score_files = {key: score_files[key] for key in score_keys(config.estimators, config.evaluation.target_kinds)}

    def run(cache_dir, config=config, **overrides):
        kwargs = dict(
            seed=SEED,
            draw=DRAW,
            shards=sorted((seed_dir / "sketch").glob("shard*.zarr")),
            rollouts=seed_dir / "rollouts.parquet",
            rates=seed_dir / "targets" / f"draw{DRAW}_rates.parquet",
            token_cosines=seed_dir / "metrics" / f"draw{DRAW}_token_cosines.parquet",
            step_log=seed_dir / "steps.parquet",
            score_files=score_files,
            predicts_change=[n for n, i in instances(config.estimators).items() if i.predicts_change],
            out=tmp_path / "metrics.parquet",
            cache_dir=cache_dir,
        )
        kwargs.update(overrides)
        return evaluate_job(config, **kwargs)

    return {"run": run, "score_files": score_files, "workflow_table": seed_dir / "metrics" / f"draw{DRAW}.parquet"}


def test_a_cached_evaluation_gives_the_uncached_table(job, tmp_path):
    uncached, n_cached = job["run"](None)
    assert n_cached == 0
    assert_frame_equal(uncached, pl.read_parquet(job["workflow_table"]))  # what the workflow wrote
    first, n_first = job["run"](tmp_path / "cache")
    again, n_again = job["run"](tmp_path / "cache")
    assert n_first == 0 and n_again == len(job["score_files"])
    assert_frame_equal(first, uncached)
    assert_frame_equal(again, uncached)


def test_a_changed_score_set_alone_is_evaluated_again(job, tmp_path):
    job["run"](tmp_path / "cache")
    rollout_scores, _ = job["score_files"][("gas", "in_context")]
    table = pl.read_parquet(rollout_scores)
    table.with_columns(score=-pl.col("score")).write_parquet(rollout_scores)
    cached, n_cached = job["run"](tmp_path / "cache")
    assert n_cached == len(job["score_files"]) - 1
    fresh, _ = job["run"](None)
    assert_frame_equal(cached, fresh)
    gas = fresh.filter((pl.col("estimator") == "gas") & (pl.col("target") == "in_context"))
    before = pl.read_parquet(job["workflow_table"]).filter(
        (pl.col("estimator") == "gas") & (pl.col("target") == "in_context")
    )
    assert not np.allclose(gas["value"].to_numpy(), before["value"].to_numpy(), equal_nan=True)


def test_config_code_and_shared_inputs_are_part_of_the_key(job, tmp_path, finished_run, monkeypatch):
    workdir, _ = finished_run
    cfg = yaml.safe_load((workdir / "config.yaml").read_text())
    job["run"](tmp_path / "cache")
    changed = typed({**cfg, "evaluation": {**cfg["evaluation"], "bootstrap": 20}})
    assert job["run"](tmp_path / "cache", config=changed)[1] == 0
    job["run"](tmp_path / "cache")
    real = metric_cache.code_digest
    monkeypatch.setattr(metric_cache, "code_digest", lambda paths: real(paths) + "edited")
    assert job["run"](tmp_path / "cache")[1] == 0
    monkeypatch.undo()
    job["run"](tmp_path / "cache")
    assert job["run"](tmp_path / "cache", draw=1)[1] == 0  # another cell seed: nothing shared
    job["run"](tmp_path / "cache")
    steps = pl.read_parquet(finished_run[0] / "results" / "wf" / f"planted{SEED}" / "steps.parquet")
    edited = tmp_path / "steps.parquet"
    steps.with_columns(target_change=pl.col("target_change") * 2).write_parquet(edited)
    assert job["run"](tmp_path / "cache", step_log=edited)[1] == 0  # the measured effect is a shared input
