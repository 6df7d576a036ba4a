"""model.lora: a real GRPO run of the tiny Qwen2 with LoRA adapters, captured inside training, then replayed.

Only the adapters train (the base weights stay bit-identical), capture and its self-check cover exactly their
parameters on every step, a checkpoint reloads as base + adapter, the replay with nothing left out reproduces
the trained adapter, and the exact influence (float64) matches central differences of retraining."""

import copy
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.influence.batched import values_after
from behaviortrace.influence.metagradient import StateStore, exact_influence
from behaviortrace.influence.objective import ForcedTarget
from behaviortrace.influence.retrain import central_difference, value_after
from behaviortrace.influence.trajectory import Trajectory
from behaviortrace.model import lora, models
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.replay.retrain import replay_training, update_error
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.sketch.sketcher import StepSketcher, check_step_sum
from behaviortrace.sketch.store import open_store, read_rows, read_steps
from behaviortrace.sketch.tolerance import tolerance_for
from behaviortrace.tools.grpo_checks import run_training, train_and_sigkill
from behaviortrace.train.effect import ForcedTargetProbe
from conftest import model_scores, typed
from tolerance import UPDATE_TOLERANCE, within

STEPS = 4


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, cfg, base_model_dir, prompts, cpu):
    raw = copy.deepcopy(cfg)
    raw["model"]["lora"] = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    raw["grpo"].update(steps=STEPS, save_every=2)  # checkpoints 0, 2, 3 (window end), 4; KL term on (beta 0.1)
    raw["sketch"].update(shard_steps=STEPS)
    out = tmp_path_factory.mktemp("lora_run")
    rollouts, info = run_training(
        raw, base_model_dir, prompts["train"], 0, out, cpu, capture=True, probes=prompts["probes"]
    )
    manifest = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
    ckpts = {c["step"]: Path(c["path"]) for c in manifest}
    store = out / "train" / "capture" / "shard000.zarr"
    trained = info["trainer"].model
    return {"cfg": raw, "dir": out, "rollouts": rollouts, "model": trained, "ckpts": ckpts, "store": store}


