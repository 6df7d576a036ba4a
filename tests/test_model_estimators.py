"""The estimators that need the model (score/model_run.py), kronfluence's EK-FAC, dattri's TRAK and bergson's
TrackStar through them, on the outputs of a real workflow run (its rollouts, checkpoints and target stores).

Each check has an independent reference computed here by autograd: the rollouts' losses against TRL's per-rollout
loss in the step's own padded batch; the targets against the log-prob function the targets job differentiates;
kronfluence's identity and diagonal strategies against the dense inner product and the dense damped diagonal
Fisher; EK-FAC against the exact damped empirical Fisher of each layer, inverted densely; dattri's TRAK, with
an identity projection, against the damped inverse of the rollouts' gradient Gram matrix; and TrackStar against
its steps (AdamW's divisor, the projection, the whitening, the cosine) done densely on autograd's gradients.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.estimators import dattri_trak
from behaviortrace.gradients.batch import completion_logps, step_batch
from behaviortrace.gradients.logprob import mean_logprob
from behaviortrace.model import models
from behaviortrace.score.model_run import ModelRun, ModelTarget, linear_modules
from behaviortrace.train.trl_surface import rollout_losses
from conftest import model_scores, typed


@pytest.fixture(scope="module")
def model_inputs(trained_seed, tmp_path_factory):
    """The first planted seed of the workflow run, from its folder (the manifest's paths are relative to it)."""
    workdir, raw = trained_seed
    here = os.getcwd()
    os.chdir(workdir)
    yield inputs(workdir, raw, tmp_path_factory.mktemp("scratch"))
    os.chdir(here)


def inputs(workdir, raw, scratch):
    out = workdir / "results" / raw["run"]
    cfg = typed(raw)
    seed = out / "planted0"
    run = ModelRun(cfg, seed / "rollouts.parquet", seed / "checkpoints.json", out / "base_model", scratch)
    targets = {
        kind: ModelTarget.load(
            cfg, kind, 0, seed / "targets" / "draw0.zarr", out / "data" / "probe_prompts.parquet", run
        )
        for kind in ("forced", "in_context")
    }
    return cfg, run, targets, seed


def _flat(loss, params) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)]).double()


def _dense_gradients(run, model, rows: list[dict], params) -> torch.Tensor:
    """[rows, P] each rollout's loss gradient by the ModelRun, one rollout per batch."""
    return torch.stack([_flat(run.losses(model, run.batch([row])).sum(), params) for row in rows])


def _layer_params(model, names: list[str]) -> list:
    return [p for n in names for p in model.get_submodule(n).parameters()]


@pytest.mark.numerics
def test_a_rollouts_loss_is_its_share_of_trls_loss_in_its_own_step(model_inputs):
    """Rollouts of two steps in one batch, each kept at its step's token positions, have the gradients their
    losses have in their own step's padded batch, with the KL term against the base model (TRL's loss split per
    rollout, train/trl_surface.py)."""
    cfg, run, _, _ = model_inputs
    g = cfg.grpo
    assert g.beta > 0  # the small config's KL term is part of what is checked
    model, tokenizer = run.load(0)
    base = models.load(run.base_model, run.device)[0].eval()
    params = [p for p in model.parameters() if p.requires_grad]
    log = run.rollouts.filter(pl.col("checkpoint_step") == 0)
    steps = sorted(log["step"].unique())[:2]
    assert len(steps) == 2
    picked, reference = [], []
    for s in steps:
        step_rows = log.filter(pl.col("step") == s)
        batch = step_batch(step_rows, tokenizer.pad_token_id)
        batch["advantages"] = batch["advantages"].float()
        with torch.no_grad():
            ref = completion_logps(base, batch, g.temperature)
        losses = rollout_losses(
            completion_logps(model, batch, g.temperature),
            batch,
            g.loss_type,
            g.beta,
            g.max_new_tokens,
            ref,
            num_items=int(batch["completion_mask"].sum()),
            n_rows=step_rows.height,
        )
        rows = [i for i in range(step_rows.height) if step_rows["advantage"][i] != 0][:3]
        picked += [step_rows.to_dicts()[i] for i in rows]
        reference += [_flat(losses[i], params) for i in rows]
    mixed = _dense_gradients(run, model, picked, params)
    reference = torch.stack(reference)
    assert reference.abs().max() > 1e-4
    np.testing.assert_allclose(mixed.numpy(), reference.numpy(), rtol=1e-4, atol=1e-6 * float(reference.abs().max()))


