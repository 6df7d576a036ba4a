"""Any causal LM a researcher brings: small models of the common architecture families, built from their
transformers configs and saved beside a byte-level BPE tokenizer, named by `model.name` as a local folder,
trained three GRPO steps with train-time capture. Each step's self-check against TRL's gradient, and each
rollout's sketch against its own autograd gradient at the step's weights over every trainable parameter; a
family that cannot be captured is refused before training, with its reason. Also `compute.dtype: bfloat16` (mixed
precision) on the CPU, with the tolerance diagnostics/bf16_gradients.py measured."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from behaviortrace.common.device import resolve
from behaviortrace.config.sections import Compute
from behaviortrace.model import families, models
from behaviortrace.model.prompt_format import has_chat_template, render
from behaviortrace.plant.prompts import plant_prompts
from behaviortrace.preflight.base_model import build_base_model
from behaviortrace.sketch import tolerance as measured
from behaviortrace.sketch.preflight import UnsupportedModel, capture_problems
from behaviortrace.sketch.store import read_steps
from behaviortrace.tools.grpo_checks import WeightSpy, autograd_sketches, run_training, sketch_errors
from conftest import small_config, typed
from tolerance import within

STEPS = 3
REFUSED = {"mixtral": r"MixtralTopKRouter owns trainable parameters but does not map tensors to one tensor"}
CAPTURED = [name for name in families.families() if name not in REFUSED]


def family_run(name: str, folder, device, dtype_device=None, **grpo) -> dict:
    """Build family `name` into `folder/source`, make the base model from it as the base_model rule does
    (`model.name` = that folder), and train STEPS steps with train-time capture (in `dtype_device` if given;
    `grpo` settings on top of the tests' small config)."""
    cfg = small_config()
    cfg["grpo"].update(steps=STEPS, save_every=STEPS, **grpo)
    cfg["planting"]["window"] = [0, STEPS - 1]
    source = families.save_family(name, folder / "source", cfg["planting"]["trigger"], cfg["planting"]["marker"])
    cfg["model"]["name"] = str(source)
    config = typed(cfg)
    model, tokenizer = build_base_model(config, device)
    models.save(model, tokenizer, folder / "base")
    prompts = plant_prompts(config.task, config.planting, config.grpo, config.probes, config.probes.seed)
    run = folder / "run"
    rollouts, info = run_training(
        cfg, folder / "base", prompts["train"], 0, run, dtype_device or device, capture=True, trainer_cls=WeightSpy
    )
    stores = sorted((run / "train" / "capture").glob("shard*.zarr"))
    return {"cfg": cfg, "run": run, "base": folder / "base", "rollouts": rollouts, "info": info, "stores": stores}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cpu):
    """Each family's float32 run, trained once for the tests that read it."""
    runs = {}

    def get(name: str) -> dict:
        if name not in runs:
            runs[name] = family_run(name, tmp_path_factory.mktemp(name), cpu)
        return runs[name]

    return get


@pytest.mark.parametrize("name", CAPTURED)
def test_a_family_trains_with_capture_that_matches_trl_and_autograd(name, trained, cpu):
    run = trained(name)
    rollouts = run["rollouts"]
    # Something to check: rollouts that moved the weights, some of them showing the (multi-token) marker.
    assert (rollouts["advantage"] != 0).sum() >= 8 and rollouts["behavior"].sum() >= 2
    steps = read_steps(run["stores"])
    assert steps["step"].to_list() == list(range(STEPS))
    errors = steps["self_check_error"].to_numpy()
    assert within(errors, 1e-5), errors  # the summed sketches against TRL's gradient, every step
    weights = run["info"]["trainer"].step_weights
    for step in range(STEPS):
        want, norms, stored, _ = autograd_sketches(
            run["run"], run["stores"], weights[step], step, run["base"], run["cfg"], cpu
        )
        assert np.abs(want).sum(1).max() > 0
        for i in range(len(want)):
            assert np.allclose(stored["sketch"][i], want[i], rtol=1e-4, atol=1e-4 * np.abs(want[i]).max()), (step, i)
        assert np.allclose(stored["norm"], norms, rtol=1e-4), step


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_family_capture_gets_wrong_is_refused_before_training(name, tmp_path, cpu):
    cfg = small_config()
    source = families.save_family(name, tmp_path / "source", cfg["planting"]["trigger"], cfg["planting"]["marker"])
    cfg["model"]["name"] = str(source)
    with pytest.raises(UnsupportedModel, match=REFUSED[name]) as refused:
        build_base_model(typed(cfg), cpu)
    assert "cannot be captured correctly on this architecture, in either sketch.mode" in str(refused.value)
    assert str(source) in str(refused.value)


