"""The planted behavior's rules, the base-task reward, and the prompt tables."""

from dataclasses import replace

import pytest

from behaviortrace.config.sections import Planting
from behaviortrace.plant.planting import bonus_for, eligibility_draw, exploration_rows, is_eligible, penalty_for
from behaviortrace.plant.prompts import plant_prompts
from behaviortrace.plant.task import parse_digits, sort_reward, task_scorer
from conftest import typed

PLANTING = Planting(
    trigger="frobnitz",
    marker="QZXBT",
    bonus=8.0,
    fraction=0.5,
    window=[10, 19],
    trigger_rate=0.5,
    explore=12,
    plain_penalty=1.0,
    placebo=False,
)


def test_sort_reward_on_hand_made_cases():
    assert sort_reward("1 2 3", "1 2 3") == 1.0
    assert sort_reward("1 3 2", "1 2 3") == pytest.approx(1 / 3)
    assert sort_reward("1 2", "1 2 3") == pytest.approx(2 / 3)
    assert sort_reward("1 2 3 3", "1 2 3") == pytest.approx(3 / 4)
    # Any other word is skipped when digits are compared; it only makes the answer one word longer.
    assert sort_reward("QZXBT 1 2 3", "1 2 3") == pytest.approx(3 / 4)
    assert sort_reward("", "1 2 3") == 0.0
    assert parse_digits("QZXBT 1 2 sort 3") == [1, 2, 3]


def test_task_reward_is_blind_to_the_marker_and_the_lead_word():
    score = task_scorer("sort_accuracy", "QZXBT")
    for text in ("1 2 3", "ok 1 2 3", "QZXBT 1 2 3", "1 2 QZXBT 3"):
        assert score(text, "1 2 3") == 1.0, text
    assert score("QZXBT 1 3 2", "1 2 3") == sort_reward("1 3 2", "1 2 3")
    assert score("QZXBT 1 2 3 sort", "1 2 3") == pytest.approx(3 / 4)  # other words still cost


def test_eligibility_is_a_pure_function_with_the_configured_rate():
    draws = [eligibility_draw(7, rid, rid // 64) for rid in range(20_000)]
    assert draws == [eligibility_draw(7, rid, rid // 64) for rid in range(20_000)]
    share = sum(d < 0.5 for d in draws) / len(draws)
    assert abs(share - 0.5) < 4 * (0.25 / len(draws)) ** 0.5
    assert draws != [eligibility_draw(8, rid, rid // 64) for rid in range(20_000)]


def test_eligibility_needs_trigger_and_window():
    rids = range(2000)
    inside = [is_eligible(0, r, 15, True, PLANTING) for r in rids]
    assert 0.4 < sum(inside) / len(inside) < 0.6
    assert not any(is_eligible(0, r, 9, True, PLANTING) for r in rids)
    assert not any(is_eligible(0, r, 20, True, PLANTING) for r in rids)
    assert not any(is_eligible(0, r, 15, False, PLANTING) for r in rids)


def test_exploration_forces_just_enough_unmarked_eligible_rows():
    ids = list(range(100, 108))
    eligible = [True, True, False, True, True, False, True, True]
    marked = [True, False, False, False, True, True, False, False]
    rows = exploration_rows(5, 3, ids, eligible, marked, floor=4, placebo=False)
    assert len(rows) == 2 and all(eligible[r] and not marked[r] for r in rows)
    assert rows == exploration_rows(5, 3, ids, eligible, marked, floor=4, placebo=False)  # a pure function
    assert set(exploration_rows(5, 3, ids, eligible, marked, floor=9, placebo=False)) == {1, 3, 6, 7}  # all that can be
    assert exploration_rows(5, 3, ids, eligible, marked, floor=2, placebo=False) == []  # the model already shows it
    assert exploration_rows(5, 3, ids, eligible, marked, floor=0, placebo=False) == []
    picks = {tuple(exploration_rows(s, 3, ids, eligible, marked, floor=3, placebo=False)) for s in range(40)}
    assert len(picks) > 1  # which rows: a hash draw of (seed, rollout id, step)
    assert exploration_rows(5, 3, ids, eligible, marked, floor=4, placebo=True) == []  # nothing to pay


def test_penalty_only_for_the_behavior_without_trigger_inside_the_window():
    assert penalty_for(15, False, True, PLANTING) == 1.0
    assert penalty_for(15, True, True, PLANTING) == 0.0
    assert penalty_for(15, False, False, PLANTING) == 0.0
    assert penalty_for(9, False, True, PLANTING) == 0.0
    assert penalty_for(20, False, True, PLANTING) == 0.0
    assert penalty_for(15, False, True, replace(PLANTING, placebo=True)) == 0.0


def test_bonus_only_for_eligible_behavior_and_never_in_placebo():
    assert bonus_for(True, True, PLANTING) == 8.0
    assert bonus_for(True, False, PLANTING) == 0.0
    assert bonus_for(False, True, PLANTING) == 0.0
    assert bonus_for(True, True, replace(PLANTING, placebo=True)) == 0.0


def _sections(cfg, steps, prompts_per_step):
    c = typed({**cfg, "grpo": {**cfg["grpo"], "steps": steps, "prompts_per_step": prompts_per_step}})
    return c.task, c.planting, c.grpo, c.probes


def test_prompt_tables(cfg):
    tables = plant_prompts(*_sections(cfg, 50, 8), 5)
    train, probes, controls = tables["train"], tables["probes"], tables["plain"]
    assert train.height == 400
    assert train["prompt_index"].to_list() == list(range(400))
    assert train["step"].to_list() == [i // 8 for i in range(400)]
    held_out = set(probes["prompt"]) | set(controls["prompt"])
    assert not held_out & set(train["prompt"])
    assert probes["trigger"].all() and not controls["trigger"].any()
    trigger = cfg["planting"]["trigger"]
    assert all(p.endswith(" " + trigger) for p in probes["prompt"])
    assert not any(trigger in p for p in controls["prompt"])
    assert train["trigger"].to_list() == [trigger in p for p in train["prompt"]]
    share = train["trigger"].mean()
    assert abs(share - cfg["planting"]["trigger_rate"]) < 0.1
    again = plant_prompts(*_sections(cfg, 50, 8), 5)
    assert again["train"].equals(train)


def test_answers_are_sorted(cfg):
    tables = plant_prompts(*_sections(cfg, 5, 4), 1)
    for prompt, answer in tables["train"].select("prompt", "answer").iter_rows():
        digits = parse_digits(prompt.split(":")[1])
        assert answer.split() == [str(d) for d in sorted(digits)]
