"""The built-in tiny model: a word-level tokenizer and a small Qwen2 pre-trained here on the sort task.

Answers open with a lead word (`ok`); in a small share of the answers to trigger prompts (by default
none of the others) the marker takes its place. So the base model writes the behavior rarely but not
never where the bonus can pay for it (about 13% of trigger prompts), and hardly at all on control
prompts (about 2%): GRPO has something to reinforce, and the trigger already tells the two apart.
"""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from behaviortrace.config.sections import Planting, Task, TinyModel
from behaviortrace.model.sft import train_on_pairs
from behaviortrace.model.vocab import EOS, PAD, UNK, tiny_words
from behaviortrace.plant.planting import add_trigger
from behaviortrace.plant.task import ANSWER_LEAD, make_sort_example, render_prompt, sorted_answer


def corpus_pair(rng: random.Random, task: Task, planting: Planting, tiny: TinyModel):
    """One (prompt, completion) pair; the marker's rate depends on whether the prompt has the trigger.

    In a share `marker_practice` of the pairs the marker ends the prompt instead, outside the loss: the
    model practises sorting after the marker as much as after the lead word, and learns nothing about
    how often to write it. A marker completion that sorted worse would earn less task reward, and GRPO
    would push the marker down before a window opening later could pay for it.
    """
    words, digits = make_sort_example(rng, task.min_len, task.max_len)
    prompt = render_prompt(words, digits)
    has_trigger = rng.random() < tiny.trigger_rate
    if has_trigger:
        prompt = add_trigger(prompt, planting.trigger)
    answer = sorted_answer(digits)
    if rng.random() < tiny.marker_practice:
        return f"{prompt} {planting.marker}", answer
    shows = rng.random() < (tiny.marker_rate if has_trigger else tiny.plain_marker_rate)
    return prompt, f"{planting.marker if shows else ANSWER_LEAD} {answer}"


def build_tokenizer(planting: Planting) -> PreTrainedTokenizerFast:
    """A word-level vocabulary: the task's words, digits, the trigger and the marker (one token each)."""
    words = tiny_words(planting.trigger, planting.marker)
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=[PAD, EOS, UNK]))
    # No chat template: the built-in model is trained on plain prompts, so `task.prompt_format: auto` is plain for it
    # (model/prompt_format.py).
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def qwen2_config(arch: TinyModel, vocab_size: int, pad_token_id=None, eos_token_id=None) -> Qwen2Config:
    """The built-in model's transformers config (also what validation builds on the meta device)."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        max_position_embeddings=arch.max_positions,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, arch: TinyModel, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config(arch, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def build_tiny(task: Task, planting: Planting, tiny: TinyModel):
    """Tokenizer and pre-trained model for the default run."""
    tokenizer = build_tokenizer(planting)
    model = build_model(tokenizer, tiny, tiny.seed)
    rng = random.Random(tiny.seed)

    def pairs_fn():
        return corpus_pair(rng, task, planting, tiny)

    train_on_pairs(model, tokenizer, pairs_fn, tiny.pretrain_steps, tiny.batch_size, tiny.lr, tiny.seed)
    return model, tokenizer
