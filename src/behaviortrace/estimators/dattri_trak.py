"""TRAK as dattri implements it, on the model's own gradients: an estimator that needs the model
(score/model_run.py), from the `peers` extra.

At each checkpoint c, dattri's TRAKAttributor projects the gradient of each rollout that c generated (its share of
the step's GRPO loss with its logged advantage) with its own random projection (`proj_dim`, `proj_seed`), forms
(Phi^T Phi + regularization I)^-1 from them, and scores them against the target's gradient at the analysis
checkpoint at or before c; TRAK's weight 1 - p is 1 (the loss is not a likelihood of a label). Minus the value, as
in `trak`: positive means the rollout's update raised the target. `trak` does the same on the harness's sketches
with one kernel over the whole run (tests/test_peers.py shows the two agree on the same features and damping).

dattri takes per-example gradients with torch.func (vmap over a functional model), so the attention mask goes in
as a 4-D additive mask: transformers builds a 2-D one with data-dependent branches that vmap cannot trace.
"""

from __future__ import annotations

import logging

USES_TARGET = True
NEEDS_MODEL = True
STEP_AGGREGATE = "sum"
REQUIRES = ("dattri",)
# What the estimator preflight (score/preflight.py) runs it with: its eight synthetic rollouts need a projection
# below their count, or the kernel is singular without a ridge.
PREFLIGHT_SETTINGS = {"proj_dim": 4}

log = logging.getLogger(__name__)


def check(
    proj_dim: int = 512, proj_seed: int = 0, regularization: float = 0.0, batch_size: int = 32, layers=None
) -> list[str]:
    """Problems with the settings, each naming its key (checked when the workflow starts)."""
    problems = [] if layers is None or isinstance(layers, list) else [f"layers {layers!r} must be a list or null"]
    for key, value in (("proj_dim", proj_dim), ("batch_size", batch_size)):
        if not (isinstance(value, int) and value >= 1):
            problems.append(f"{key} {value!r} must be a positive integer")
    if not (isinstance(regularization, int | float) and regularization >= 0):
        problems.append(f"regularization {regularization!r} must be 0 or more")
    return problems


def score(
    run,
    target,
    proj_dim: int = 512,
    proj_seed: int = 0,
    regularization: float = 0.0,
    batch_size: int = 32,
    layers: list[str] | None = None,
):
    """`layers`: the parameter names whose gradients are projected (dattri's layer_name); null: every trainable
    parameter. `regularization` is dattri's: added to the diagonal of Phi^T Phi, whose rows are the projections of
    the gradients divided by the square root of the model's trainable parameter count."""
    problems = check(proj_dim, proj_seed, regularization, batch_size, layers)
    if problems:
        raise ValueError("; ".join(problems))

    def values(c, rows, at):
        if not regularization and rows.sum() < proj_dim:
            raise ValueError(
                f"dattri_trak: checkpoint {c} generated {rows.sum()} rollouts with a gradient, fewer than proj_dim "
                f"= {proj_dim}, so the kernel is singular: set estimators.<instance>.regularization above 0 or a "
                "smaller proj_dim"
            )
        model, tokenizer = run.load(int(c))
        kwargs = {"proj_dim": proj_dim, "proj_seed": proj_seed, "proj_max_batch_size": batch_size, "device": "cpu"}
        return trak_values(
            run, target, model, tokenizer.pad_token_id, run.rows(rows), at, kwargs, regularization, layers
        )

    return run.score_per_checkpoint(target, "dattri_trak", values)


