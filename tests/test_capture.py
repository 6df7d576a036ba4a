"""Train-time capture (sketch.mode: train) on a real TRL run of the tiny model: each rollout's sketch against
its own autograd gradient at the exact weights of its step, the training left as it was, every step checked
against TRL's gradient, agreement with checkpoint sketching where the two use the same weights, resuming."""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import pytest
import torch
from polars.testing import assert_frame_equal

from behaviortrace.jobs.sketch import sketch_job
from behaviortrace.model import models
from behaviortrace.sketch.sketcher import check_step_sum
from behaviortrace.sketch.store import read_rows, read_steps
from behaviortrace.tools.grpo_checks import WeightSpy, autograd_sketches, run_training, train_and_sigkill
from behaviortrace.train.checkpoints import read_manifest
from conftest import typed
from tolerance import within

CAPTURE_SHARDS = ("shard000.zarr", "shard001.zarr")


@pytest.fixture(scope="module")
def captured_run(tmp_path_factory, cfg, base_model_dir, prompts, cpu):
    out = tmp_path_factory.mktemp("captured_run")
    rollouts, info = run_training(
        cfg, base_model_dir, prompts["train"], 0, out, cpu, capture=True, trainer_cls=WeightSpy
    )
    stores = [out / "train" / "capture" / name for name in CAPTURE_SHARDS]
    return {"dir": out, "rollouts": rollouts, "weights": info["trainer"].step_weights, "stores": stores}


@pytest.mark.parametrize("step", [1, 2, 5])
def test_captured_sketches_are_each_rollouts_own_gradient_at_its_steps_weights(
    step, captured_run, cfg, base_model_dir, cpu
):
    """Steps 1 and 5 lie between saved checkpoints (0, 2, 3, 4, 6): only capture sees their weights."""
    want, norms, stored, rows = autograd_sketches(
        captured_run["dir"], captured_run["stores"], captured_run["weights"][step], step, base_model_dir, cfg, cpu
    )
    for i in range(len(want)):
        assert np.allclose(stored["sketch"][i], want[i], rtol=1e-4, atol=1e-4 * np.abs(want[i]).max())
        assert stored["norm"][i] == pytest.approx(norms[i], rel=1e-4)
    # The checkpoint that sketching from checkpoints would use, as the rollout log says.
    assert np.array_equal(stored["checkpoint_step"], rows["checkpoint_step"].to_numpy())


def test_capture_leaves_the_training_as_it_was(captured_run, small_run, cpu):
    """Same config and seed as the uncaptured small run: the same rollouts and the same final weights."""
    assert_frame_equal(captured_run["rollouts"], small_run["rollouts"])
    final = f"checkpoint-{small_run['cfg']['grpo']['steps']}"
    with_capture = dict(models.load(captured_run["dir"] / "train" / final, cpu)[0].named_parameters())
    for name, p in models.load(small_run["dir"] / "train" / final, cpu)[0].named_parameters():
        assert torch.equal(p, with_capture[name]), name


def test_every_step_is_checked_against_the_gradient_trl_applied(captured_run):
    steps = read_steps(captured_run["stores"])
    logged = pl.read_parquet(captured_run["dir"] / "steps.parquet").sort("step")
    assert steps["step"].to_list() == logged["step"].to_list()
    errors = steps["self_check_error"].to_numpy()
    assert np.isfinite(errors).all() and within(errors.max(), 1e-5)
    for name in ("lr", "clip_coef", "grad_norm"):
        assert np.allclose(steps[name].to_numpy(), logged[name].to_numpy(), rtol=1e-12), name
    _, attrs = read_rows([captured_run["stores"][0]], with_sketches=False)
    assert attrs["mode"] == "train" and attrs["self_check_error"] == pytest.approx(errors[:3].max())


