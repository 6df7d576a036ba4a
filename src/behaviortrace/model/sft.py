"""Supervised training on (prompt, completion) pairs: the tiny model's pre-training and the SFT warm-up."""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch

from behaviortrace.common.device import autocast
from behaviortrace.model.prompt_format import render

log = logging.getLogger(__name__)


def completion_batch(pairs, tokenizer) -> dict[str, torch.Tensor]:
    """Right-padded inputs with the loss on completion tokens and the closing eos only; prompts as the model sees
    them in training (model/prompt_format.py)."""
    seqs, labels = [], []
    for prompt, completion in pairs:
        p = render(tokenizer, prompt).ids
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    lab = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return {"input_ids": ids, "attention_mask": mask, "labels": lab}


def train_on_pairs(
    model,
    tokenizer,
    pairs_fn,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    log_every: int = 50,
    device: dict | None = None,
):
    """Causal-LM training on freshly drawn pairs (loss on the completion), with a one-cycle schedule; the forward
    and backward passes in `device`'s precision (common/device.py: bf16 autocast for compute.dtype bfloat16, the
    float32 weights updated by AdamW; float32 without one)."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    where = next(model.parameters()).device
    precision = autocast(device) if device is not None else nullcontext()
    model.train()
    for step in range(steps):
        batch = {
            k: v.to(where) for k, v in completion_batch([pairs_fn() for _ in range(batch_size)], tokenizer).items()
        }
        with precision:
            loss = model(**batch).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            log.info("supervised step %d/%d loss %.4f", step + 1, steps, loss.item())
    model.eval()
    return model