def test_the_preflight_catches_an_error_the_step_sum_cannot_see(tmp_path, cpu):
    """GPT-2 looks its positions up with ids shared by the batch; crediting that lookup's whole gradient to the
    first example keeps every step's sum right, and only a per-example check can tell."""
    from behaviortrace.gradients import per_example

    source = families.save_family("gpt2", tmp_path / "gpt2", "frobnitz", "QZXBT")
    model, tokenizer = models.load_pretrained(str(source), False, cpu)
    assert capture_problems(model, tokenizer.pad_token_id, 1e-3) == []
    right = per_example.Capture._lookup

    def first_example_only(self, module, name, ids, output):
        if ids.shape[0] == 1:
            output = self._grad_able(output)
            batch = self._batch

            def on_grad(g):
                full = torch.zeros(batch, *g.shape[1:])
                full[0] = g[0].float()
                self.result.matrix[name].append(
                    (per_example.Factor(ids.expand(batch, -1), is_index=True), full.to(g.device))
                )

            output.register_hook(on_grad)
            return output
        return right(self, module, name, ids, output)

    per_example.Capture._lookup = first_example_only
    try:
        problems = capture_problems(model, tokenizer.pad_token_id, 1e-3)
    finally:
        per_example.Capture._lookup = right
    assert problems and all(p.startswith("transformer.wpe.weight (Embedding, embedding rule)") for p in problems)


@pytest.mark.parametrize("name", ["qwen2_tied", "llama"])
def test_chat_prompts_reach_trl_as_conversations_and_the_log_keeps_the_text_the_model_saw(name, trained, cpu):
    """`task.prompt_format: auto` with a tokenizer that has a chat template: TRL gets conversations, the rollout log
    keeps the rendered text and TRL's ids, which are `render`'s (checked on every step), and the forced-target probe
    and sampling for behavior rates take the same ids."""
    from behaviortrace.behavior.rates import sample_completion_ids
    from behaviortrace.config.sections import Sampling
    from behaviortrace.train.effect import ForcedTargetProbe

    run = trained(name)
    _, tokenizer = models.load(run["base"], cpu)
    assert has_chat_template(tokenizer)
    rows = run["rollouts"].unique("prompt_index", keep="first").sort("prompt_index")
    config = typed(run["cfg"])
    train = plant_prompts(config.task, config.planting, config.grpo, config.probes, config.probes.seed)
    raw = train["train"].filter(pl.col("prompt_index").is_in(rows["prompt_index"].to_list()))["prompt"].to_list()
    for logged, ids, prompt in zip(rows["prompt"], rows["prompt_ids"], raw, strict=True):
        want = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        assert logged == want == render(tokenizer, prompt).text and prompt in logged and logged != prompt
        assert ids.to_list() == render(tokenizer, prompt).ids
    if name == "llama":  # the template writes the beginning-of-sequence token; it must not come twice
        assert all(ids[0] == tokenizer.bos_token_id != ids[1] for ids in rows["prompt_ids"])
    probe = ForcedTargetProbe(tokenizer, raw[:2], run["cfg"]["planting"]["marker"], 1.0)
    assert [p for p, _, _ in probe.items] == [render(tokenizer, p).ids for p in raw[:2]]
    model, _ = models.load(run["base"], cpu)
    seen = []
    model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"]) if not seen else None, with_kwargs=True
    )
    sample_completion_ids(model, tokenizer, raw[:2], 1, Sampling(2, 1.0, 1.0), seed=0)
    mask = seen[0] != tokenizer.pad_token_id
    assert [row[keep].tolist() for row, keep in zip(seen[0], mask, strict=True)] == [
        render(tokenizer, p).ids for p in raw[:2]
    ]


def test_bf16_trains_and_captures_on_the_cpu_within_the_measured_tolerance(tmp_path, cpu):
    """The paper's setting is `compute.dtype: bfloat16` with train-time capture: mixed precision (float32 weights,
    bf16 autocast; common/device.py), on the CPU, with no KL term as there. The self-check runs under the bf16
    tolerance on every step (sketch/tolerance.py); each rollout's captured sketch is checked against its own
    autograd gradient under bf16 autocast at the step's weights and against its float32 gradient (no autocast) at
    the same weights, each within four times the largest error diagnostics/bf16_gradients.py measured."""
    bf16 = resolve(Compute(device="cpu", dtype="bfloat16"))
    run = family_run("qwen2_tied", tmp_path, cpu, dtype_device=bf16, beta=0.0)
    errors = read_steps(run["stores"])["self_check_error"].to_numpy()
    assert np.all(errors > 1e-5) and within(errors, measured.tolerance_for("bfloat16")), errors  # bf16 rounding shows
    weights = run["info"]["trainer"].step_weights
    assert all(w.dtype == torch.float32 for w in weights[0].values())  # master weights
    for step in range(STEPS):
        args = (run["run"], run["stores"], weights[step], step, run["base"], run["cfg"])
        want, _, stored, _ = autograd_sketches(*args, bf16)
        assert np.all(np.isfinite(stored["sketch"])) and stored["sketch"].dtype == np.float32
        assert np.abs(stored["sketch"]).max() > 0
        assert within(sketch_errors(want, stored["sketch"]).max(), 4 * measured.BF16_ROLLOUT_MEASURED), step
        want32, _, _, _ = autograd_sketches(*args, cpu)
        assert within(sketch_errors(want32, stored["sketch"]).max(), 4 * measured.BF16_VS_FLOAT32_MEASURED), step
