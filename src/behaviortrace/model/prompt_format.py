"""How a task prompt reaches the model: as plain text, or as a user turn of the tokenizer's chat template.

The decision is made once, when the base model is built (`task.prompt_format`, `set_prompt_format`), and kept
in the tokenizer saved with the base model and every checkpoint: a tokenizer that carries a chat template gets
chat prompts, one without gets plain text. So `render` needs no config, and every place a prompt reaches a
model (TRL's dataset, the forced-target probe, behavior rates on probes and controls, targets, replay, the SFT
warm-up, the rollout log's prompt text) formats it the same way by calling it with the tokenizer it loaded.

The token ids are those TRL feeds the model: with a chat template, the template's own tokenization of the
conversation with the assistant's turn opened (TRL applies it to conversational prompts, `trl_prompt`); without
one, the tokenizer's ordinary encoding, special tokens included (TRL encodes plain prompts so). The rollout
logger checks, on every step, that TRL's prompt ids are the ones `render` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMPT_FORMATS = ("auto", "chat", "plain")


@dataclass(frozen=True)
class Rendered:
    """A prompt as the model sees it: its text (what the rollout log keeps) and its token ids."""

    text: str
    ids: list[int]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def set_prompt_format(tokenizer, prompt_format: str, model_name: str) -> str:
    """Make the tokenizer carry the format (`auto`: chat when it has a chat template, else plain): `plain` drops its
    chat template, `chat` requires one. Returns the format chosen."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"config key task.prompt_format = {prompt_format!r}: not one of {PROMPT_FORMATS}")
    if prompt_format == "chat" and not has_chat_template(tokenizer):
        raise ValueError(
            f"config key task.prompt_format = 'chat': the tokenizer of model {model_name!r} has no chat template; "
            "use plain or auto"
        )
    if prompt_format == "plain":
        tokenizer.chat_template = None
    return "chat" if has_chat_template(tokenizer) else "plain"


def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def render(tokenizer, prompt: str) -> Rendered:
    """The one place a task prompt is formatted for the model (see the module docstring)."""
    if has_chat_template(tokenizer):
        conversation = [_messages(prompt)]
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)[0]
        encoded = tokenizer.apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=True, return_dict=True
        )
        return Rendered(text, list(encoded["input_ids"][0]))
    return Rendered(prompt, list(tokenizer(prompt)["input_ids"]))


def prompt_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt as the model sees it (`render`)."""
    return [render(tokenizer, p).ids for p in prompts]


def trl_prompt(tokenizer, prompt: str):
    """What TRL's dataset holds for a prompt: a conversation when the tokenizer carries a chat template (TRL then
    applies the template itself, to the ids `render` gives), else the text."""
    return _messages(prompt) if has_chat_template(tokenizer) else prompt


def completion_text(completion) -> str:
    """A completion as TRL hands it to reward functions: text, or (conversational prompts) a list of assistant
    messages, whose contents are the text."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if isinstance(m.get("content", ""), str))
