"""Before a model trains: does per-example capture give each example's own gradient on this architecture?

The capture rules (gradients/per_example.py) assume things about how each module uses its parameters. A model
that breaks an assumption would not always fail loudly: a use that escapes the hooks shows in the per-step
self-check (the per-rollout sketches no longer add up to the step's gradient), but an error that keeps the sum
(a gradient shared by the batch credited to one example) would not. So a model is checked first, on a small
synthetic batch of unequal, padded rows: each row's captured gradient against its own autograd backward, for
every trainable parameter. It costs one forward and three backward passes over two short rows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from behaviortrace.config.sections import Config
from behaviortrace.gradients.batch import completion_logps, pad_batch
from behaviortrace.gradients.per_example import Capture, param_layout, rule_of
from behaviortrace.model import models
from behaviortrace.sketch.maps import materialize


class UnsupportedModel(ValueError):
    """Per-example capture cannot be trusted on this model; the message says which parameters and why."""


def _probe_batch(vocab: int, pad_id: int | None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two rows of different prompt and completion lengths (so both paddings occur), ids drawn from the whole
    vocabulary but the pad id, with a local generator (the global random state is left alone)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=gen)
    ids = ids[ids != pad_id][:16].tolist() if pad_id is not None else ids[:16].tolist()
    prompts, completions = [ids[0:3], ids[3:8]], [ids[8:12], ids[12:14]]
    batch = pad_batch(prompts, completions, pad_id if pad_id is not None else 0)
    batch["advantages"] = torch.tensor([1.0, -0.7])
    return batch


def _loss(model, batch: dict) -> torch.Tensor:
    """Per-row losses: a weighted sum of each completion's token log-probs (every parameter gets a gradient)."""
    logps = completion_logps(model, batch, temperature=1.0)
    return (logps * batch["completion_mask"] * batch["advantages"].unsqueeze(1)).sum(-1)


def capture_problems(model, pad_id: int | None, tolerance: float) -> list[str]:
    """What per-example capture gets wrong on `model` (empty when every trainable parameter's per-example
    gradient matches autograd within `tolerance`, relative). The model's weights, mode and `.grad` are left as
    they were (`.grad` cleared)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    batch = {k: v.to(device) for k, v in _probe_batch(model.get_input_embeddings().num_embeddings, pad_id).items()}
    layout = param_layout(model)
    rule = {}  # parameter identity -> (owning module's class, its capture rule)
    for m in model.modules():
        for _, p in m.named_parameters(recurse=False):
            rule.setdefault(id(p), (type(m).__name__, rule_of(m)))
    names = {n: id(p) for n, p in model.named_parameters() if p.requires_grad}
    problems: list[str] = []
    try:
        with Capture(model) as cap:
            _loss(model, batch).sum().backward()
            grads = cap.finish()
    except (RuntimeError, TypeError, ValueError) as err:
        model.train(was_training)
        return [f"capture fails on a forward and backward pass: {err}"]
    worst: dict[str, float] = {}
    try:
        for row in range(2):
            model.zero_grad(set_to_none=True)
            picked = grads.select(torch.tensor([row], device=device))
            _loss(model, {k: v[row : row + 1] for k, v in batch.items()}).sum().backward()
            reference = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
            total = float(sum((g.float().norm() ** 2 for g in reference.values() if g is not None), torch.tensor(0.0)))
            floor = 1e-6 * total**0.5
            for name, shape in layout.items():
                want = reference[name]
                want = torch.zeros(shape[1], device=device) if want is None else want.float()
                if name not in picked.matrix and name not in picked.dense:
                    got = torch.zeros_like(want)
                else:
                    got = materialize(picked, {name: shape})[name][0]
                err = float((got - want).norm()) / max(float(want.norm()), floor, 1e-30)
                worst[name] = max(worst.get(name, 0.0), err)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    for name, err in worst.items():
        if err > tolerance:
            module, how = rule[names[name]]
            problems.append(
                f"{name} ({module}, {how} rule): per-example gradient off by {err:.1e} (relative) from autograd"
            )
    return problems


def check_capture(model, pad_id: int | None, tolerance: float, model_name: str) -> None:
    """Refuse a model whose per-example gradients capture gets wrong, before anything trains on it."""
    problems = capture_problems(model, pad_id, tolerance)
    if problems:
        shown = "\n  ".join(problems[:8]) + (f"\n  ... and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise UnsupportedModel(
            f"model {model_name!r} ({type(model).__name__}): per-rollout gradients cannot be captured correctly "
            f"on this architecture, in either sketch.mode (both read them off module hooks):\n  {shown}"
        )


def capture_tolerance(model) -> float:
    """How far (relative) a captured per-example gradient may be from autograd's in the model's dtype: the
    self-check tolerance (sketch/tolerance.py). The preflight runs outside autocast, in the weights' dtype (float32
    also for compute.dtype bfloat16), so the capture rules are checked at float32's precision; what bf16 autocast
    adds is checked by the self-check of every trained step."""
    from behaviortrace.sketch.tolerance import tolerance_for

    return tolerance_for(str(next(model.parameters()).dtype).removeprefix("torch."))


def training_model(cfg: Config, base_model: Path, device: dict, seed: int):
    """The model TRL trains: the base model, or with `model.lora` the base model under fresh adapters (drawn with the
    training `seed`), checked (sketch/preflight.py) like the base model was, since the adapters are modules of
    their own."""
    model, tokenizer = models.load(base_model, device)
    if cfg.model.lora.enabled:
        from behaviortrace.model import lora

        model = lora.wrap(model, cfg.model.lora, base_model, seed)
        check_capture(model, tokenizer.pad_token_id, capture_tolerance(model), f"{cfg.model.name} with LoRA")
    return model, tokenizer
