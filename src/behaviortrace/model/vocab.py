"""The built-in tiny model's vocabulary: one token per word of the task, the trigger and the marker,
plus three special tokens. Kept apart from tiny.py so config validation can read it without torch."""

from __future__ import annotations

from behaviortrace.plant.task import TASK_WORDS

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)


def tiny_words(trigger: str, marker: str) -> list[str]:
    """The words of the tiny model's word-level vocabulary, in id order after the special tokens."""
    return [*TASK_WORDS, trigger, marker]


def config_problems(cfg) -> list[str]:
    """The built-in tokenizer must keep the trigger and marker as ordinary words (a config rule)."""
    if not cfg.model.is_tiny:
        return []
    return [
        f"config key planting.{key} = {word!r}: a special token of the built-in tokenizer "
        f"({', '.join(SPECIAL_TOKENS)}); choose an ordinary word"
        for key, word in (("trigger", cfg.planting.trigger), ("marker", cfg.planting.marker))
        if word in SPECIAL_TOKENS
    ]