def test_sketching_from_checkpoints_agrees_where_it_uses_the_same_weights(
    captured_run, cfg, base_model_dir, cpu, tmp_path
):
    """At saved steps (0, 2, 4) the checkpoint is the step's weights: the two modes must agree. Elsewhere the
    checkpoint is a step behind, and they must not (or this test could not tell them apart)."""
    run = captured_run["dir"]
    config = typed(cfg)
    checkpoint_mode = []
    for shard in range(2):
        out = tmp_path / f"shard{shard:03d}.zarr"
        sketch_job(
            config,
            shard=shard,
            rollouts_path=run / "rollouts.parquet",
            steps_path=run / "steps.parquet",
            checkpoints_path=run / "checkpoints.json",
            base_model=base_model_dir,
            out=out,
        )
        checkpoint_mode.append(out)
    ckpt, _ = read_rows(checkpoint_mode)
    train, _ = read_rows(captured_run["stores"])
    assert np.array_equal(ckpt["rollout_id"], train["rollout_id"])
    saved = set(read_manifest(run / "checkpoints.json")[0])
    for step in range(cfg["grpo"]["steps"]):
        at = train["step"] == step
        a, b = ckpt["sketch"][at], train["sketch"][at]
        same = np.allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max())
        assert same == (step in saved), step
        assert np.allclose(ckpt["norm"][at], train["norm"][at], rtol=1e-4) == (step in saved), step
        if step in saved:  # fluency read off TRL's loss pass against the sketcher's own forward pass
            assert np.allclose(ckpt["fluency"][at], train["fluency"][at], rtol=1e-5, atol=1e-6), step
            for name in ("behavior_sketch", "null_sketch", "has_marker"):
                assert np.allclose(ckpt[name][at], train[name][at], rtol=1e-4, atol=1e-6), (step, name)


def test_a_killed_captured_run_resumes_to_the_same_stores(captured_run, cfg, base_model_dir, prompts, cpu, tmp_path):
    prompts_path = tmp_path / "train_prompts.parquet"
    prompts["train"].write_parquet(prompts_path)
    # Killed after step 4: shard 0 (steps 0-2) finished, shard 1 partial; training resumes from checkpoint 4.
    assert train_and_sigkill(cfg, base_model_dir, prompts_path, 0, tmp_path, kill_at=5, capture=True) == -9
    capture = tmp_path / "train" / "capture"
    assert (capture / "shard000.zarr").exists() and (capture / "shard001.zarr.partial").exists()
    run_training(cfg, base_model_dir, prompts["train"], 0, tmp_path, cpu, capture=True)
    resumed, _ = read_rows([capture / name for name in CAPTURE_SHARDS])
    uninterrupted, _ = read_rows(captured_run["stores"])
    for name, values in uninterrupted.items():
        assert np.allclose(resumed[name], values, rtol=1e-6, atol=1e-9), name


def test_publishing_links_the_store_and_copies_it_where_links_fail(captured_run, tmp_path, monkeypatch):
    from behaviortrace.sketch import capture

    folder = captured_run["dir"] / "train" / "capture"
    linked = tmp_path / "linked.zarr"
    capture.publish(folder, 0, linked)
    files = [p for p in linked.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_nlink >= 2 for p in files)

    def no_links(src, dst):
        raise OSError("cross-device link")

    monkeypatch.setattr(capture.os, "link", no_links)
    copied = tmp_path / "copied.zarr"
    capture.publish(folder, 0, copied)
    assert all(p.stat().st_nlink == 1 for p in copied.rglob("*") if p.is_file())
    a, _ = read_rows([copied])
    b, _ = read_rows([captured_run["stores"][0]])
    assert all(np.array_equal(a[name], b[name]) for name in b)
    with pytest.raises(FileNotFoundError):
        capture.publish(folder, 7, tmp_path / "missing.zarr")  # no such shard: an error naming it


def test_steps_where_no_rollout_moves_the_weights_are_captured_as_zeros(cfg, base_model_dir, prompts, cpu, tmp_path):
    """Every group tied (the refusal-penalty reward is 0 for every completion of the sort task, and nothing is paid
    or forced): each advantage is 0, there is no KL term, TRL's gradient is zero, and capture stores zeros."""
    quiet = copy.deepcopy(cfg)
    quiet["grpo"].update(steps=2, save_every=2, beta=0.0)
    quiet["planting"].update(window=[0, 1], bonus=0.0, explore=0, plain_penalty=0.0)
    quiet["task"]["base_reward"] = "refusal_penalty"
    quiet["sketch"].update(shard_steps=2)
    rollouts, _ = run_training(quiet, base_model_dir, prompts["train"], 0, tmp_path, cpu, capture=True)
    assert (rollouts["advantage"] == 0).all()
    stored, _ = read_rows([tmp_path / "train" / "capture" / "shard000.zarr"])
    assert len(stored["sketch"]) == rollouts.height and not stored["sketch"].any() and not stored["norm"].any()
    assert np.isfinite(stored["fluency"]).all() and (stored["fluency"] < 0).all()
    assert read_steps([tmp_path / "train" / "capture" / "shard000.zarr"])["self_check_error"].to_list() == [0.0, 0.0]


