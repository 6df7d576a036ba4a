"""The sketch and targets stages on a real small GRPO run: behavior-token sketches, stores that survive
a SIGKILL, and targets per generation draw."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import zarr

from behaviortrace.gradients.batch import completion_logits, completion_logps, fluency, step_batch
from behaviortrace.jobs.sketch import sketch_job
from behaviortrace.jobs.targets import targets_job
from behaviortrace.model import models
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.sketch.sketcher import StepSketcher
from behaviortrace.sketch.store import ShardWriter, open_store, read_rows, read_steps
from behaviortrace.targets.headroom import headroom_table
from behaviortrace.train.trl_surface import rollout_losses
from conftest import typed
from tolerance import within


def stage_args(run: dict, out: Path, shard: int) -> dict:
    d = run["dir"]
    return dict(
        shard=shard,
        rollouts_path=d / "rollouts.parquet",
        steps_path=d / "steps.parquet",
        checkpoints_path=d / "checkpoints.json",
        base_model=run["base_model"],
        out=out,
    )


@pytest.mark.parametrize("method", ["countsketch", "factored"])
def test_behavior_token_sketch_is_zero_exactly_without_a_marker_token(small_run, cpu, method):
    cfg = small_run["cfg"]
    model, tokenizer = models.load(small_run["dir"] / "train" / "checkpoint-0", cpu)
    ref, _ = models.load(small_run["base_model"], cpu)
    marker = cfg["planting"]["marker"]
    marker_ids = marker_token_ids(tokenizer, marker)
    smap = SketchMap.for_model(model, method, 256, 0)
    sketcher = StepSketcher(smap, typed(cfg).grpo, tokenizer, marker, marker_ids, ref, chunk=5)
    rows = small_run["rollouts"].sort("rollout_id")
    steps = sorted(rows["step"].unique().to_list())
    batches = {s: step_batch(rows.filter(pl.col("step") == s), tokenizer.pad_token_id) for s in steps}
    out = {
        s: sketcher.sketch_step(model, rows.filter(pl.col("step") == s), int(b["completion_mask"].sum()))
        for s, b in batches.items()
    }
    has = np.concatenate([out[s]["has_marker"] for s in steps])
    holds_token = np.array([any(t in marker_ids for t in ids) for ids in rows["completion_ids"].to_list()])
    nonzero = np.concatenate([np.abs(out[s]["behavior_sketch"]).sum(1) > 0 for s in steps])
    norms = np.concatenate([out[s]["behavior_norm"] for s in steps])
    assert 0 < has.sum() < len(has)
    # Every row here is differentiated at checkpoint 0, where the policy is the KL reference: a row with
    # advantage 0 then has a gradient of exactly zero, marker or not.
    moved = holds_token & (rows["advantage"].to_numpy() != 0)
    assert (has == holds_token).all() and (nonzero == moved).all() and ((norms > 0) == moved).all()
    null_norms = np.concatenate([out[s]["null_norm"] for s in steps])
    assert ((null_norms > 0) <= has).all() and (null_norms > 0).sum() > 0

    # Null positions: as many as the marker's, never on it, inside the completion, reproducible.
    for s in steps:
        step_rows, batch = rows.filter(pl.col("step") == s), batches[s]
        marker_pos = sketcher.positions(step_rows, batch["completion_ids"].shape[1])
        null = sketcher.null_positions(step_rows, marker_pos, batch["completion_mask"])
        free = ((batch["completion_mask"] > 0) & (marker_pos == 0)).sum(1)
        assert torch.equal(null.sum(1), torch.minimum(marker_pos.sum(1), free.float()))
        assert not (null * marker_pos).any() and not (null * (1 - batch["completion_mask"])).any()
        assert torch.equal(null, sketcher.null_positions(step_rows, marker_pos, batch["completion_mask"]))

    # The behavior-token and null sketches of a marked rollout (two backward passes over one forward) are the
    # sketches of its own masked-loss gradients, each from a forward and backward of its own.
    step = next(s for s in steps if out[s]["has_marker"].any())
    i = int(np.flatnonzero(out[step]["has_marker"])[0])
    step_rows, batch = rows.filter(pl.col("step") == step), batches[step]
    positions = sketcher.positions(step_rows, batch["completion_ids"].shape[1])
    null = sketcher.null_positions(step_rows, positions, batch["completion_mask"])
    row = {k: v[i : i + 1] for k, v in batch.items()}
    ref_logps = completion_logps(ref, row, 1.0).detach()
    for name, mask in (("behavior_sketch", positions), ("null_sketch", null)):
        model.zero_grad(set_to_none=True)
        rollout_losses(
            completion_logps(model, row, 1.0),
            row,
            "dapo",
            cfg["grpo"]["beta"],
            10,
            ref_logps,
            num_items=int(batch["completion_mask"].sum()),
            positions=mask[i : i + 1],
            n_rows=step_rows.height,
        ).sum().backward()
        want, _ = smap.sketch_dense({n: p.grad for n, p in model.named_parameters()})
        assert want.abs().sum() > 0, name
        # A sketch coordinate is a sum of many float32 products; its rounding scales with the sketch, not with
        # what is left where the sum cancels (as tests/test_capture.py).
        got = torch.from_numpy(out[step][name][i])
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())), name


def test_without_kl_zero_advantage_rollouts_skip_the_backward_and_the_sketches_still_add_up(small_run, cpu):
    """Without a KL term a rollout with advantage 0 is not differentiated: its sketch and norm are zero,
    its fluency is still measured, and the step's sketches still sum to the step gradient's sketch."""
    cfg = small_run["cfg"]
    grpo = typed({**cfg, "grpo": {**cfg["grpo"], "beta": 0.0}}).grpo
    model, tokenizer = models.load(small_run["dir"] / "train" / "checkpoint-0", cpu)
    marker = cfg["planting"]["marker"]
    smap = SketchMap.for_model(model, "countsketch", 256, 0)
    sketcher = StepSketcher(smap, grpo, tokenizer, marker, marker_token_ids(tokenizer, marker), None, chunk=5)
    rows = small_run["rollouts"].filter(pl.col("step") == 1).sort("rollout_id")
    rows = rows.with_columns(advantage=pl.when(pl.col("gen_index") == 0).then(0.0).otherwise(pl.col("advantage")))
    batch = step_batch(rows, tokenizer.pad_token_id)
    num_items = int(batch["completion_mask"].sum())
    out = sketcher.sketch_step(model, rows, num_items)
    zero = rows["advantage"].to_numpy() == 0
    assert 0 < zero.sum() < len(zero)
    assert (out["sketch"][zero] == 0).all() and (out["norm"][zero] == 0).all() and (out["norm"][~zero] > 0).all()
    with torch.no_grad():
        every_row = fluency(completion_logits(model, batch), batch).numpy()
    np.testing.assert_allclose(out["fluency"], every_row, rtol=1e-5, atol=1e-6)
    step_sketch, _ = sketcher.step_gradient_sketch(model, rows, num_items)  # every row, by ordinary autograd
    # The pipeline's self-check criterion, ten times stricter: float32 sums of separately computed rows
    # differ from the batch gradient by about 1e-7 of its scale, so coordinates that cancel to near zero
    # cannot be held to a per-coordinate relative tolerance.
    summed = torch.from_numpy(out["sketch"]).sum(0)
    assert within(float(torch.linalg.norm(summed - step_sketch)), 1e-5 * float(torch.linalg.norm(step_sketch)))


KILL_CHILD = """
import json, os, signal
from pathlib import Path
import torch
torch.set_num_threads(1)
from behaviortrace.sketch import store as sketchstore
from behaviortrace.config.sections import Config
from behaviortrace.jobs.sketch import sketch_job
original = sketchstore.ShardWriter.write_step
calls = []
def write_then_die(self, step, arrays, info=None):
    original(self, step, arrays, info)
    calls.append(step)
    if len(calls) == {kill_after}:
        os.kill(os.getpid(), signal.SIGKILL)
