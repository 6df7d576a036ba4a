"""The built-in tiny model: its tokenizer survives a save/load, and it emits the marker rarely but not never."""

import copy

import torch

from behaviortrace.behavior.rates import behavior_rates, sample_completions
from behaviortrace.model import models
from behaviortrace.plant.task import task_scorer
from behaviortrace.preflight.base_model import build_base_model
from conftest import default_config, typed


def test_tokenizer_round_trips_through_a_saved_checkpoint(base_model_dir, cpu, cfg):
    model, tokenizer = models.load(base_model_dir, cpu)
    text = f"please sort these numbers : 3 1 2 = {cfg['planting']['trigger']}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.split()) and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    assert len(tokenizer(cfg["planting"]["marker"], add_special_tokens=False)["input_ids"]) == 1
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_auto_prompt_format_is_plain_for_the_tiny_model_so_its_prompts_are_unchanged(base_model_dir, cpu, prompts):
    """The built-in tokenizer carries no chat template: `task.prompt_format: auto` formats nothing, and a prompt's ids
    are the word-level ids of its text, with no special token added (what the default run always fed the model)."""
    from behaviortrace.model.prompt_format import has_chat_template, render

    _, tokenizer = models.load(base_model_dir, cpu)
    assert not has_chat_template(tokenizer)
    for prompt in prompts["probes"]["prompt"].to_list() + prompts["train"]["prompt"].to_list()[:20]:
        rendered = render(tokenizer, prompt)
        assert rendered.text == prompt
        assert rendered.ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert len(rendered.ids) == len(prompt.split())


def test_default_base_model_emits_the_marker_rarely_on_trigger_prompts_and_sorts_as_well_after_it(cpu, prompts):
    """The default base model: the marker on some trigger prompts, hardly ever elsewhere, and no worse at
    the task once it has written the marker (so the task reward gives the marker no reason to fall)."""
    cfg = default_config()
    torch.set_num_threads(1)
    model, tokenizer = build_base_model(typed(cfg), cpu)
    rows = behavior_rates(
        model,
        tokenizer,
        {"probes": prompts["probes"], "plain": prompts["plain"]},
        cfg["planting"]["marker"],
        cfg["task"]["base_reward"],
        16,
        typed(cfg).grpo.sampling,
        0,
    )
    rate = {row["prompt_set"]: row["behavior_rate"] for row in rows}
    assert 0.05 < rate["probes"] <= 0.3, rows
    assert rate["plain"] <= 0.05 and rate["plain"] < rate["probes"] / 2, rows
    for row in rows:
        assert 0.2 < row["base_reward"] < 0.9, row  # can do the task, with headroom left for GRPO
    score = task_scorer(cfg["task"]["base_reward"], cfg["planting"]["marker"])
    probes = prompts["probes"]
    mean_reward = {}
    for lead in ("", f" {cfg['planting']['marker']}"):
        texts = [p + lead for p in probes["prompt"].to_list()]
        samples = sample_completions(model, tokenizer, texts, 16, typed(cfg).grpo.sampling, 0)
        pairs = [(c, a) for cs, a in zip(samples, probes["answer"].to_list(), strict=True) for c in cs]
        mean_reward[lead] = sum(score(c, a) for c, a in pairs) / len(pairs)
    assert abs(mean_reward[""] - mean_reward[lead]) < 0.05, mean_reward


def test_sampling_is_reproducible(base_model_dir, cpu, cfg, prompts):
    model, tokenizer = models.load(base_model_dir, cpu)
    texts = prompts["probes"]["prompt"].to_list()
    a = sample_completions(model, tokenizer, texts, 3, typed(cfg).grpo.sampling, 11)
    b = sample_completions(model, tokenizer, texts, 3, typed(cfg).grpo.sampling, 11)
    assert a == b and len(a) == len(texts) and all(len(x) == 3 for x in a)


def test_sft_warm_up_trains_on_demonstrations_without_the_marker(cfg, cpu):
    warm = copy.deepcopy(cfg)
    warm["model"]["sft"].update(steps=3, lr=1e-3)
    torch.manual_seed(0)
    cold_model, _ = build_base_model(typed(cfg), cpu)
    warm_model, _ = build_base_model(typed(warm), cpu)
    changed = [not torch.equal(a, b) for a, b in zip(cold_model.parameters(), warm_model.parameters(), strict=False)]
    assert any(changed)


def test_a_model_by_local_path_loads_and_takes_the_sft_warm_up(base_model_dir, cfg, cpu, prompts):
    """model.name other than 'tiny': loaded with transformers, then warmed up on demonstrations."""
    local = copy.deepcopy(cfg)
    local["model"]["name"] = str(base_model_dir)
    local["model"]["sft"].update(steps=2, lr=1e-3)
    model, tokenizer = build_base_model(typed(local), cpu)
    original, _ = models.load(base_model_dir, cpu)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), original.parameters(), strict=False))
    text = prompts["plain"]["prompt"][0]
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