def trak_values(run, target, model, pad_id, rows, at, projector: dict, regularization: float, layers=None):
    """[rows] dattri's TRAK value of each rollout for f (the mean over the target's items)."""
    from dattri.algorithm.trak import TRAKAttributor
    from dattri.task import AttributionTask
    from torch.utils.data import DataLoader

    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    names = trainable if layers is None else layers
    unknown = sorted(set(names) - set(trainable))
    if unknown:
        raise ValueError(f"dattri_trak layers: {', '.join(unknown)} are not trainable parameters of the model")
    device = run.device["device"]
    features = _Features(run, target, model, pad_id)
    task = AttributionTask(
        loss_func=features.loss, target_func=features.loss, model=model, checkpoints=model.state_dict()
    )
    attributor = TRAKAttributor(
        task=task,
        correct_probability_func=_no_label,
        projector_kwargs={**projector, "device": device},  # a full dict: dattri updates a module-level default
        layer_name=names,
        device=device,
        regularization=regularization,
    )
    batch = projector["proj_max_batch_size"]
    attributor.cache(DataLoader(rows, batch_size=batch, shuffle=False, collate_fn=features.rollouts))
    items = DataLoader(target.items[at], batch_size=batch, shuffle=False, collate_fn=features.items)
    values = attributor.attribute(items)  # [rows, items]
    return values.double().mean(1).cpu().numpy()  # f is the items' mean


def _no_label(params, data):
    import torch

    return torch.zeros(())


def _four_d(mask, dtype):
    """[1, 1, L, L] additive causal mask of one sequence with padding (0 where allowed)."""
    import torch

    width = mask.shape[0]
    allowed = torch.tril(torch.ones(width, width, dtype=torch.bool, device=mask.device)) & mask.bool()[None, :]
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[None, None]


class _Features:
    """dattri's loss and target functions (one per-example function for both) and the batches they read.

    An example is (input ids, attention mask, position ids, completion ids, token weights, token coefficients,
    reference log-probs, KL weight); its value is sum_t weight_t (coef_t r_t + beta (exp(d_t) - d_t - 1) r_t),
    r_t = exp(logp_t - stop_grad(logp_t)) (1 in value, the log-prob's gradient), d_t = ref_t - logp_t: a rollout's
    loss term (train/trl_surface.py) with coef -advantage, or a target item's summed marker log-probs with the
    marker positions as weights and coef 1.
    """

    def __init__(self, run, target, model, pad_id):
        self.run, self.target, self.model, self.pad_id = run, target, model, pad_id
        self.temperature = run.grpo.temperature
        self.dtype = next(model.parameters()).dtype

    def loss(self, params, data):
        import torch

        ids, attention, positions, completion, weights, coef, ref, beta = data
        width = completion.shape[0]
        out = torch.func.functional_call(
            self.model,
            params,
            args=(),
            kwargs={
                "input_ids": ids[None],
                "attention_mask": _four_d(attention, self.dtype),
                "position_ids": positions[None],
                "use_cache": False,
            },
        )
        logits = out.logits[0, -width - 1 : -1].float() / self.temperature
        logp = torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]
        ratio = torch.exp(logp - logp.detach())
        diff = ref - logp
        return (weights * (coef * ratio + beta * (torch.exp(diff) - diff - 1) * ratio)).sum()

    def rollouts(self, rows: list[dict]):
        import torch

        batch = self.run.batch(rows)
        weights = self.run.token_weights(batch)
        coef = -batch["advantages"][:, None].expand_as(weights)
        ref = self.run.reference_logps(batch) if self.run.grpo.beta else torch.zeros_like(weights)
        beta = torch.full((len(rows),), float(self.run.grpo.beta))
        return self._pack(batch, batch["position_ids"], weights, coef, ref, beta)

    def items(self, items: list):
        import torch

        batch = self.target.batch(items, self.pad_id)
        width = batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1]
        positions = torch.arange(width).expand(len(items), width)  # as the targets job ran them
        weights = batch["positions"]
        zeros = torch.zeros_like(weights)
        return self._pack(batch, positions, weights, torch.ones_like(weights), zeros, torch.zeros(len(items)))

    @staticmethod
    def _pack(batch, positions, weights, coef, ref, beta):
        import torch

        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        return ids, attention, positions, batch["completion_ids"], weights.float(), coef.float(), ref.float(), beta
