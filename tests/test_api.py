"""The Python API (docs/api.md): a GRPO run of your own, from a plain script with TRL's GRPOTrainer and no Snakemake,
captured with `Capture` and scored with `Run`, gives the workflow's scores on the same run."""

import ast
import copy
import sys

import numpy as np
import polars as pl
import pytest
import yaml

from background import Command
from behaviortrace.score import contract
from conftest import ROOT, background, small_config, snakemake_argv, waited

EXAMPLE = ROOT / "examples" / "own_grpo_run.py"
# The estimators the example scores with (its ESTIMATORS, read without running it).
ESTIMATORS = next(
    ast.literal_eval(node.value)
    for node in ast.parse(EXAMPLE.read_text()).body
    if isinstance(node, ast.Assign) and node.targets[0].id == "ESTIMATORS"
)

RUN = "api"
# The workflow's jobs run on one thread, BLAS's included (Snakemake sets OMP_NUM_THREADS and the like to a job's
# threads); the same sums in another order differ in their last bits.
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def api_config() -> dict:
    """The small config with no planted exploration (TRL's own GRPOTrainer has no hook to force it), in the smooth
    regime (AdamW's epsilon 1e-3, no clipping: docs/influence.md), where the exact influence is the LDS's positive
    control, and with a few LDS subsets and no finite-difference checks in the workflow's influence job."""
    cfg = copy.deepcopy(small_config())
    cfg["run"] = RUN
    cfg["planting"].update(explore=0, fraction=1.0)
    cfg["grpo"].update(adam_epsilon=1e-3, max_grad_norm=1e9)
    cfg["influence"].update(lds_subsets=8, lds_levels=["rollout"], fd_rollouts=0, lds_both_semantics=False)
    return cfg


def workflow_score(estimator: str) -> str:
    target = "forced" if contract.Instance.of(estimator, {}).uses_target else "none"
    return f"results/{RUN}/planted0/scores/{estimator}/draw0_{target}.parquet"


@background("both_runs", nice=5)
def api_runs(folder):
    """The workflow's run of seed 0 as far as its score files, and the example script's own run beside it."""
    workdir = folder / "run"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(api_config()))
    influence = [f"results/{RUN}/planted0/influence/{name}.parquet" for name in ("rollouts", "retrain")]
    targets = [f"results/{RUN}/config.yaml", *map(workflow_score, ESTIMATORS), *influence]
    example = [sys.executable, str(EXAMPLE), str(workdir / "results" / RUN), str(workdir / "own"), "--influence"]
    return [
        Command(snakemake_argv(workdir, *targets), str(workdir)),
        Command(example, str(workdir), env=ONE_THREAD, stdout="example.out"),
    ]


@pytest.fixture(scope="module")
def both_runs(request):
    folder = waited(request.config, "both_runs")
    return folder / "run", folder / "run" / "own", (folder / "example.out").read_text()


def test_a_plain_script_run_captured_and_scored_through_the_api_gives_the_workflows_scores(both_runs):
    workdir, own, printed = both_runs
    theirs = pl.read_parquet(workdir / "results" / RUN / "planted0" / "rollouts.parquet")
    ours = pl.read_parquet(own / "capture" / "rollouts.parquet")
    assert ours.height == theirs.height == 6 * 12
    for column in ("rollout_id", "step", "group_id", "completion_ids", "reward", "advantage", "paid", "behavior"):
        assert ours[column].to_list() == theirs[column].to_list(), column
    assert ours["paid"].any() and not ours["paid"].all()  # the label is read from the planted bonus
    for estimator in ESTIMATORS:
        expected = pl.read_parquet(workdir / workflow_score(estimator))
        got = pl.read_parquet(own / "scores" / f"{estimator}.parquet")
        assert got["rollout_id"].to_list() == expected["rollout_id"].to_list(), estimator
        assert np.array_equal(got["score"].to_numpy(), expected["score"].to_numpy()), estimator
        assert expected["score"].n_unique() > 1, estimator  # no constant that any run would match
    assert "rollouts" in printed and "scored" in printed