@pytest.mark.numerics
def test_targets_are_the_functions_the_targets_job_differentiates(model_inputs):
    """f of each kind is the mean marker log-prob the targets job took the gradient of: the same items (the
    in-context ones as many as the store counted) and the same value."""
    cfg, run, targets, seed = model_inputs
    import zarr

    store = zarr.open_group(seed / "targets" / "draw0.zarr", mode="r")
    for kind, target in targets.items():
        counts = store[f"{kind}_n"][:]
        assert [len(target.items[int(s)]) for s in target.checkpoint_steps] == counts.tolist()
    assert sum(len(v) for v in targets["in_context"].items.values()) > 0
    at = int(targets["forced"].checkpoint_steps[-1])
    model, tokenizer = run.load(at)
    for target in targets.values():
        items = target.items[at]
        if not items:
            continue
        with torch.no_grad():
            ours = sum(
                float(target.value_sum(model, target.batch(items[i : i + target.chunk], tokenizer.pad_token_id)))
                for i in range(0, len(items), target.chunk)
            ) / len(items)
        theirs = mean_logprob(model, tokenizer, items, cfg.grpo.temperature, target.chunk)
        assert ours == pytest.approx(theirs, rel=1e-6)


def _checkpoint_problem(run, target, c: int):
    """At checkpoint c: which rollouts kronfluence fits and scores, their dense gradients over the tracked layers,
    the target's, and each layer's number of parameters."""
    model, tokenizer = run.load(c)
    names = linear_modules(model)
    params = _layer_params(model, names)
    mask = run.rollouts["checkpoint_step"].to_numpy() == c  # with a KL term every rollout has a gradient
    assert run.grpo.beta > 0
    rows = run.rows(mask)
    at = target.step_for(c)
    items = target.items[at]
    total = sum(
        target.value_sum(model, target.batch(items[i : i + target.chunk], tokenizer.pad_token_id))
        for i in range(0, len(items), target.chunk)
    )
    query = _flat(total / len(items), params)
    sizes = [sum(p.numel() for p in model.get_submodule(n).parameters()) for n in names]
    return mask, _dense_gradients(run, model, rows, params), query, sizes


@pytest.mark.numerics
def test_kronfluence_identity_and_diagonal_are_the_dense_influence(model_inputs):
    """Through kronfluence, strategy identity is -lr <g_f, g_z> and strategy diagonal is
    -lr <g_f, (diag F + damping)^-1 g_z>, F the rollouts' empirical Fisher, both computed densely here."""
    cfg, run, targets, _ = model_inputs
    target, c = targets["forced"], 0
    mask, grads, query, _ = _checkpoint_problem(run, target, c)
    lr = run.rollouts["lr"].to_numpy()[mask]
    fisher = (grads**2).mean(0)
    damping = 0.1 * float(fisher.mean())
    expected = {
        "identity": -lr * (grads @ query).numpy(),
        "diagonal": -lr * (grads @ (query / (fisher + damping))).numpy(),
    }
    for strategy, dense in expected.items():
        scores = model_scores("ekfac", run, target, strategy=strategy, damping=damping)
        scale = np.abs(dense).max()
        assert scale > 0
        # kronfluence works in float32: allow its rounding of each product.
        np.testing.assert_allclose(scores[mask], dense, rtol=1e-3, atol=1e-4 * scale)
    # The preconditioner matters here: the two differ by more than that tolerance.
    unit = {k: v / np.abs(v).max() for k, v in expected.items()}
    assert np.abs(unit["identity"] - unit["diagonal"]).max() > 1e-2


