"""What the optimizer did and what each step did to the behavior, on real TRL runs of the tiny model:
the logged AdamW state reproduces every update exactly, its first-order effect on the forced target
matches a finite difference across real optimizer steps, adam_tracin computes that effect, and the
measured effect in the step log is the directly measured log-prob."""

from __future__ import annotations

import copy
import json

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F

from behaviortrace.estimators import adam_tracin
from behaviortrace.model import models
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.score import contract
from behaviortrace.score.view import SeedView, Target
from behaviortrace.tools.grpo_checks import GradSpy, run_training
from behaviortrace.train.optimizer_log import denominator, load_preconditioner
from tolerance import within

STEPS = 3


def forced_logprob(model, tokenizer, probes: list[str], marker: str, temperature: float) -> torch.Tensor:
    """Mean over probes of the summed log-probs of the marker's tokens right after the probe, one unpadded
    sequence at a time (independent of the batched code under test)."""
    marker_ids = marker_token_ids(tokenizer, marker)
    total = 0.0
    for prompt in probes:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        seq = torch.tensor([ids + marker_ids])
        logits = model(input_ids=seq).logits[0, len(ids) - 1 : -1] / temperature
        total = total + F.log_softmax(logits.double(), -1)[torch.arange(len(marker_ids)), marker_ids].sum()
    return total / len(probes)


def flat(tensors: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].detach().double().flatten() for n in names])


@pytest.fixture(scope="module")
def stepped_run(tmp_path_factory, cfg, base_model_dir, prompts, cpu):
    """Three real optimizer steps, a checkpoint and AdamW's second moment after every one, each step's
    pre-clip gradient, and the forced target measured at every step."""
    c = copy.deepcopy(cfg)
    # A small learning rate keeps a real step in the first-order regime (Adam moves every coordinate by ~lr).
    c["grpo"].update(steps=STEPS, save_every=1, beta=0.0, lr=1e-4)
    c["planting"]["window"] = [0, 0]
    out = tmp_path_factory.mktemp("stepped_run")
    _, info = run_training(
        c, base_model_dir, prompts["train"], 0, out, cpu, trainer_cls=GradSpy, probes=prompts["probes"]
    )
    manifest = json.loads((out / "checkpoints.json").read_text())["checkpoints"]
    model, tokenizer = models.load(base_model_dir, cpu)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    weights = [flat(dict(models.load(m["path"], cpu)[0].named_parameters()), names) for m in manifest]
    saved = [load_preconditioner(m["adam"]) for m in manifest if m["adam"]]
    return {
        "cfg": c,
        "dir": out,
        "steps": pl.read_parquet(out / "steps.parquet").sort("step"),
        "grads": [info["trainer"].step_grads[s].double() for s in range(STEPS)],
        "weights": weights,  # w_0 .. w_STEPS
        "denominators": [flat(denominator(s), names) for s in saved],  # D_0 .. D_{STEPS-1}
        "saved": saved,
        "manifest": manifest,
        "names": names,
        "probes": prompts["probes"]["prompt"].to_list(),
    }


def update_coefficient(steps: pl.DataFrame, beta1: float, t: int, s: int) -> float:
    """How much of step t's pre-clip gradient (divided by D_s) AdamW subtracts from the weights at step s."""
    lr, clip = steps["lr"][s], steps["clip_coef"][t]
    return lr * (1 - beta1) * beta1 ** (s - t) / (1 - beta1 ** (s + 1)) * clip


def test_logged_adam_state_reproduces_every_update_exactly(stepped_run):
    """w_{s+1} - w_s = -(sum over t <= s of coefficient(t, s) g_t) / D_s: momentum, bias corrections, clipping
    and the saved denominator, with no weight decay in this config."""
    run, steps = stepped_run, stepped_run["steps"]
    beta1 = run["saved"][0]["beta1"]
    assert steps["adam_step"].to_list() == [1, 2, 3] and [s["adam_step"] for s in run["saved"]] == [1, 2, 3]
    assert steps["beta1"].to_list() == [beta1] * STEPS and steps["weight_decay"].to_list() == [0.0] * STEPS
    for s in range(STEPS):
        momentum = sum(update_coefficient(steps, beta1, t, s) * run["grads"][t] for t in range(s + 1))
        predicted = -momentum / run["denominators"][s]
        actual = run["weights"][s + 1] - run["weights"][s]
        # The weights are float32: their difference is exact only to the spacing of float32 numbers there.
        spacing = float(np.spacing(np.float32(run["weights"][s + 1].abs().max())))
        assert torch.allclose(actual, predicted, rtol=1e-4, atol=2 * spacing), s
        assert within(float((actual - predicted).norm() / actual.norm()), 1e-4)
        assert float(actual.abs().max()) > 1e-5  # a real update, not a no-op
        if s:  # the momentum of earlier steps is a large part of the update: leaving it out would fail
            own = -update_coefficient(steps, beta1, s, s) * run["grads"][s] / run["denominators"][s]
            assert float((actual - own).norm() / actual.norm()) > 0.1