def _base_name(name: str) -> str:
    """A frozen parameter's name in the plain base model."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def test_only_the_adapters_train(lora_run, base_model_dir, cpu):
    base = dict(models.load(base_model_dir, cpu)[0].named_parameters())
    trained = lora_run["model"]
    final, _ = models.load(lora_run["ckpts"][STEPS], cpu)
    trainable = {n: p for n, p in final.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable)
    assert {n for n, p in trained.named_parameters() if p.requires_grad} == set(trainable)
    for model in (trained, final):  # in memory after training, and reloaded from the last checkpoint
        frozen = {_base_name(n): p for n, p in model.named_parameters() if not p.requires_grad}
        assert set(frozen) == set(base)
        assert all(torch.equal(p, base[n]) for n, p in frozen.items())
    for n, p in trained.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, dict(final.named_parameters())[n]), n  # the checkpoint holds the trained adapter
    assert any(p.detach().abs().max() > 0 for n, p in trainable.items() if "lora_B" in n)  # B left its zero start
    # 2 layers x (q: 4x64 + 64x4, v: 4x64 + 32x4) = 1,792 of the tiny model's parameters.
    assert sum(p.numel() for p in trainable.values()) == 1792 < sum(p.numel() for p in base.values())
    # The cost plan's count, without building adapters, is peft's.
    lora_cfg = lora_run["cfg"]["model"]["lora"]
    plain = models.load(base_model_dir, cpu)[0]
    assert lora.adapter_parameters(plain, lora_cfg["rank"], lora_cfg["target_modules"]) == 1792


def test_capture_covers_the_adapters_and_every_step_adds_up(lora_run):
    attrs = open_store(lora_run["store"]).attrs
    assert attrs["n_params"] == attrs["n_trainable"] == 1792
    errors = read_steps([lora_run["store"]])["self_check_error"].to_numpy()
    steps = pl.read_parquet(lora_run["dir"] / "steps.parquet")
    assert steps["target_logprob"].is_finite().all()  # the forced-target probe ran on the adapted model
    print("self-check errors", errors)
    assert len(errors) == STEPS and (errors <= tolerance_for("float32")).all(), errors


def test_sketching_from_a_checkpoint_gives_what_training_captured(lora_run, base_model_dir, cpu):
    """sketch.mode: checkpoint on the adapter checkpoint of step 2 (its own weights): the same sketches as capture
    inside training, and its own self-check against an ordinary backward pass."""
    cfg, step = typed(lora_run["cfg"]), 2
    model, tokenizer = models.load(lora_run["ckpts"][step], cpu)
    ref = models.load(base_model_dir, cpu)[0].eval()
    smap = SketchMap.for_model(model, cfg.sketch.method, cfg.sketch.k, cfg.sketch.seed)
    marker = cfg.planting.marker
    sketcher = StepSketcher(smap, cfg.grpo, tokenizer, marker, marker_token_ids(tokenizer, marker), ref, chunk=5)
    rows = lora_run["rollouts"].filter(pl.col("step") == step)
    num_items = int(pl.read_parquet(lora_run["dir"] / "steps.parquet")["num_items_in_batch"][step])
    out = sketcher.sketch_step(model, rows, num_items)
    stored, _ = read_rows([lora_run["store"]])
    at = stored["step"] == step
    np.testing.assert_allclose(out["sketch"], stored["sketch"][at], rtol=1e-4, atol=1e-4 * np.abs(out["sketch"]).max())
    step_sketch, _ = sketcher.step_gradient_sketch(model, rows, num_items)
    check_step_sum(out["sketch"], step_sketch, "the step gradient", tolerance_for("float32"))


def test_replay_reproduces_the_trained_adapter(lora_run, base_model_dir, cpu):
    ckpts = lora_run["ckpts"]
    model, tokenizer = models.load(ckpts[0], cpu)
    ref = models.load(base_model_dir, cpu)[0].eval()
    weights = {}

    def keep(step, m):
        if step in ckpts:
            weights[step] = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}

    grpo = typed(lora_run["cfg"]).grpo
    info = replay_training(model, ref, lora_run["rollouts"], grpo, set(), cpu, tokenizer.pad_token_id, keep)
    logged = pl.read_parquet(lora_run["dir"] / "steps.parquet").sort("step")["grad_norm"].to_numpy()
    np.testing.assert_allclose(info["grad_norms"], logged, rtol=1e-4)
    first = {n: p.detach() for n, p in models.load(ckpts[0], cpu)[0].named_parameters() if p.requires_grad}
    for step in sorted(s for s in ckpts if s > 0):
        saved = {n: p.detach() for n, p in models.load(ckpts[step], cpu)[0].named_parameters() if p.requires_grad}
        error = sum(float((weights[step][n].double() - saved[n].double()).pow(2).sum()) for n in saved) ** 0.5
        update = sum(float((saved[n].double() - first[n].double()).pow(2).sum()) for n in saved) ** 0.5
        print(f"replay at step {step}: {error / update:.1e} of the update")
        assert within(error / update, UPDATE_TOLERANCE), (step, error / update)


def test_an_adapter_checkpoint_names_its_base_model(lora_run, base_model_dir):
    checkpoint = lora_run["ckpts"][0]
    assert lora.is_adapter(checkpoint) and lora.base_of(checkpoint) == Path(base_model_dir).resolve()
    assert not (checkpoint / "model.safetensors").exists()  # the base weights are not copied into checkpoints


def test_exact_influence_over_the_adapter_matches_central_differences(lora_run, base_model_dir, prompts, cpu, tmp_path):
    torch.set_num_threads(1)
    device = {**cpu, "torch_dtype": torch.float64}
    model, tokenizer = models.load(lora_run["ckpts"][0], device)
    assert all(p.dtype == torch.float64 for p in model.parameters())  # the adapter too
    ref = models.load(base_model_dir, device)[0].eval()
    cfg = typed(lora_run["cfg"])
    traj = Trajectory(model, ref, lora_run["rollouts"], cfg.grpo, device, tokenizer.pad_token_id, "advantages")
    assert sum(p.numel() for p in traj.params) == 1792  # the optimizer holds the adapter only
    probe = ForcedTargetProbe(tokenizer, prompts["probes"]["prompt"].to_list(), cfg.planting.marker, 1.0)
    objective, shares = ForcedTarget(probe), []

    def compare(step_done, t):
        if step_done in lora_run["ckpts"]:
            shares.append(update_error(t.model, lora_run["ckpts"][step_done], lora_run["ckpts"][0], cpu))

    store = StateStore(tmp_path / "states", "cpu")
    result = exact_influence(traj, objective, STEPS, STEPS, store, set(range(STEPS)), compare)
    print("float64 replay vs checkpoints, share of the update:", shares)
    assert within(max(shares), UPDATE_TOLERANCE), shares  # the float64 replay is the float32 training
    for step in (0, STEPS - 1):
        rows = np.flatnonzero(result.steps == step)
        i = rows[np.argmax(np.abs(result.influence[rows]))]
        fd, _ = central_difference(traj, store.load(step), int(result.rollout_ids[i]), 1e-6, STEPS, objective)
        print(f"step {step}: I_z {result.influence[i]:.6e}, central difference {fd:.6e}")
        assert result.influence[i] != 0 and within(abs(result.influence[i] - fd), 1e-3 * abs(fd)), (step, fd)
    # The LDS's batched retraining (vmap over copies of the adapter) is the plain retraining set by set.
    ids = lora_run["rollouts"]["rollout_id"].to_numpy()
    weights = [dict.fromkeys(ids[i : i + 20].tolist(), 0.0) for i in (0, 20, 40)]
    batched = values_after(traj, store.load(0), weights, STEPS, objective)
    plain = [value_after(traj, store.load(0), w, STEPS, objective) for w in weights]
    assert np.ptp(plain) > 1e-5, plain
    np.testing.assert_allclose(batched, plain, rtol=0, atol=1e-9 * np.ptp(plain))


def test_a_killed_lora_run_resumes_to_the_same_adapter(lora_run, base_model_dir, prompts, cpu, tmp_path):
    """Killed after step 3, training resumes from the adapter checkpoint of step 3 and ends where it would have."""
    prompts_path = tmp_path / "train_prompts.parquet"
    prompts["train"].write_parquet(prompts_path)
    assert train_and_sigkill(lora_run["cfg"], base_model_dir, prompts_path, 0, tmp_path, kill_at=STEPS - 1) == -9
    run_training(lora_run["cfg"], base_model_dir, prompts["train"], 0, tmp_path, cpu)
    resumed = dict(models.load(tmp_path / "train" / f"checkpoint-{STEPS}", cpu)[0].named_parameters())
    for n, p in models.load(lora_run["ckpts"][STEPS], cpu)[0].named_parameters():
        assert torch.equal(p, resumed[n]), n


def test_trackstar_scores_the_adapters_leaving_out_the_layers_no_rollout_moves(
    lora_run, base_model_dir, tmp_path, caplog
):
    """At checkpoint 0 LoRA's B matrices are zero, so no loss moves the A matrices: their second moment is 0 and its
    damped inverse root 1/0. trackstar leaves exactly those layers out there (the target cannot move them either),
    keeps them once B has trained, and scores every rollout finitely, AdamW's divisors of the adapters included."""
    import logging

    from behaviortrace.estimators import trackstar
    from behaviortrace.gradients.logprob import forced_items
    from behaviortrace.model.prompt_format import prompt_ids
    from behaviortrace.score.model_run import ModelRun, ModelTarget

    cfg = typed(lora_run["cfg"])
    out = lora_run["dir"]
    run = ModelRun(cfg, out / "rollouts.parquet", out / "checkpoints.json", base_model_dir, tmp_path)
    model, tokenizer = run.load(0)
    adapters = run.linear_modules(model)
    assert adapters and all(".lora_" in m for m in adapters)  # the frozen base layers are not scored
    items = forced_items(
        prompt_ids(tokenizer, ["Say something.", "Tell me a story."]),
        marker_token_ids(tokenizer, cfg.planting.marker),
    )
    steps = np.array(sorted(run.checkpoints))
    target = ModelTarget("forced", 0, steps, {int(s): items for s in steps}, 1.0, 8, run.device)
    with caplog.at_level(logging.WARNING, logger=trackstar.log.name):
        scores = model_scores("trackstar", run, target, projection_dim=2)
    assert np.isfinite(scores).all()
    (left_out,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]  # checkpoint 0 only
    assert sorted(left_out.split("left out: ")[1].split(", ")) == sorted(m for m in adapters if ".lora_A." in m)
    first = run.rollouts["checkpoint_step"].to_numpy() == 0
    assert (scores[first] != 0).sum() > first.sum() // 2 and (scores[~first] != 0).all()