sketchstore.ShardWriter.write_step = write_then_die
args = json.loads(Path({args!r}).read_text())
cfg = Config.from_dict(args.pop("cfg"))
args = {{k: Path(v) if k.endswith(("_path", "out", "model")) else v for k, v in args.items()}}
sketch_job(cfg, **args)
"""


def test_killed_sketch_job_leaves_no_finished_store_and_resumes_to_the_same_result(small_run, cpu, tmp_path):
    torch.set_num_threads(1)
    clean = tmp_path / "clean" / "shard000.zarr"
    sketch_job(typed(small_run["cfg"]), **stage_args(small_run, clean, 0))

    killed = tmp_path / "killed" / "shard000.zarr"
    args = stage_args(small_run, killed, 0)
    args_file = tmp_path / "args.json"
    args_file.write_text(
        json.dumps({"cfg": small_run["cfg"], **{k: str(v) if isinstance(v, Path) else v for k, v in args.items()}})
    )
    code = KILL_CHILD.format(kill_after=2, args=str(args_file))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == -9, res.stderr[-2000:]
    assert not killed.exists()
    partial = killed.with_name("shard000.zarr.partial")
    with pytest.raises(RuntimeError, match="not complete"):
        open_store(partial)
    assert list(zarr.open_group(partial, mode="r")["steps/done"][:]) == [True, True, False]

    sketch_job(typed(small_run["cfg"]), **args)
    assert not partial.exists()
    got, attrs = read_rows([killed])
    want, _ = read_rows([clean])
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert attrs["complete"] and attrs["method"] == "countsketch" and attrs["k"] == 256
    rollouts = small_run["rollouts"].filter(pl.col("step") < 3).sort("rollout_id")
    assert got["rollout_id"].tolist() == rollouts["rollout_id"].to_list()
    assert got["checkpoint_step"].tolist() == rollouts["checkpoint_step"].to_list()
    assert (got["norm"] > 0).all() and np.isfinite(got["fluency"]).all() and (got["fluency"] < 0).all()
    logged = pl.read_parquet(small_run["dir"] / "steps.parquet").filter(pl.col("step") < 3)
    assert read_steps([killed])["clip_coef"].to_list() == logged["clip_coef"].to_list()


def test_stale_partial_store_from_other_settings_is_discarded(small_run, cpu, tmp_path):
    out = tmp_path / "shard001.zarr"
    args = stage_args(small_run, out, 1)
    cfg = typed(small_run["cfg"])
    other_raw = copy.deepcopy(small_run["cfg"])
    other_raw["sketch"]["seed"] = 99
    partial = out.with_name("shard001.zarr.partial")
    from behaviortrace.sketch import store as sketchstore

    original = sketchstore.ShardWriter.finish
    sketchstore.ShardWriter.finish = lambda self: None  # leave the other settings' store unfinished
    try:
        sketch_job(typed(other_raw), **args)
    finally:
        sketchstore.ShardWriter.finish = original
    assert partial.exists()
    sketch_job(cfg, **args)
    rows, attrs = read_rows([out])
    assert attrs["seed"] == cfg.sketch.seed
    fresh = tmp_path / "fresh.zarr"
    sketch_job(cfg, **stage_args(small_run, fresh, 1))
    assert np.array_equal(rows["sketch"], read_rows([fresh])[0]["sketch"])


def test_targets_per_draw(small_run, cpu, tmp_path):
    """One targets job writes every draw of its seed; a draw is the same whether the job makes it after another draw
    or alone, and another draw samples other completions."""
    cfg, d = small_run["cfg"], small_run["dir"]
    probes = pl.read_parquet(d / "probes.parquet")

    def run(draws, names):
        targets_job(
            typed(cfg),
            seed=0,
            draws=draws,
            checkpoints_path=d / "checkpoints.json",
            probes_path=d / "probes.parquet",
            plain_path=d / "plain.parquet",
            out_stores=[tmp_path / f"{name}.zarr" for name in names],
            out_rates=[tmp_path / f"{name}.parquet" for name in names],
        )
        return [
            (zarr.open_group(tmp_path / f"{name}.zarr", mode="r"), pl.read_parquet(tmp_path / f"{name}.parquet"))
            for name in names
        ]

    (store, rates), (other, other_rates) = run([0, 1], ["a", "c"])
    ((again, rates_again),) = run([0], ["b"])
    ((alone, alone_rates),) = run([1], ["d"])
    assert np.array_equal(other["in_context"][:], alone["in_context"][:]) and other_rates.equals(alone_rates)
    saved = [c["step"] for c in json.loads((d / "checkpoints.json").read_text())["checkpoints"]]
    assert store["checkpoint_step"][:].tolist() == saved
    n_samples = cfg["targets"]["samples_per_prompt"] * probes.height
    probe_rates = rates.filter(pl.col("prompt_set") == "probes").sort("step")
    # Every sample that shows the marker contributes to the in-context target, and only those.
    assert store["in_context_n"][:].tolist() == (probe_rates["behavior_rate"] * n_samples).round().to_list()
    assert (store["forced_n"][:] == probes.height).all() and (store["forced_norm"][:] > 0).all()
    assert ((store["in_context_norm"][:] > 0) == (store["in_context_n"][:] > 0)).all()
    assert store["forced"].shape == (len(saved), store.attrs["k"])
    assert np.array_equal(store["in_context"][:], again["in_context"][:]) and rates.equals(rates_again)
    assert not rates.equals(other_rates)  # another draw samples other completions
    assert np.array_equal(store["forced"][:], other["forced"][:])  # the forced target does not depend on the draw
    table = headroom_table([tmp_path / "a.parquet", tmp_path / "c.parquet"], 0.9)
    assert table.height == 2 * len(saved)
    assert set(table.columns) >= {"seed", "draw", "step", "probe_rate", "plain_rate", "headroom", "saturated"}


def test_a_deferred_writer_puts_small_rows_and_step_facts_on_disk_at_flush(tmp_path):
    """Train-time capture defers the small writes to the next checkpoint: before `flush` a reopened store does
    not count the step as done (a resumed run recaptures it); after, every row and fact is there."""
    rows = pl.DataFrame({"rollout_id": np.arange(8), "step": np.repeat([0, 1], 4), "checkpoint_step": np.zeros(8)})
    steps = pl.DataFrame({"step": [0, 1]})

    def writer():
        return ShardWriter(tmp_path / "s.zarr", rows, steps, 3, {}, "fp", 4, deferred=True)

    rng = np.random.default_rng(0)
    arrays = {
        step: {
            "sketch": rng.standard_normal((4, 3)).astype(np.float32),
            "behavior_sketch": np.zeros((4, 3), np.float32),
            "null_sketch": np.zeros((4, 3), np.float32),
            "norm": rng.random(4),
            "behavior_norm": np.zeros(4),
            "null_norm": np.zeros(4),
            "fluency": rng.random(4).astype(np.float32),
            "has_marker": np.array([True, False, False, True]),
        }
        for step in (0, 1)
    }
    first = writer()
    first.write_step(0, arrays[0], {"lr": 0.5, "self_check_error": 1e-7})
    assert first.done_steps() == {0}
    assert writer().done_steps() == set()  # reopened from disk: nothing flushed yet
    first.flush()
    assert writer().done_steps() == {0}
    first.write_step(1, arrays[1], {"lr": 0.25, "self_check_error": 2e-7})
    assert first.finish() == pytest.approx(2e-7)
    stored, _ = read_rows([tmp_path / "s.zarr"])
    for name in arrays[0]:
        assert np.array_equal(stored[name], np.concatenate([arrays[0][name], arrays[1][name]])), name
    assert read_steps([tmp_path / "s.zarr"])["lr"].to_list() == [0.5, 0.25]
