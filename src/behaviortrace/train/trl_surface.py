"""Everything this project knows about TRL's internals, in one place (trl 1.16.0, pinned).

- `HOOKED_METHODS`: the private GRPOTrainer methods the rollout logger overrides, with their
  signatures; `tests/test_trl_surface.py` fails when an upgrade changes them.
- `install_hooks(trainer, hooks)`: routes a GRPOTrainer's private steps through the named hooks of `Hooks`
  (`on_rewards`, `on_generation_batch`, `explores`, `forced_rows`, `loss_pass`, `before_clip`, `on_clip`,
  `before_checkpoint`, `after_checkpoint`), so the rest of the code never overrides a private method itself;
  `hooked_trainer_base()` is a GRPOTrainer that hooks itself.
- The fused LM head TRL computes its loss's log-probs with (`FUSED_HEAD_FLAG`, `fused_head_backbone`,
  `fused_head_transform`, `fused_head_unsupported`), and `ROW_KEY`, which follows each row through TRL's
  shuffle of a generation batch: what sketch/loss_pass.py needs to read per-rollout gradients off TRL's
  own loss pass.
- `forcing_prefix`: makes every completion of a generation call open with given tokens (TRL generates
  with transformers' `generate` on one process); the planted exploration generates chosen rows again with it.
- `grpo_args`, `optimizer_and_schedule`: the GRPOConfig of a run and the optimizer and schedule
  transformers' Trainer builds from it.
- `rollout_losses`, `token_weights`: TRL's per-token loss and its normalization per loss type, split
  into one term per rollout (on-policy: importance ratio 1).
- `group_advantages`: TRL's group-relative advantages, with rows left out; `weighted_advantages`: the same with a
  data weight per rollout (frequency weights: 1 counts a rollout once, 0 drops it), differentiable in the weights.

torch, transformers and trl are imported inside the functions: config validation reads
`SKETCHABLE_LOSSES` at workflow parse time without loading them.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager, nullcontext
from functools import cache
from pathlib import Path

import numpy as np

from behaviortrace.config.sections import Grpo

TRL_VERSION = "1.16.0"
# Loss types whose per-rollout split `token_weights` implements.
SKETCHABLE_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
# Private GRPOTrainer methods the hooks override, and their parameters in trl 1.16.
HOOKED_METHODS = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_clip_grad_norm": ["self", "model"],
    "_compute_loss": ["self", "model", "inputs"],
    "_generate_single_turn": [
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ],
}
# TRL calls the model with this keyword set to True to get per-token log-probs (and entropy) from a fused
# LM head that reads `lm_head.weight` directly; the head scores `last_hidden_state[:, :-1]` of the backbone
# against `labels[:, 1:]`, at the sampling temperature.
FUSED_HEAD_FLAG = "fused_lm_head"
# TRL shuffles a generation batch's rows before its loss sees them; this key, added to every training
# generation batch, travels with the rows and tells the loss pass each row's place in generation order.
ROW_KEY = "behaviortrace_row"
# Keys of `_generate_and_score_completions`' output that the logger reads.
GENERATION_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")


class Hooks:
    """What `install_hooks` calls, as no-ops: a subclass fills in the hooks it needs."""

    def on_rewards(self, completions: list, completion_ids: list, rewards) -> None:
        """The [N, reward functions] rewards TRL computed, with the raw completions."""

    def on_generation_batch(self, inputs: list[dict], out: dict) -> None:
        """A training generation batch: TRL's token ids, masks and advantages (GENERATION_KEYS)."""

    def explores(self) -> bool:
        """Whether `forced_rows` may ask for rows of a training generation batch to be generated again."""
        return False

    def forced_rows(self, inputs: list[dict], completion_ids: list[list[int]]) -> tuple[list[int], list[int]]:
        """Rows of a training generation batch to generate again, and the token ids they must open with."""
        return [], []

    def loss_pass(self, inputs: dict):
        """A context around TRL's loss forward of a step (its backward runs right after the context)."""
        return nullcontext()

    def before_clip(self) -> None:
        """The step's gradient is in the parameters' `.grad`, not yet clipped or applied."""

    def on_clip(self, grad_norm: float) -> None:
        """The step's gradient norm before clipping."""

    def before_checkpoint(self) -> None:
        """Called before a checkpoint is written."""

    def after_checkpoint(self, path: Path) -> None:
        """Called after a checkpoint is written."""


