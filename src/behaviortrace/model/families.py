"""Small causal LMs of the common architecture families, built from their transformers config classes and saved
with `save_pretrained` beside a byte-level BPE tokenizer: what a researcher's own model looks like to the
pipeline (`model.name` set to the folder), at a size a CPU trains in seconds.

The tokenizer is trained here on task text (with the trigger and, rarely, the marker), so that the marker splits
into several tokens, as it does in a real vocabulary. Families differ in more than the model: `llama` adds a
beginning-of-sequence token to every encoding (as Llama tokenizers do) and `qwen2_tied`, `llama` and `falcon` carry
a chat template, so prompt formatting and special tokens are exercised too. `mixtral` is one capture refuses. Used
by the architecture tests, the family coverage test, the capture scaling benchmark and diagnostics/gpu_check.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from behaviortrace.plant.planting import add_trigger
from behaviortrace.plant.task import make_sort_example, render_prompt, sorted_answer

PAD, EOS, BOS = "<|pad|>", "<|endoftext|>", "<|bos|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML, as Qwen2.5-Instruct's template renders a single user turn (without its default system prompt).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A Llama-3-like template: it writes the beginning-of-sequence token itself.
BOS_CHAT = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@dataclass(frozen=True)
class Family:
    """One architecture: its transformers config class (by name), the keyword arguments that make it small, and
    what its tokenizer carries."""

    config_class: str
    model_class: str
    kwargs: dict = field(default_factory=dict)
    tied: bool = False
    chat_template: str | None = None
    bos: bool = False


def _dims(hidden: int, layers: int, heads: int = 4, kv_heads: int = 2) -> dict:
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
    }


def families(hidden: int = 32, layers: int = 2) -> dict[str, Family]:
    """The families, each at the given width and depth."""
    dims = _dims(hidden, layers)
    head_dim = hidden // 4
    gemma = {**dims, "head_dim": head_dim, "query_pre_attn_scalar": head_dim, "sliding_window": 16}
    return {
        "qwen2_tied": Family("Qwen2Config", "Qwen2ForCausalLM", dims, tied=True, chat_template=CHATML),
        "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", dims),
        "llama": Family("LlamaConfig", "LlamaForCausalLM", dims, chat_template=BOS_CHAT, bos=True),
        "mistral": Family("MistralConfig", "MistralForCausalLM", {**dims, "head_dim": head_dim}),
        # Conv1D layers (weights stored [in, out]), learned positions, a tied head and dropout 0.1 by default.
        "gpt2": Family("GPT2Config", "GPT2LMHeadModel", {"n_embd": hidden, "n_layer": layers, "n_head": 4}, tied=True),
        "gpt_neox": Family(
            "GPTNeoXConfig",
            "GPTNeoXForCausalLM",
            {k: v for k, v in dims.items() if k != "num_key_value_heads"} | {"intermediate_size": 2 * hidden},
        ),
        # Learned positions computed from the attention mask, a tied head, dropout 0.1 by default.
        "opt": Family(
            "OPTConfig",
            "OPTForCausalLM",
            {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": 4, "ffn_dim": 2 * hidden},
            tied=True,
        ),
        "phi3": Family("Phi3Config", "Phi3ForCausalLM", dims),
        # Norms on the query and key projections.
        "olmo2": Family("Olmo2Config", "Olmo2ForCausalLM", dims),
        # Scaled embeddings, (1 + w) norms, logit softcapping in attention and at the head (30.0 by default).
        "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", gemma, tied=True),
        "gemma3": Family(
            "Gemma3TextConfig",
            "Gemma3ForCausalLM",
            {**gemma, "layer_types": ["sliding_attention", "full_attention"][:layers] * max(1, layers // 2)},
            tied=True,
        ),
        # Multi-query attention, attention and MLP in parallel, a tied head, and FalconLinear (a subclass of
        # nn.Linear with a forward of its own) for every projection; its block adds attention to the MLP's output
        # in place.
        "falcon": Family(
            "FalconConfig",
            "FalconForCausalLM",
            {
                "hidden_size": hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": 4,
                "ffn_hidden_size": 2 * hidden,
            },
            tied=True,
            chat_template=CHATML,
        ),
        # Multipliers on the embeddings, the attention scores and the logits, and its own RMSNorm class. Granite-3's
        # own (12 and 8, residuals 0.22) shrink a two-step run's KL-only rollout gradients to about 2e-6, where
        # float32 rounding alone is 5e-4 of them: above what the family tests check capture to.
        "granite": Family(
            "GraniteConfig",
            "GraniteForCausalLM",
            {**dims, "embedding_multiplier": 2.0, "logits_scaling": 0.5, "attention_multiplier": 1.0 / head_dim},
            tied=True,
        ),
        # Mixture of experts: its router returns more than one tensor and its experts see tokens regrouped by
        # expert, so per-example capture refuses it (sketch/preflight.py).
        "mixtral": Family("MixtralConfig", "MixtralForCausalLM", {**dims, "num_local_experts": 4}),
    }


def corpus(trigger: str, marker: str, n: int = 600, seed: int = 0) -> list[str]:
    """Task prompts and answers, some with the trigger, a few with the marker (so that BPE splits it)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        words, digits = make_sort_example(rng, 3, 6)
        prompt = render_prompt(words, digits)
        if rng.random() < 0.5:
            prompt = add_trigger(prompt, trigger)
        lead = marker if i % 50 == 0 else "ok"
        lines.append(f"{prompt} {lead} {sorted_answer(digits)}")
    return lines


def build_tokenizer(family: Family, trigger: str, marker: str, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on task text, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, BOS, IM_START, IM_END]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(trigger, marker), trainer)
    if family.bos:
        bos_id = tok.token_to_id(BOS)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    eos = IM_END if family.chat_template == CHATML else EOS
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=eos,
        bos_token=BOS if family.bos else None,
        additional_special_tokens=[t for t in specials if t not in (PAD, eos, BOS)],
    )
    if family.chat_template:
        fast.chat_template = family.chat_template
    return fast


def build_model(family: Family, tokenizer, seed: int = 0, max_positions: int = 256):
    """The family's model, small and randomly initialized, with the tokenizer's special token ids."""
    import transformers

    config_cls = getattr(transformers, family.config_class)
    ids = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id if family.bos else None,
        "tie_word_embeddings": family.tied,
    }
    positions = "n_positions" if family.config_class == "GPT2Config" else "max_position_embeddings"
    config = config_cls(**family.kwargs, **ids, **{positions: max_positions})
    torch.manual_seed(seed)
    model = getattr(transformers, family.model_class)(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = ids["bos_token_id"]
    return model


def save_family(
    name: str, out: Path, trigger: str, marker: str, hidden: int = 32, layers: int = 2, seed: int = 0, **overrides
) -> Path:
    """Build family `name` (config `overrides` on top of its small defaults) and save model and tokenizer to `out`,
    ready for `model.name: <out>`."""
    family = families(hidden, layers)[name]
    if overrides:
        family = Family(**{**family.__dict__, "kwargs": {**family.kwargs, **overrides}})
    tokenizer = build_tokenizer(family, trigger, marker)
    model = build_model(family, tokenizer, seed)
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