def test_a_target_of_completions_that_spell_the_behavior_is_the_forced_target(both_runs):
    """Two routes to one gradient: the behavior's log-prob after each probe, and each (probe, behavior) pair as a
    completion of its own."""
    from behaviortrace.api import Run

    workdir, own, _ = both_runs
    run = Run(own / "capture")
    probes = pl.read_parquet(workdir / "results" / RUN / "data" / "probe_prompts.parquet")["prompt"].to_list()
    marker = run.cfg.planting.marker
    forced = run.target("forced", behavior=marker, prompts=probes)
    spelled = run.target("spelled", completions=[(p, marker) for p in probes])
    assert np.array_equal(spelled.vectors, forced.vectors) and np.array_equal(spelled.n, forced.n)
    assert list(forced.checkpoint_steps) == sorted(run.checkpoints) and (np.abs(forced.vectors).sum(1) > 0).all()
    other = run.target("other", completions=[(p, "1 2 3") for p in probes])
    assert not np.allclose(other.vectors, forced.vectors)


def test_the_api_refuses_what_it_cannot_score_naming_the_setting(both_runs):
    from behaviortrace.api import Run

    run = Run(both_runs[1] / "capture")
    target = run.target("forced", behavior=run.cfg.planting.marker, prompts=["x"])
    with pytest.raises(ValueError, match=r"estimators\.trak\.bogus"):
        run.score("trak", target, bogus=1)
    with pytest.raises(ValueError, match="ekfac needs a target"):
        run.score("ekfac")
    with pytest.raises(ValueError, match="behavior= with prompts=, or completions="):
        run.target("neither")
    with pytest.raises(FileNotFoundError, match="no finished capture"):
        Run(both_runs[0])


def test_capture_refuses_a_trainer_it_cannot_follow_before_training(base_model_dir, cpu, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from behaviortrace.api import Capture
    from behaviortrace.model import models

    model, tokenizer = models.load(base_model_dir, cpu)
    args = GRPOConfig(
        output_dir=str(tmp_path / "train"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        num_iterations=2,
        loss_type="cispo",
        use_cpu=True,
        bf16=False,
        report_to="none",
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["3 1 2"] * 8}),
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
    )
    with pytest.raises(ValueError) as refused:
        Capture(tmp_path / "capture", behavior="x", label_reward="bonus").attach(trainer)
    for named in ("GRPOConfig.num_iterations = 2", "GRPOConfig.loss_type = 'cispo'", "label_reward 'bonus'"):
        assert named in str(refused.value)
    assert not (tmp_path / "capture").exists()


def test_the_exact_influence_and_the_lds_through_the_api_are_the_workflows_on_the_same_run(both_runs):
    from behaviortrace.api import Run

    workdir, own, _ = both_runs
    seed_dir = workdir / "results" / RUN / "planted0"
    run = Run(own / "capture")
    probes = pl.read_parquet(workdir / "results" / RUN / "data" / "probe_prompts.parquet")["prompt"].to_list()
    marker, end = run.cfg.planting.marker, 3  # influence.measure_at window_end: the window is steps 0..2
    table, checks = run.influence(marker, probes, end=end)
    theirs = pl.read_parquet(seed_dir / "influence" / "rollouts.parquet")
    assert table["rollout_id"].to_list() == theirs["rollout_id"].to_list()
    for column in ("influence", "influence_advantages", "influence_held"):
        assert np.array_equal(table[column].to_numpy(), theirs[column].to_numpy()), column
    assert table.equals(pl.read_parquet(own / "influence.parquet"))  # the example's, to the workflow's T
    assert checks["step"].to_list() == [2, 3]  # the replay passes the checkpoints of steps 2 and 3
    retrained = pl.read_parquet(seed_dir / "influence" / "retrain.parquet").filter(pl.col("kind") == "lds")
    removed = [set(ids) for ids in retrained["removed_ids"].to_list()]
    noise = table.with_columns(influence=pl.Series(np.random.default_rng(0).normal(size=table.height)))
    lds, sets = run.lds({"exact": table, "random": noise}, marker, probes, removed=removed, end=end, bootstrap=200)
    assert np.array_equal(sets["f"].to_numpy(), retrained["f"].to_numpy())
    # The positive control: in the smooth regime I predicts its own retraining; a random score does not.
    exact, random = (lds.row(by_predicate=pl.col("name") == name, named=True) for name in ("exact", "random"))
    assert exact["low"] > 0 and exact["lds"] > random["lds"], (exact, random)
