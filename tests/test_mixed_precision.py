"""`compute.dtype: bfloat16` trains: mixed precision (float32 master weights, bf16 autocast; common/device.py).

A small Qwen2 (tied embeddings, built from its transformers config) is trained ten real GRPO steps through the
project's training code (train/grpo.py, TRL with the arguments of train/trl_surface.py) at the paper's learning
rate 5e-6, in float32, in mixed precision and with pure bf16 weights (tools/grpo_checks.py). AdamW's
first steps move each weight by about lr times the sign of its gradient, whatever the gradient's rounding, so mixed
precision must leave as few weights unchanged as float32 and move them as far; bf16 weights, whose 8 significant
bits cannot hold a change of 5e-6 to a weight of order 0.01 to 1, must not (the negative control: it shows the
check can fail). The mixed run captures every step inside training, with the self-check enforced at the bf16
tolerance (sketch/tolerance.py).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.common.device import autocast, resolve
from behaviortrace.config.sections import Compute
from behaviortrace.model import models
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.replay.retrain import replay_training, update_error
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.sketch.sketcher import StepSketcher
from behaviortrace.sketch.store import read_steps
from behaviortrace.sketch.tolerance import tolerance_for
from behaviortrace.targets.gradients import target_sketches
from behaviortrace.tools.grpo_checks import update_sizes
from behaviortrace.train.checkpoints import read_manifest
from behaviortrace.train.effect import ForcedTargetProbe
from conftest import small_config, typed
from tolerance import within

BF16 = Compute(device="cpu", dtype="bfloat16")

# Margins against float32. Unchanged share: float32 leaves about 1e-5 of the parameters unchanged (coordinates
# whose gradient is exactly zero on every step), pure bf16 about 0.92; 0.01 is far above the first and far below
# the second. Relative update: measured within 3e-5 of float32's (the rollouts, sampled under autocast, may
# differ; AdamW's sign-like first steps make the size nearly independent of them); 10% leaves room for that, and
# pure bf16's update is a third of float32's.
UNCHANGED_MARGIN = 0.01
UPDATE_MARGIN = 0.10


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    return update_sizes(small_config(), tmp_path_factory.mktemp("mixed_precision"), hidden=64, capture=True)


def matches_float32(run: dict, float32: dict) -> bool:
    unchanged = within(run["unchanged"] - float32["unchanged"], UNCHANGED_MARGIN)
    return unchanged and within(abs(run["relative_update"] / float32["relative_update"] - 1), UPDATE_MARGIN)


def test_mixed_precision_updates_the_weights_as_float32_does_and_bf16_weights_do_not(sizes):
    float32, mixed, bf16 = sizes["float32"], sizes["mixed"], sizes["bf16"]
    assert float32["relative_update"] > 0 and float32["unchanged"] < UNCHANGED_MARGIN, float32  # training moved
    assert matches_float32(mixed, float32), (mixed, float32)
    assert not matches_float32(bf16, float32), (bf16, float32)  # the negative control fails the same check
    assert bf16["unchanged"] > 0.5, bf16


def test_mixed_precision_trains_float32_weights_under_bf16_autocast(sizes):
    assert sizes["float32"]["forward_dtypes"] == {torch.float32}
    assert sizes["mixed"]["forward_dtypes"] == {torch.bfloat16}  # accelerate's autocast, on the CPU too
    model = models.load(sizes["mixed"]["dir"] / "train" / "checkpoint-10", resolve(BF16))[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # checkpoints hold the master weights


def test_mixed_precision_self_check_passes_on_every_step(sizes):
    run = sizes["mixed"]
    errors = read_steps(sorted((run["dir"] / "train" / "capture").glob("shard*.zarr")))["self_check_error"]
    moved = pl.read_parquet(run["dir"] / "steps.parquet")["grad_norm"].to_numpy() > 0  # a step of ties has none
    assert len(errors) == 10 and moved.sum() >= 5, moved
    # bf16 rounding shows (autocast ran), within the bf16 tolerance that capture enforced on every step.
    assert np.all(errors.to_numpy()[moved] > 1e-5) and within(errors, tolerance_for("bfloat16")), errors


def test_recomputations_run_in_the_precision_training_ran_in(sizes):
    """The replay, the sketcher (checkpoint mode and capture's own passes), the targets and the forced-target probe
    run the model under bf16 autocast for compute.dtype bfloat16. The replay of the mixed run (all rollouts kept)
    lands within 1.3e-2 of training's update (measured; a float32 replay of it: 1.6e-2; of a float32 run, 7e-6):
    bf16 rounding flips the sign of AdamW's first steps on small gradient coordinates, whatever the replay's
    precision, so a bf16 run is replayed faithfully only to that level; 4x the measurement."""
    run, device = sizes["mixed"], resolve(BF16)
    config = typed(run["config"])
    ckpts = read_manifest(run["dir"] / "checkpoints.json")[0]
    rollouts = pl.read_parquet(run["dir"] / "rollouts.parquet")
    model, tokenizer = models.load(ckpts[0], device)
    seen = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    replay_training(model, None, rollouts, config.grpo, set(), device, tokenizer.pad_token_id)
    assert set(seen) == {torch.bfloat16}
    assert within(update_error(model, ckpts[10], ckpts[0], device), 4 * 1.3e-2)

    seen.clear()
    smap = SketchMap.for_model(model, "countsketch", 64, 0)
    marker = config.planting.marker
    sketcher = StepSketcher(smap, config.grpo, tokenizer, marker, marker_token_ids(tokenizer, marker), None, 5, device)
    rows = rollouts.filter(pl.col("step") == 0)
    num_items = int(pl.read_parquet(run["dir"] / "steps.parquet")["num_items_in_batch"][0])
    sketcher.sketch_step(model, rows, num_items)
    sketcher.step_gradient_sketch(model, rows, num_items)
    prompts = rollouts["prompt_ids"].to_list()[:2]
    target_sketches(model, tokenizer, smap, prompts, [[]] * 2, marker, sketcher.marker_ids, 1.0, 4, None, device)
    ForcedTargetProbe(tokenizer, rollouts["prompt"].to_list()[:2], marker, 1.0, device)(model)
    assert seen and set(seen) == {torch.bfloat16}


def test_autocast_is_bf16_for_bfloat16_and_nothing_otherwise():
    linear = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with autocast(resolve(Compute(device="cpu", dtype="bfloat16"))):
        assert linear(x).dtype == torch.bfloat16
    for device in (resolve(Compute(device="cpu", dtype="float32")), {"device": "cpu", "dtype": "float64"}):
        with autocast(device):
            assert linear(x).dtype == torch.float32
    assert resolve(Compute(device="cpu", dtype="bfloat16"))["torch_dtype"] == torch.float32  # master weights
