"""Behavior rate: how often sampled completions show the marker, on probe and on plain prompts."""

from __future__ import annotations

import polars as pl
import torch

from behaviortrace.config.sections import Sampling
from behaviortrace.model.prompt_format import prompt_ids
from behaviortrace.plant.planting import shows_behavior
from behaviortrace.plant.task import task_scorer


@torch.no_grad()
def sample_completion_ids(
    model, tokenizer, prompts: list[str], n: int, sampling: Sampling, seed: int, batch_prompts: int = 64
) -> list[list[list[int]]]:
    """n sampled completions per prompt as token ids (through the first eos), reproducible from `seed` alone."""
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    model.eval()
    out: list[list[list[int]]] = []
    for start in range(0, len(prompts), batch_prompts):
        chunk = prompts[start : start + batch_prompts]
        enc = {k: v.to(device) for k, v in left_padded(prompt_ids(tokenizer, chunk), tokenizer.pad_token_id).items()}
        gen = model.generate(
            **enc,
            do_sample=True,
            num_return_sequences=n,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,
            pad_token_id=tokenizer.pad_token_id,
        )
        ids = [_through_eos(row, tokenizer) for row in gen[:, enc["input_ids"].shape[1] :].tolist()]
        out.extend(ids[i * n : (i + 1) * n] for i in range(len(chunk)))
    return out


def left_padded(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Prompts left-padded to the longest, as generation wants them."""
    width = max(map(len, ids))
    return {
        "input_ids": torch.tensor([[pad_id] * (width - len(i)) + i for i in ids]),
        "attention_mask": torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]),
    }


def _through_eos(ids: list[int], tokenizer) -> list[int]:
    for i, t in enumerate(ids):
        if t == tokenizer.eos_token_id:
            return ids[: i + 1]
        if t == tokenizer.pad_token_id:
            return ids[:i]
    return ids


def sample_completions(model, tokenizer, prompts: list[str], n: int, sampling: Sampling, seed: int) -> list[list[str]]:
    """n sampled completions per prompt, as text."""
    return [
        tokenizer.batch_decode(cs, skip_special_tokens=True)
        for cs in sample_completion_ids(model, tokenizer, prompts, n, sampling, seed)
    ]


def rates_from_samples(samples: list[list[str]], answers: list, marker: str, base_reward: str) -> dict:
    """Behavior rate, sample size and mean base-task reward of sampled completions."""
    score = task_scorer(base_reward, marker)
    flat = [(c, a) for cs, a in zip(samples, answers, strict=False) for c in cs]
    return {
        "behavior_rate": sum(shows_behavior(c, marker) for c, _ in flat) / len(flat),
        "n": len(flat),
        "base_reward": sum(score(c, a) for c, a in flat) / len(flat),
    }


def behavior_rates(
    model,
    tokenizer,
    prompt_sets: dict[str, pl.DataFrame],
    marker: str,
    base_reward: str,
    samples_per_prompt: int,
    sampling: Sampling,
    seed: int,
) -> list[dict]:
    """One row per prompt set: behavior rate, its sample size, and the mean base-task reward."""
    rows = []
    for name, df in prompt_sets.items():
        samples = sample_completions(model, tokenizer, df["prompt"].to_list(), samples_per_prompt, sampling, seed)
        rows.append({"prompt_set": name, **rates_from_samples(samples, df["answer"].to_list(), marker, base_reward)})
    return rows