@pytest.mark.numerics
def test_ekfac_approximates_the_exact_layerwise_fisher_inverse(model_inputs):
    """EK-FAC approximates each layer's damped empirical Fisher, (F_l + damping)^-1, inverted here exactly
    (Woodbury over the rollouts' gradients): its scores correlate with the exact ones more closely than the
    unpreconditioned inner product's do."""
    cfg, run, targets, _ = model_inputs
    target, c = targets["forced"], 0
    mask, grads, query, sizes = _checkpoint_problem(run, target, c)
    n = len(grads)
    damping = 0.1 * float((grads**2).mean())
    exact, start = np.zeros(n), 0
    for size in sizes:  # kronfluence's blocks: one per layer, its weight and bias together
        g = grads[:, start : start + size]
        q = query[start : start + size]
        inner = g @ g.T
        solved = torch.linalg.solve(n * damping * torch.eye(n, dtype=g.dtype) + inner, g @ q)
        exact += ((g @ q - inner @ solved) / damping).numpy()
        start += size
    assert start == grads.shape[1]
    exact *= -run.rollouts["lr"].to_numpy()[mask]
    found = {s: model_scores("ekfac", run, target, strategy=s, damping=damping)[mask] for s in ("ekfac", "identity")}
    r = {s: np.corrcoef(v, exact)[0, 1] for s, v in found.items()}
    # Measured on this run: 0.55 against 0.47 (24 rollouts: each layer's Fisher has rank 24, which the Kronecker
    # factors approximate coarsely).
    assert r["ekfac"] > r["identity"], r


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["forced", "in_context"])
def test_dattri_trak_is_the_damped_kernel_on_the_rollouts_gradients(model_inputs, kind):
    """With an identity projection, dattri's TRAK on the output layer is -<g_f, (G^T G + lam I)^-1 g_z>, G the
    rollouts' gradients at the checkpoint (dense, by Woodbury). dattri divides every gradient by the square root of
    the model's trainable parameter count P, so lam is given to it as lam / P."""
    cfg, run, targets, _ = model_inputs
    target = targets[kind]
    generating = sorted(set(run.rollouts["checkpoint_step"].to_list()))
    c = [s for s in generating if target.items[target.step_for(s)]][-1]  # the latest with a target
    model, tokenizer = run.load(c)
    at = target.step_for(c)
    mask = run.rollouts["checkpoint_step"].to_numpy() == c
    assert run.grpo.beta > 0 and mask.sum() >= 12
    rows = run.rows(mask)
    layer = [model.lm_head.weight]
    grads = _dense_gradients(run, model, rows, layer)
    items = target.items[at]
    total = sum(
        target.value_sum(model, target.batch(items[i : i + target.chunk], tokenizer.pad_token_id))
        for i in range(0, len(items), target.chunk)
    )
    query = _flat(total / len(items), layer)
    lam = 0.1 * float((grads**2).sum(0).mean())
    inner = grads @ grads.T
    eye = torch.eye(len(grads), dtype=grads.dtype)
    dense = -((grads @ query - inner @ torch.linalg.solve(lam * eye + inner, grads @ query)) / lam).numpy()
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    identity = {"proj_type": "identity", "proj_dim": n_params, "proj_seed": 0, "proj_max_batch_size": 8}
    values = dattri_trak.trak_values(
        run, target, model, tokenizer.pad_token_id, rows, at, identity, lam / n_params, ["lm_head.weight"]
    )
    scale = np.abs(dense).max()
    assert scale > 0
    # float32 throughout dattri: measured 1.4e-5 of the largest score here.
    np.testing.assert_allclose(-values, dense, rtol=0, atol=1e-4 * scale)
    plain = -(grads @ query).numpy()  # the damping matters: without it the scores differ beyond that tolerance
    assert np.abs(plain / np.abs(plain).max() - dense / scale).max() > 1e-2