def test_first_order_effect_through_adam_matches_the_finite_difference_of_each_step(stepped_run, cfg, cpu):
    """<grad f(w_s), w_{s+1} - w_s>, built from the logged quantities, against f(w_{s+1}) - f(w_s) measured
    across the real step, and against the difference quotient along the same update shrunk 100-fold
    (where only first-order terms remain; smaller steps drown in the float32 softmax inside attention)."""
    run = stepped_run
    tokenizer = models.load(run["manifest"][0]["path"], cpu)[1]
    marker, temperature = cfg["planting"]["marker"], cfg["grpo"]["temperature"]
    beta1 = run["saved"][0]["beta1"]
    for s in range(STEPS):
        model = models.load(run["manifest"][s]["path"], cpu)[0].double()  # float64 throughout: the quotient
        f_before = forced_logprob(model, tokenizer, run["probes"], marker, temperature)  # has a small numerator
        f_before.backward()
        grad_f = flat({n: p.grad for n, p in model.named_parameters()}, run["names"])
        update = -sum(update_coefficient(run["steps"], beta1, t, s) * run["grads"][t] for t in range(s + 1))
        update = update / run["denominators"][s]
        predicted = float(grad_f @ update)
        with torch.no_grad():
            after = models.load(run["manifest"][s + 1]["path"], cpu)[0].double()
            measured = float(forced_logprob(after, tokenizer, run["probes"], marker, temperature) - f_before)
            at, eps = 0, 1e-2
            for p in model.parameters():  # w_s + eps x update
                p.data += eps * update[at : at + p.numel()].view_as(p)
                at += p.numel()
            quotient = float(forced_logprob(model, tokenizer, run["probes"], marker, temperature) - f_before) / eps
        assert abs(measured) > 1e-3
        assert predicted == pytest.approx(measured, rel=0.05), s
        assert predicted == pytest.approx(quotient, rel=1e-3), s


def test_the_measured_effect_is_the_directly_measured_log_prob(stepped_run, cfg, cpu):
    """Step log: f at each step's weights (= its checkpoint here), after its update, and the change."""
    run, steps = stepped_run, stepped_run["steps"]
    marker, temperature = cfg["planting"]["marker"], cfg["grpo"]["temperature"]
    direct = []
    for m in run["manifest"]:
        model, tokenizer = models.load(m["path"], cpu)
        with torch.no_grad():
            direct.append(float(forced_logprob(model, tokenizer, run["probes"], marker, temperature)))
    assert steps["target_logprob"].to_numpy() == pytest.approx(direct[:-1], rel=1e-5)
    assert steps["target_logprob_after"].to_numpy() == pytest.approx(direct[1:], rel=1e-5)
    assert steps["target_change"].to_numpy() == pytest.approx(np.diff(direct), rel=1e-3, abs=1e-6)


def test_momentum_factor_is_the_sum_of_every_later_update_coefficient():
    rng = np.random.default_rng(0)
    lr, beta1 = rng.uniform(1e-4, 1e-3, size=30), 0.9
    brute = [
        sum(lr[s] * (1 - beta1) * beta1 ** (s - t) / (1 - beta1 ** (s + 1)) for s in range(t, 30)) for t in range(30)
    ]
    assert adam_tracin.momentum_factor(lr, beta1) == pytest.approx(brute, rel=1e-12)


def test_adam_tracin_scores_are_the_first_order_effect_of_each_steps_gradient(stepped_run, cfg, cpu):
    """With exact vectors in place of sketches (one row per step holding its whole gradient; the target its
    dense gradient divided by D at the row's checkpoint): each step's score is -sum over later updates s of
    coefficient(t, s) <grad f, g_t / D_t>, and for the last step, whose gradient enters a single update with
    the exact D, it is that update's first-order effect on f."""
    run, steps = stepped_run, stepped_run["steps"]
    marker, temperature = cfg["planting"]["marker"], cfg["grpo"]["temperature"]
    tokenizer = models.load(run["manifest"][0]["path"], cpu)[1]
    grad_fs = []
    for s in range(STEPS):
        model = models.load(run["manifest"][s]["path"], cpu)[0]
        forced_logprob(model, tokenizer, run["probes"], marker, temperature).backward()
        grad_fs.append(flat({n: p.grad for n, p in model.named_parameters()}, run["names"]))
    beta1 = run["saved"][0]["beta1"]
    rollouts = pl.DataFrame(
        {"rollout_id": range(STEPS), "step": range(STEPS), "checkpoint_step": range(STEPS), "lr": steps["lr"]}
    )
    view = SeedView.from_arrays(
        rollouts, {"sketch": torch.stack(run["grads"]).numpy()}, steps.select("step", "lr", "clip_coef")
    )
    target = Target(
        "forced",
        0,
        np.arange(STEPS),
        torch.stack(grad_fs).numpy(),
        np.ones(STEPS),
        np.ones(STEPS, dtype=int),
        torch.stack([g / d for g, d in zip(grad_fs, run["denominators"], strict=True)]).numpy(),
        np.ones(STEPS, dtype=bool),
        {"beta1": beta1},
    )
    roll, step_scores = contract.run("adam_tracin", {}, view, target)
    for t in range(STEPS):
        inner = float(grad_fs[t] @ (run["grads"][t] / run["denominators"][t]))
        want = -sum(update_coefficient(steps, beta1, t, s) for s in range(t, STEPS)) * inner
        assert roll["score"][t] == pytest.approx(want, rel=1e-9)
        assert step_scores["score_summed"][t] == pytest.approx(want, rel=1e-9)
    last = STEPS - 1
    effect = float(
        grad_fs[last] @ (-update_coefficient(steps, beta1, last, last) * run["grads"][last] / run["denominators"][last])
    )
    assert roll["score"][last] == pytest.approx(effect, rel=1e-9)


def test_adam_tracin_needs_the_preconditioned_target(stepped_run):
    rollouts = pl.DataFrame({"rollout_id": [0], "step": [0], "checkpoint_step": [0], "lr": [1e-3]})
    view = SeedView.from_arrays(
        rollouts, {"sketch": np.ones((1, 4))}, pl.DataFrame({"step": [0], "lr": [1e-3], "clip_coef": [1.0]})
    )
    plain = Target("forced", 0, np.array([0]), np.ones((1, 4)), np.ones(1), np.ones(1, dtype=int))
    with pytest.raises(ValueError, match="no Adam-preconditioned vectors: rerun its targets job"):
        adam_tracin.score(view, plain)