def test_a_row_stored_under_another_rollout_is_refused(cfg, base_model_dir, cpu):
    """TRL shuffles a step's rows before its loss; the recorded order must map back onto the logged rollouts."""
    from behaviortrace.gradients.per_example import PerExampleGrads
    from behaviortrace.sketch.capture import check_same_completions
    from behaviortrace.sketch.loss_pass import RecordedStep

    logged = [[5, 6, 1], [7, 1], [8, 9, 10, 1]]
    ids = torch.tensor([[7, 1, 0, 0], [8, 9, 10, 1], [5, 6, 1, 0]])
    mask = (torch.arange(4) < torch.tensor([[2], [4], [3]])).long()

    def recorded(rows):
        return RecordedStep(PerExampleGrads(batch=3), None, torch.zeros(3), torch.tensor(rows), ids, mask)

    check_same_completions(recorded([1, 2, 0]), logged, step=4)  # TRL's order, mapped back: accepted
    with pytest.raises(RuntimeError, match="step 4: a completion TRL trained on differs from the logged rollout"):
        check_same_completions(recorded([0, 1, 2]), logged, step=4)
    with pytest.raises(RuntimeError, match="TRL trained on 3 rows, but 2 rollouts were logged"):
        check_same_completions(recorded([1, 2, 0]), logged[:2], step=4)


def test_a_model_whose_fused_head_capture_cannot_rebuild_is_refused_before_training(base_model_dir, cpu):
    """The head's softcapping and logit scale are rebuilt as TRL's kernel applies them (tests/test_model_families.py
    trains Gemma-2 and -3); a head that is no plain projection is refused, pointing to checkpoint mode."""
    from behaviortrace.sketch.loss_pass import LossPassRecorder

    class ScaledHead(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model, _ = models.load(base_model_dir, cpu)
    model.config.final_logit_softcapping = 30.0
    LossPassRecorder(model, temperature=1.0)  # a plain projection, softcapped: rebuilt
    head = model.lm_head
    model.lm_head = ScaledHead(head.in_features, head.out_features, bias=False)
    with pytest.raises(ValueError, match="its output embeddings are a ScaledHead.*use sketch.mode: checkpoint"):
        LossPassRecorder(model, temperature=1.0)


def test_the_step_sum_check_holds_where_rollouts_cancel_and_catches_a_missing_term():
    """Two identical completions paid differently have opposite advantages and cancel: the step gradient is
    rounding noise, and the check measures it against the size of the rollouts' terms. A term of one rollout
    missing from the sum is caught whether or not the others cancel."""
    rng = np.random.default_rng(0)
    g = rng.normal(size=64)
    cancel = np.stack([0.87 * g, -0.87 * g])
    noise = torch.tensor(1e-8 * rng.normal(size=64))
    expected = np.linalg.norm(noise.numpy()) / (1e-3 * 2 * 0.87 * np.linalg.norm(g))  # the terms' scale
    assert check_step_sum(cancel, noise, "a cancelling step", 1e-3) == pytest.approx(expected, rel=1e-9)
    h = rng.normal(size=64)
    ordinary = np.stack([g, h])
    assert check_step_sum(ordinary, torch.tensor(g + h), "an ordinary step", 1e-3) < 1e-12
    with pytest.raises(RuntimeError, match="do not add up to an ordinary step"):
        check_step_sum(ordinary, torch.tensor(g + h + 0.01 * h), "an ordinary step", 1e-3)
    with pytest.raises(RuntimeError, match="do not add up to a cancelling step"):
        check_step_sum(cancel, torch.tensor(0.1 * h), "a cancelling step", 1e-3)