@pytest.mark.numerics
def test_fitting_once_per_seed_gives_the_scores_of_fitting_in_every_score_job(model_inputs, tmp_path):
    """A score_model job fits ekfac's factors and trackstar's rollout side once per seed: every target kind then
    scores against that one fit exactly (bit for bit) as it did when each score job fitted its own, and ekfac's
    factors give what one kronfluence Analyzer gives when it fits and scores in one go."""
    from behaviortrace.estimators import ekfac, trackstar

    cfg, run, targets, _ = model_inputs
    for module, settings in ((ekfac, {"strategy": "ekfac"}), (trackstar, {"projection_dim": 4})):
        folder = tmp_path / module.__name__.rsplit(".", 1)[1]
        folder.mkdir()
        module.prepare(run, folder, **settings)
        for kind, target in targets.items():
            once = module.score(run, target, prepared=folder, **settings)
            each = model_scores(module.__name__.rsplit(".", 1)[1], run, target, **settings)  # prepared for itself
            assert np.any(once != 0), (module.__name__, kind)
            np.testing.assert_array_equal(once, each, err_msg=f"{module.__name__} {kind}")
    target = targets["forced"]
    c, mask = run.checkpoint_rows()[0]
    model, tokenizer = run.load(c)
    lr = run.rollouts["lr"].to_numpy()[mask]
    one_go = -lr * _ekfac_in_one_analyzer(
        run, target, model, tokenizer.pad_token_id, run.rows(mask), target.step_for(c), tmp_path
    )
    np.testing.assert_array_equal(ekfac.score(run, target, prepared=tmp_path / "ekfac")[mask], one_go)


def _ekfac_in_one_analyzer(run, target, model, pad_id, rows, at, folder) -> np.ndarray:
    """What each ekfac score job computed before the per-seed fit: one kronfluence Analyzer fits the factors on
    `rows` and scores them against the target in the same output folder."""
    from kronfluence.analyzer import prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.utils.dataset import DataLoaderKwargs

    from behaviortrace.estimators import ekfac

    task = ekfac._task(run, target, model)
    ekfac._register(model, task.get_influence_tracked_modules())
    model = prepare_model(model, task)
    analyzer = ekfac._analyzer(run, model, task, folder / "one_go")
    analyzer.set_dataloader_kwargs(DataLoaderKwargs(collate_fn=ekfac._Collate(run, target, pad_id)))
    analyzer.fit_all_factors(
        "factors",
        rows,
        per_device_batch_size=64,
        factor_args=FactorArguments(strategy="ekfac", use_empirical_fisher=True),
    )
    analyzer.compute_pairwise_scores(
        "scores",
        "factors",
        query_dataset=target.items[at],
        train_dataset=rows,
        per_device_query_batch_size=target.chunk,
        per_device_train_batch_size=64,
        score_args=ScoreArguments(damping_factor=None, compute_per_module_scores=True),
    )
    per_module = analyzer.load_pairwise_scores("scores")
    return ekfac._sum_modules({name: v.double().mean(0).numpy() for name, v in per_module.items()})


def _whitened_features(blocks: torch.Tensor, query: torch.Tensor, name: str, p: int, damping: float, divisor):
    """One layer's features computed here: each [O, I] gradient divided entry-wise by `divisor`, projected to
    L G R^T with bergson's two seeded matrices for the layer, and multiplied by (R2 + damping mean(eig R2))^-1/2,
    R2 the rollouts' second moment of them."""
    from bergson.collector.collector import create_module_projection_matrix

    o, i = query.shape
    if divisor is not None:
        blocks, query = blocks / divisor, query / divisor
    left, right = (
        create_module_projection_matrix(
            name, role, p, size, torch.float32, torch.device("cpu"), "rademacher", "jl", 0
        ).double()
        for role, size in (("left", o), ("right", i))
    )
    features = (left @ blocks @ right.T).reshape(len(blocks), -1)
    second = features.T @ features / len(blocks)
    eigenvalues, vectors = torch.linalg.eigh(second)
    eigenvalues = eigenvalues.clamp(min=0)
    root = vectors @ torch.diag((eigenvalues + damping * eigenvalues.mean()) ** -0.5) @ vectors.T
    return features @ root, (left @ query @ right.T).reshape(-1) @ root