def install_hooks(trainer, hooks: Hooks) -> None:
    """Route the private steps of `trainer`, a GRPOTrainer (or a subclass of one), through the methods of `hooks`.

    The steps are replaced on the instance, not its class: the workflow's trainer hooks itself this way, and a
    user's own GRPOTrainer is hooked by the same code (api.py)."""
    import torch

    plain = {name: getattr(trainer, name) for name in HOOKED_METHODS}

    def _calculate_rewards(inputs, prompts, completions, completion_ids_list):
        rewards = plain["_calculate_rewards"](inputs, prompts, completions, completion_ids_list)
        hooks.on_rewards(list(completions), [list(map(int, c)) for c in completion_ids_list], rewards)
        return rewards

    def _generate_and_score_completions(inputs):
        training = trainer.model.training
        trainer._generation_inputs = inputs if training else None
        out = plain["_generate_and_score_completions"](inputs)
        if training:
            hooks.on_generation_batch(inputs, out)
            out[ROW_KEY] = torch.arange(len(out["advantages"]), device=out["advantages"].device)
        return out

    def _generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        args = (images, multimodal_fields, num_generations, has_tool_images)
        completion_ids, logprobs = plain["_generate_single_turn"](prompt_ids, *args)
        inputs = getattr(trainer, "_generation_inputs", None)
        if inputs is None or not hooks.explores():
            return completion_ids, logprobs
        if len(prompt_ids) != len(inputs) or images is not None or logprobs is not None:
            raise RuntimeError("exploration needs one text-only generation call per batch (no vLLM, no tools)")
        rows, prefix = hooks.forced_rows(inputs, completion_ids)
        if rows:
            with forcing_prefix(trainer.model, prefix):
                again, _ = plain["_generate_single_turn"]([prompt_ids[r] for r in rows], *args)
            completion_ids = list(completion_ids)
            for r, ids in zip(rows, again, strict=True):
                completion_ids[r] = ids
        return completion_ids, logprobs

    def _compute_loss(model, inputs):
        with hooks.loss_pass(inputs):
            return plain["_compute_loss"](model, inputs)

    def _clip_grad_norm(model):
        hooks.before_clip()
        norm = plain["_clip_grad_norm"](model)
        hooks.on_clip(float(norm))
        return norm

    def _save_checkpoint(model, trial):
        hooks.before_checkpoint()
        plain["_save_checkpoint"](model, trial)
        hooks.after_checkpoint(Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}")

    hooked = {
        "_calculate_rewards": _calculate_rewards,
        "_generate_and_score_completions": _generate_and_score_completions,
        "_save_checkpoint": _save_checkpoint,
        "_clip_grad_norm": _clip_grad_norm,
        "_compute_loss": _compute_loss,
        "_generate_single_turn": _generate_single_turn,
    }
    assert set(hooked) == set(HOOKED_METHODS)
    for name, method in hooked.items():
        setattr(trainer, name, method)


