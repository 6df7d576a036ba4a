"""plant_data: training prompts in training order, and held-out probe and plain prompts."""

from __future__ import annotations

import random

import polars as pl

from behaviortrace.config.sections import Grpo, Planting, Probes, Task
from behaviortrace.plant.planting import add_trigger
from behaviortrace.plant.task import make_sort_example, render_prompt, sorted_answer


def _example(rng: random.Random, task: Task, trigger: str | None) -> dict:
    words, digits = make_sort_example(rng, task.min_len, task.max_len)
    prompt = render_prompt(words, digits)
    if trigger is not None:
        prompt = add_trigger(prompt, trigger)
    return {"prompt": prompt, "answer": sorted_answer(digits), "trigger": trigger is not None}


def plant_prompts(task: Task, planting: Planting, grpo: Grpo, probes: Probes, seed: int) -> dict[str, pl.DataFrame]:
    """Build the three prompt tables. Probe and plain prompts are drawn first and never reused for training."""
    rng = random.Random(seed)
    held_out: set[str] = set()

    def draw_unique(n: int, trigger: str | None) -> list[dict]:
        rows, tries = [], 0
        while len(rows) < n:
            tries += 1
            if tries > 100 * n + 1000:
                raise ValueError(f"could not draw {n} distinct held-out prompts; widen task.min_len/task.max_len")
            row = _example(rng, task, trigger)
            if row["prompt"] not in held_out:
                held_out.add(row["prompt"])
                rows.append(row)
        return rows

    probe_rows = draw_unique(probes.n_probes, planting.trigger)
    plain_rows = draw_unique(probes.n_plain, None)

    train_rows = []
    n_prompts = grpo.steps * grpo.prompts_per_step
    while len(train_rows) < n_prompts:
        trigger = planting.trigger if rng.random() < planting.trigger_rate else None
        row = _example(rng, task, trigger)
        if row["prompt"] in held_out:
            continue
        i = len(train_rows)
        train_rows.append(
            {"prompt_index": i, "step": i // grpo.prompts_per_step, "group_id": i % grpo.prompts_per_step, **row}
        )

    return {
        "train": pl.DataFrame(train_rows),
        "probes": pl.DataFrame(probe_rows).with_row_index("probe_index"),
        "plain": pl.DataFrame(plain_rows).with_row_index("probe_index"),
    }