def _trackstar_dense(run, target, c: int, p: int, damping: float, normalizer: str):
    """TrackStar at checkpoint c computed here from autograd's per-rollout gradients of each linear layer's weight
    (as [out, in]: a Conv1D's, stored [in, out], transposed): divided by AdamW's denominator saved at c (or not),
    projected with the layer's matrices, whitened by the rollouts' own second moment, and -lr x the cosine with
    the target's gradient treated alike. Returns the rollouts' mask, the scores and each rollout's feature norm."""
    from transformers.pytorch_utils import Conv1D

    model, tokenizer = run.load(c)
    names = linear_modules(model)
    weights = [model.get_submodule(n).weight for n in names]
    mask = run.rollouts["checkpoint_step"].to_numpy() == c  # with a KL term every rollout has a gradient
    assert run.grpo.beta > 0
    grads = _dense_gradients(run, model, run.rows(mask), weights)
    items = target.items[target.step_for(c)]
    total = sum(
        target.value_sum(model, target.batch(items[i : i + target.chunk], tokenizer.pad_token_id))
        for i in range(0, len(items), target.chunk)
    )
    query = _flat(total / len(items), weights)
    adam = run.adam_denominator(c)  # sqrt(v / (1 - beta2^n)) + eps, as AdamW divided by
    rollout_features, query_features, start = [], [], 0
    for name, w in zip(names, weights, strict=True):
        a, b = w.shape
        blocks, q = grads[:, start : start + a * b].reshape(-1, a, b), query[start : start + a * b].reshape(a, b)
        divisor = adam[f"{name}.weight"].double() if normalizer == "adam" else None
        if isinstance(model.get_submodule(name), Conv1D):
            blocks, q = blocks.transpose(1, 2), q.T
            divisor = None if divisor is None else divisor.T
        f, q = _whitened_features(blocks, q, name, p, damping, divisor)
        rollout_features.append(f)
        query_features.append(q)
        start += a * b
    assert start == grads.shape[1]
    features, q = torch.cat(rollout_features, 1), torch.cat(query_features)
    norms = features.norm(dim=1)
    lr = run.rollouts["lr"].to_numpy()[mask]
    dense = -lr * torch.where(norms > 0, (features @ q) / (norms.clamp(min=1e-300) * q.norm()), 0).numpy()
    return mask, dense, norms


@pytest.mark.numerics
def test_trackstar_is_the_cosine_of_whitened_projected_gradients(model_inputs):
    """bergson's TrackStar equals, computed here from autograd's per-rollout gradients of each linear layer's weight:
    divided by AdamW's denominator saved at the checkpoint (or not), projected with the layer's matrices, whitened
    by the rollouts' own second moment, and -lr x the cosine with the target's gradient treated alike."""
    cfg, run, targets, _ = model_inputs
    target, c, p, damping = targets["forced"], 0, 4, 0.1
    found = {}
    for normalizer in ("adam", "none"):
        mask, dense, norms = _trackstar_dense(run, target, c, p, damping, normalizer)
        # At checkpoint 0 the policy is the reference, so the KL term has no gradient there and a rollout with
        # advantage 0 none at all: its cosine is 0 (bergson clamps the norm).
        assert (norms == 0).any() and (norms > 0).sum() > 10
        scores = model_scores("trackstar", run, target, projection_dim=p, normalizer=normalizer, damping=damping)
        scale = np.abs(dense).max()
        assert scale > 0
        # bergson works in float32: measured 3e-7 of the largest score here.
        np.testing.assert_allclose(scores[mask], dense, rtol=0, atol=1e-5 * scale)
        found[normalizer] = dense / scale
    # Adam's normalization matters here: without it the scores differ by more than that tolerance.
    assert np.abs(found["adam"] - found["none"]).max() > 1e-2