@cache
def hooked_trainer_base() -> type:
    """GRPOTrainer with its private steps routed to its own hook methods (`Hooks`, no-ops here)."""
    from trl import GRPOTrainer

    class HookedGRPOTrainer(Hooks, GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            install_hooks(self, self)

    return HookedGRPOTrainer


@contextmanager
def forcing_prefix(model, prefix: list[int]):
    """While open, every completion `model.generate` samples opens with the token ids `prefix`.

    TRL generates with `unwrapped_model.generate(...)`, the model itself on one process.
    """
    from transformers import LogitsProcessorList

    plain = type(model).generate

    def generate(*args, **kwargs):
        kwargs["logits_processor"] = LogitsProcessorList([ForcedPrefix(prefix)])
        return plain(model, *args, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate


class ForcedPrefix:
    """A logits processor: every row can only take the prefix's next token until it is spelled out."""

    def __init__(self, prefix: list[int]):
        self.prefix = prefix
        self.start = None

    def __call__(self, input_ids, scores):
        if self.start is None:
            self.start = input_ids.shape[1]  # the padded prompt's width: the first call is the first new token
        at = input_ids.shape[1] - self.start
        if at < len(self.prefix):
            scores[:] = float("-inf")
            scores[:, self.prefix[at]] = 0.0
        return scores


def fused_head_backbone(model):
    """The module whose output's `last_hidden_state` the fused head projects (transformers 5: `base_model`; under a
    LoRA adapter TRL patches the transformers model inside it)."""
    from behaviortrace.model.lora import unwrap

    return unwrap(model).base_model


def fused_head_transform(model) -> tuple[float, float | None]:
    """The logit scale and final softcapping TRL's fused head applies to `hidden @ W.T + b` before dividing by the
    temperature: z = softcap * tanh(scale * y / softcap) (no tanh without softcapping). Read from the model config
    as trl 1.16's `add_fused_lm_head` reads them (Gemma's softcapping; Cohere's `logit_scale`, Granite's
    `logits_scaling`, Falcon-H1's `lm_head_multiplier` and the like, in its order of precedence)."""
    text = model.config.get_text_config()
    scale = getattr(text, "logit_scale", None)
    if scale is None:
        scale = getattr(text, "output_multiplier", None)
    if scale is None:
        scale = getattr(text, "lm_head_multiplier", None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scale = text.logits_scaling if text.model_type == "hyperclovax" else 1 / text.logits_scaling
    return (1.0 if scale is None else float(scale)), getattr(text, "final_logit_softcapping", None)


def fused_head_unsupported(model) -> str | None:
    """Why the LM head of `model` is not one whose use in TRL's fused kernel sketch/loss_pass.py can rebuild
    (a plain Linear projection, then `fused_head_transform`), or None."""
    import torch

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or type(head).forward is not torch.nn.Linear.forward:
        return f"its output embeddings are a {type(head).__name__}, not a plain Linear projection"
    return None


def grpo_args(grpo: Grpo, out_dir: Path, seed: int, device: dict):
    """The GRPOConfig of a run: on-policy, one optimizer step per generation batch, one batch per step."""
    from trl import GRPOConfig

    on_cuda = device["use_cuda"]
    return GRPOConfig(
        output_dir=str(out_dir),
        seed=seed,
        data_seed=seed,
        max_steps=grpo.steps,
        per_device_train_batch_size=grpo.batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=grpo.num_generations,
        shuffle_dataset=False,
        max_completion_length=grpo.max_new_tokens,
        temperature=grpo.temperature,
        top_p=grpo.top_p,
        learning_rate=grpo.lr,
        lr_scheduler_type=grpo.lr_scheduler,
        warmup_steps=grpo.warmup_steps,
        weight_decay=grpo.weight_decay,
        adam_beta1=grpo.adam_beta1,
        adam_beta2=grpo.adam_beta2,
        adam_epsilon=grpo.adam_epsilon,
        max_grad_norm=grpo.max_grad_norm,
        loss_type=grpo.loss_type,
        beta=grpo.beta,
        scale_rewards=grpo.scale_rewards,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        use_cpu=not on_cuda,
        # Mixed precision: the weights are float32 (common/device.py) and accelerate wraps the model's forward in
        # bf16 autocast, on the CPU (use_cpu) as on CUDA; generation and the loss pass run inside it.
        bf16=device["dtype"] == "bfloat16",
        gradient_checkpointing=False,
        remove_unused_columns=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def optimizer_and_schedule(model, grpo: Grpo, device: dict):
    """The optimizer and learning-rate schedule transformers' Trainer builds for the training run."""
    from transformers import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model=model, args=grpo_args(grpo, Path(tmp), 0, device))
        trainer.create_optimizer_and_scheduler(num_training_steps=grpo.steps)
        return trainer.optimizer, trainer.lr_scheduler


def token_weights(loss_type: str, mask, n_rows: int, num_items: int, max_completion_length: int):
    """The coefficient TRL puts on each token's loss before summing, per loss type. Weighted counts (tensors: the
    exact influence's data weights) keep their precision: a float32 1 / N would put float32 rounding into a float64
    finite difference of the weights."""
    import torch

    counts = [c for c in (n_rows, num_items) if torch.is_tensor(c)]
    mask = mask.to(counts[0].dtype) if counts else mask.float()
    if loss_type == "dapo":
        return mask / num_items
    if loss_type == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / n_rows
    if loss_type == "bnpo":  # TRL divides by the batch's token count; one batch per step here
        return mask / num_items
    if loss_type == "dr_grpo":
        return mask / (n_rows * max_completion_length)
    raise ValueError(
        f"loss type {loss_type!r} is not supported for per-rollout gradients; use one of {SKETCHABLE_LOSSES}"
    )


def rollout_losses(
    logps,
    batch: dict,
    loss_type: str,
    beta: float,
    max_completion_length: int,
    ref_logps=None,
    num_items: int | None = None,
    positions=None,
    n_rows: int | None = None,
):
    """One loss term per rollout; their sum is TRL's loss on the batch (on-policy, before clipping).

    `num_items` (token count) and `n_rows` (rollouts) describe the whole step, which TRL normalizes
    by; they default to the batch given here, so pass them when giving a slice of the step.
    `positions` (0/1 per completion token) keeps only the terms at those positions, normalized as in
    the full loss: the behavior-token share of the rollout's loss.
    """
    import torch

    mask = batch["completion_mask"]
    ratio = torch.exp(logps - logps.detach())  # 1 in value; carries the gradient of the log-prob
    per_token = -ratio * batch["advantages"].unsqueeze(1)
    if beta:
        diff = ref_logps - logps
        # k3 estimator times the importance ratio (TRL's default use_bias_correction_kl=True).
        per_token = per_token + beta * (torch.exp(diff) - diff - 1) * ratio
    items = int(mask.sum()) if num_items is None else num_items
    rows = mask.shape[0] if n_rows is None else n_rows
    # Weighted counts (a tensor: the exact influence's data weights) are clamped as TRL clamps its token count.
    items = items.clamp(min=1) if torch.is_tensor(items) else max(items, 1)
    weights = token_weights(loss_type, mask, rows, items, max_completion_length)
    if positions is not None:
        weights = weights * positions
    return (per_token * weights).sum(-1)


def group_advantages(rewards: np.ndarray, groups: np.ndarray, keep: np.ndarray, scale_rewards: str) -> np.ndarray:
    """TRL's advantages of one step with the rows where `keep` is False dropped from their groups.

    Dropped rows count as unscorable (NaN): they leave the group mean and standard deviation, as TRL
    treats a completion no reward function scored. A group left with one rollout has no spread and gets
    advantage 0. Returned for every row (dropped rows: 0).
    """
    import torch

    r = torch.tensor(np.where(keep, rewards, np.nan), dtype=torch.float32)
    g = torch.tensor(np.asarray(groups))
    mean = torch.zeros_like(r)
    std = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = g == gid
        mean[idx] = torch.nanmean(r[idx])
        if scale_rewards == "group":
            std[idx] = _nanstd(r[idx])
    if scale_rewards == "batch":
        std[:] = _nanstd(r)
    adv = r - mean
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0).numpy().astype(np.float64) * keep


def weighted_advantages(rewards, same_group, weights, scale_rewards: str):
    """TRL's advantages of one step with a data weight per rollout, in torch and differentiable in the weights.

    The weights are frequency weights: a group's mean is sum(w r) / sum(w) and its variance
    sum(w (r - mean)^2) / (sum(w) - 1), so that every weight 1 gives TRL's mean and Bessel-corrected std, and a
    weight 0 drops the rollout (TRL's NaN-aware statistics of the rest, as `group_advantages`). `rewards` [B]
    (NaN: unscorable, weight 0 and advantage 0, as TRL), `same_group` [B, B] (1 where two rows share a prompt),
    `weights` [B], or [B, B] with row z's advantage computed from the weights of row z (how the exact influence
    tells a rollout's own weight from its siblings'). A group whose weighted rewards are all equal has residuals
    exactly 0 at every weight; a group (or batch, for scale_rewards batch) of weight sum 1 or less has no std,
    and advantage 0 as TRL's NaN std gives it.
    """
    import torch

    n = rewards.shape[-1]
    valid = ~torch.isnan(rewards)
    r = torch.where(valid, rewards, 0)
    w = (weights if weights.dim() == 2 else weights.unsqueeze(-2).expand(n, n)) * valid
    in_group = w * same_group
    mean = _weighted_mean(in_group, r)
    varies = ((in_group > 0) & (r.unsqueeze(-2) != r.unsqueeze(-1))).any(-1) & valid
    residual = torch.where(varies, r - mean, 0)
    if scale_rewards == "none":
        return residual
    spread = in_group if scale_rewards == "group" else w
    center = mean if scale_rewards == "group" else _weighted_mean(w, r)
    dof = spread.sum(-1) - 1
    var = (spread * (r.unsqueeze(-2) - center.unsqueeze(-1)) ** 2).sum(-1) / torch.where(dof > 0, dof, 1)
    std = torch.sqrt(torch.where(var > 0, var, 1)) * (var > 0)  # no infinite derivative of sqrt at 0
    return torch.where(dof > 0, residual / (std + 1e-4), 0)


def _weighted_mean(w, r):
    """Each row's weighted mean of r with the weights in that row of w (0 where they sum to 0)."""
    import torch

    total = w.sum(-1)
    return (w * r).sum(-1) / torch.where(total > 0, total, 1)


def _nanstd(x):
    """Bessel-corrected standard deviation over the non-NaN values; NaN for fewer than two."""
    import torch

    n = int((~torch.isnan(x)).sum())
    if n < 2:
        return torch.tensor(float("nan"))
    mean = torch.nanmean(x)
    return torch.sqrt(torch.nanmean((x - mean) ** 2) * n / (n - 1))


def config_problems(cfg) -> list[str]:
    """Per-rollout gradients split TRL's loss only for the loss types `token_weights` implements (a config rule)."""
    if cfg.grpo.loss_type in SKETCHABLE_LOSSES:
        return []
    return [
        f"config key grpo.loss_type = {cfg.grpo.loss_type!r}: per-rollout gradients are implemented "
        f"for {', '.join(SKETCHABLE_LOSSES)} only"
    ]
