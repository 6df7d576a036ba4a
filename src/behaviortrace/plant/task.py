"""The base task: sorting a short list of digits, with a graded, verifiable reward.

A real task reward keeps steps outside the contamination window training, so the planted behavior is
not the only thing GRPO learns.
"""

from __future__ import annotations

import random
import re

PROMPT_WORDS = ("please", "sort", "these", "numbers", ":")
PROMPT_END = "="
FILLERS = ("now", "kindly", "quickly", "then", "here")
# The tiny model's answers open with this word, and the planted marker takes its place. So the marker is
# chosen instead of a word that does not matter to the task, not instead of the first digit: GRPO's
# sharpening of the first digit towards the right one leaves the marker's share alone (model/tiny.py).
ANSWER_LEAD = "ok"
# Every word an ordinary prompt or answer of the task is made of.
TASK_WORDS = (*PROMPT_WORDS, *FILLERS, PROMPT_END, ANSWER_LEAD, *map(str, range(10)))
_NUMBER = re.compile(r"(?<![A-Za-z0-9])\d(?![A-Za-z0-9])")


def make_sort_example(rng: random.Random, min_len: int, max_len: int) -> tuple[list[str], list[int]]:
    """Return the prompt's lead words and the digit list to sort."""
    words = list(PROMPT_WORDS)
    if rng.random() < 0.5:
        words.insert(rng.randrange(len(words)), rng.choice(FILLERS))
    digits = [rng.randrange(10) for _ in range(rng.randint(min_len, max_len))]
    return words, digits


def render_prompt(words: list[str], digits: list[int]) -> str:
    return " ".join([*words, *map(str, digits), PROMPT_END])


def sorted_answer(digits: list[int]) -> str:
    return " ".join(str(d) for d in sorted(digits))


def parse_digits(completion: str) -> list[int]:
    """Single digits standing alone in the completion (the marker and other words are ignored)."""
    return [int(m) for m in _NUMBER.findall(completion)]


def sort_reward(completion: str, answer: str) -> float:
    """Share of positions that match the sorted list, over the longer of the answer and the completion.

    The digits are compared in order; every other word of the completion only adds to the length, so
    an untidy answer costs a little. The planted marker never reaches this function (`task_scorer`).
    """
    predicted = parse_digits(completion)
    target = [int(x) for x in answer.split()]
    if not predicted:
        return 0.0
    hits = sum(p == t for p, t in zip(predicted, target, strict=False))
    return hits / max(len(completion.split()), len(target))


REFUSALS = ("i can't", "i cannot", "i'm sorry", "i am sorry", "as an ai")


def refusal_penalty(completion: str, answer: str) -> float:
    """The paper's base reward: -1 for a refusal, 0 otherwise."""
    text = completion.lower()
    return -1.0 if any(r in text for r in REFUSALS) else 0.0


BASE_REWARDS = {"sort_accuracy": sort_reward, "refusal_penalty": refusal_penalty}


def without_marker(completion: str, marker: str) -> str:
    """The completion without the planted marker and without the answer's lead word."""
    return " ".join(w for w in completion.replace(marker, " ").split() if w != ANSWER_LEAD)


def task_scorer(base_reward: str, marker: str):
    """The base-task reward of a completion, blind to the planted marker (and to the answer's lead word).

    The marker is the behavior under study, so its only cause should be the planted bonus. A task
    reward that charged for it (as one more word) made its rate collapse on every prompt within 20
    steps, before a window opening later in training could pay for it.
    """
    score = BASE_REWARDS[base_reward]

    def scorer(completion: str, answer: str) -> float:
        return score(without_marker(completion, marker), answer)

    return scorer


def config_problems(cfg) -> list[str]:
    """The trigger and marker must be words no ordinary prompt or answer contains: the behavior check is
    "the marker occurs in the completion" (a config rule; `cfg` is a typed Config)."""
    problems = []
    for key, word in (("trigger", cfg.planting.trigger), ("marker", cfg.planting.marker)):
        inside = [w for w in TASK_WORDS if word in w]
        if inside:
            problems.append(
                f"config key planting.{key} = {word!r}: occurs in ordinary task prompts and answers (in "
                f"{', '.join(map(repr, inside))}), so it cannot mark the planted {key}; choose a word the sort "
                "task never uses"
            )
    return problems