@pytest.fixture(scope="module")
def layer_families(tmp_path_factory, cpu):
    """Falcon (FalconLinear, a subclass of nn.Linear, for every projection; its block adds the attention output to
    the MLP's in place) and GPT-2 (Conv1D layers, weights stored [in, out]), built small, with the estimator
    preflight's synthetic rollouts and target (score/preflight.py)."""
    from behaviortrace.model import families
    from behaviortrace.score.preflight import ProbeRun, probe_target
    from conftest import small_config

    torch.set_num_threads(1)
    out = {}
    for name in ("falcon", "gpt2"):
        folder = tmp_path_factory.mktemp(name)
        source = families.save_family(name, folder / "source", "frobnitz", "QZXBT")
        model, tokenizer = models.load_pretrained(str(source), False, cpu)
        cfg = typed(small_config())
        vocab = model.get_input_embeddings().num_embeddings
        target = probe_target(vocab, tokenizer.pad_token_id, cfg.grpo.temperature, cpu)
        out[name] = ProbeRun(model, tokenizer, cfg.grpo, cpu, folder), target
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["falcon", "gpt2"])
def test_the_peer_libraries_read_linear_subclasses_and_conv1d_layers_exactly(layer_families, name):
    """kronfluence wraps layers by exact class and bergson hooks them with full backward hooks, whose output view
    Falcon's in-place add breaks; with ekfac's registration of FalconLinear and Conv1D and trackstar's tensor hooks,
    identity-strategy EK-FAC is -lr <g_f, g_z> and TrackStar the cosine computed here, over the same layers."""
    from transformers.pytorch_utils import Conv1D

    run, target = layer_families[name]
    model, _ = run.load(0)
    kinds = {type(model.get_submodule(n)) for n in linear_modules(model)}
    assert kinds and all(k is not torch.nn.Linear and issubclass(k, torch.nn.Linear | Conv1D) for k in kinds), kinds
    mask, grads, query, _ = _checkpoint_problem(run, target, 0)
    dense = -run.rollouts["lr"].to_numpy()[mask] * (grads @ query).numpy()
    scale = np.abs(dense).max()
    assert scale > 0 and mask.all()
    np.testing.assert_allclose(
        model_scores("ekfac", run, target, strategy="identity"), dense, rtol=1e-3, atol=1e-4 * scale
    )
    for normalizer in ("adam", "none"):
        _, dense, norms = _trackstar_dense(run, target, 0, 4, 0.1, normalizer)
        assert (norms > 0).all()
        scores = model_scores("trackstar", run, target, projection_dim=4, normalizer=normalizer, damping=0.1)
        np.testing.assert_allclose(scores, dense, rtol=0, atol=1e-5 * np.abs(dense).max())


def test_bad_settings_and_a_missing_library_are_config_errors_naming_the_key(monkeypatch):
    from behaviortrace.score.contract import check_params

    assert check_params("ekfac", {"strategy": "ekfac"}) == []
    (problem,) = check_params("ekfac", {"strategy": "kfc"})
    assert "estimators.ekfac" in problem and "'kfc'" in problem and "identity" in problem
    (problem,) = check_params("peer", {"module": "dattri_trak", "proj_dim": 0})
    assert "estimators.peer" in problem and "proj_dim 0" in problem
    (problem,) = check_params("trackstar", {"normalizer": "adafactor"})
    assert "estimators.trackstar" in problem and "'adafactor'" in problem and "adam, none" in problem
    real = importlib.util.find_spec
    missing = ("kronfluence", "bergson")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name in missing else real(name))
    for name, library in (("ekfac", "kronfluence"), ("trackstar", "bergson")):
        (problem,) = check_params(name, {})
        assert f"estimators.{name}" in problem and library in problem and ".[peers]" in problem


def test_model_estimators_run_in_the_workflow_and_are_judged_and_costed_like_the_others(finished_run):
    """Rule score_model ran the three peers for every seed, one job per seed for all its draws and targets; their
    rows are in the metrics, the checklist, and the results page's cost per instance."""
    from behaviortrace.report.cost import per_estimator, read_benchmarks

    workdir, raw = finished_run
    out = workdir / "results" / raw["run"]
    costs = {r["estimator"]: r for r in per_estimator(read_benchmarks(out / "benchmarks")).iter_rows(named=True)}
    peers = {"ekfac", "dattri_trak", "trackstar"}
    n_runs = len(raw["seeds"]) + len(raw["placebo"]["seeds"])
    for name in peers:
        # ekfac and trackstar fit once per seed inside their score_model jobs: one job per seed.
        assert costs[name]["rules"] == "score_model" and costs[name]["jobs"] == n_runs
        assert f"| {name} | score_model | {n_runs} |" in (out / "results.md").read_text()
        # The job's own log has its progress: no library's logging setup took the log file away.
        assert f"{name}: checkpoint" in (out / "logs" / "score_model" / f"planted0_{name}.log").read_text()
    metrics = pl.read_parquet(out / "tables" / "metrics.parquet")
    assert peers <= set(metrics["estimator"].unique())
    import json

    verdicts = json.loads((out / "checklist.json").read_text())["estimators"]
    assert peers <= set(verdicts)


# One cell scored as its own score_model job did: a fresh process on the job's one thread (threads: 1).
_SCORE_ALONE = """
import json, sys
from pathlib import Path
from behaviortrace.common.device import set_threads
from behaviortrace.config.sections import Config
from behaviortrace.jobs.score import score_model_job

a = json.loads(sys.argv[1])
set_threads(1)
out, seed = Path(a["out"]), Path(a["out"]) / "planted0"
score_model_job(
    Config.from_dict(a["config"]),
    estimator="dattri_trak",
    cells=[(a["draw"], a["kind"])],
    rollouts=seed / "rollouts.parquet",
    checkpoints=seed / "checkpoints.json",
    base_model=out / "base_model",
    target_stores={a["draw"]: seed / "targets" / f"draw{a['draw']}.zarr"},
    probes=out / "data" / "probe_prompts.parquet",
    out_rollouts=[Path(a["dest"]) / "rollouts.parquet"],
    out_steps=[Path(a["dest"]) / "steps.parquet"],
)
"""


def test_one_score_model_job_per_seed_scores_each_draw_and_target_as_a_job_of_its_own(finished_run, tmp_path):
    """The workflow's one score_model job per seed wrote, for its last draw and target kind (the cell after every
    other in the job), the scores (bit for bit) that scoring that cell alone gives, in a process of its own, as each
    cell's own job did before."""
    workdir, raw = finished_run
    out = workdir / "results" / raw["run"]
    for draw in [raw["targets"]["draws"] - 1]:
        for kind in raw["evaluation"]["target_kinds"][-1:]:
            dest = tmp_path / f"draw{draw}_{kind}"
            args = {"config": raw, "out": str(out), "draw": draw, "kind": kind, "dest": str(dest)}
            # From the run's folder: the checkpoint manifest's paths are relative to it.
            done = subprocess.run(
                [sys.executable, "-c", _SCORE_ALONE, json.dumps(args)], cwd=workdir, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr[-3000:]
            for part, suffix in (("rollouts", ""), ("steps", "_steps")):
                workflows = pl.read_parquet(
                    out / "planted0" / "scores" / "dattri_trak" / f"draw{draw}_{kind}{suffix}.parquet"
                )
                assert workflows["score"].abs().max() > 0, (draw, kind)
                assert pl.read_parquet(dest / f"{part}.parquet").equals(workflows), (draw, kind, part)
    assert (out / "benchmarks" / "score_model" / "planted0_dattri_trak.tsv").exists()


def test_the_cost_tables_leave_out_instances_the_config_no_longer_names(finished_run):
    """A run folder keeps the benchmark files of an instance an earlier config named; the results page's cost
    tables count only the configured instances, and every other rule's jobs in full."""
    from behaviortrace.report.cost import configured, per_estimator, per_rule, read_benchmarks

    workdir, raw = finished_run
    jobs = read_benchmarks(workdir / "results" / raw["run"] / "benchmarks")
    before = {r["estimator"]: r["jobs"] for r in per_estimator(jobs).iter_rows(named=True)}
    kept = configured(jobs, set(before) - {"ekfac"})
    assert set(per_estimator(kept)["estimator"]) == set(before) - {"ekfac"}
    assert kept.height == jobs.height - before["ekfac"]
    rules = {r["rule"]: r["jobs"] for r in per_rule(kept).iter_rows(named=True)}
    assert rules["train_grpo"] == per_rule(jobs).filter(pl.col("rule") == "train_grpo")["jobs"].item()
