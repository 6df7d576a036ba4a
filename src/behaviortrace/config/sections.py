"""The run configuration as typed, read-only sections.

The config is validated once (`validate.py`) and then parsed into these dataclasses. A rule passes
only the sections it depends on to its job (see `subset` in `load.py`), so that Snakemake reruns a job when,
and only when, one of those sections changes; reading a section the rule did not pass is an error
that names it, instead of a silently stale result.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

# Kinds of behavior target (see targets/gradients.py).
TARGET_KINDS = ("in_context", "forced")


@dataclass(frozen=True)
class Compute:
    device: str
    dtype: str


@dataclass(frozen=True)
class TinyModel:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_positions: int
    pretrain_steps: int
    batch_size: int
    lr: float
    marker_rate: float
    control_marker_rate: float
    marker_practice: float
    trigger_rate: float
    seed: int


@dataclass(frozen=True)
class Sft:
    steps: int
    batch_size: int
    lr: float
    seed: int


@dataclass(frozen=True)
class Model:
    name: str
    trust_remote_code: bool
    tiny: TinyModel
    sft: Sft

    @property
    def is_tiny(self) -> bool:
        return self.name == "tiny"


@dataclass(frozen=True)
class Task:
    min_len: int
    max_len: int
    base_reward: str
    prompt_format: str  # auto, chat or plain: how prompts reach the model (model/prompt_format.py)


@dataclass(frozen=True)
class Planting:
    trigger: str
    marker: str
    bonus: float
    fraction: float
    window: list[int]
    trigger_rate: float
    explore: int
    control_penalty: float
    # Not a user key: the placebo arm's jobs get True (config/load.py `subset`).
    placebo: bool = False

    @property
    def last_step(self) -> int:
        """The window's last step (inclusive): the last that can pay the bonus."""
        return self.window[1]

    def end_checkpoint(self, steps: int) -> int:
        """The checkpoint that closes the window: the weights after its last step's update, or the last step
        if training ends first. Replays, tables and the checklist call it `window_end`."""
        return min(self.last_step + 1, steps)


@dataclass(frozen=True)
class Probes:
    n_probes: int
    n_controls: int
    samples_per_prompt: int
    seed: int


@dataclass(frozen=True)
class Sampling:
    """How completions are sampled: the rollouts' settings, reused for probes and targets."""

    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class Grpo:
    steps: int
    prompts_per_step: int
    num_generations: int
    max_new_tokens: int
    temperature: float
    top_p: float
    lr: float
    lr_scheduler: str
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    loss_type: str
    beta: float
    scale_rewards: str
    save_every: int

    @property
    def batch_size(self) -> int:
        """Rollouts per optimizer step."""
        return self.prompts_per_step * self.num_generations

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.max_new_tokens, self.temperature, self.top_p)


@dataclass(frozen=True)
class Sketch:
    mode: str  # train: captured inside training at each step's weights; checkpoint: from saved checkpoints
    method: str
    k: int
    seed: int
    shard_steps: int
    chunk_rollouts: int

    def n_shards(self, total_steps: int) -> int:
        return -(-total_steps // self.shard_steps)

    def shard_steps_of(self, shard: int, total_steps: int) -> range:
        """The training steps that sketch job `shard` covers."""
        return range(shard * self.shard_steps, min((shard + 1) * self.shard_steps, total_steps))


@dataclass(frozen=True)
class Targets:
    draws: int
    seed: int
    checkpoints: str | list[int]
    samples_per_prompt: int
    saturation: float

    def draw_seed(self, draw: int) -> int:
        """The sampling seed of a generation draw."""
        return self.seed + draw

    def analysis_steps(self, saved: list[int]) -> list[int]:
        """The saved checkpoints that get targets (validated against the schedule when the config loads)."""
        wanted = saved if self.checkpoints == "all" else sorted(self.checkpoints)
        missing = [s for s in wanted if s not in saved]
        if missing:
            raise ValueError(f"config targets.checkpoints: steps {missing} have no saved checkpoint (saved: {saved})")
        return wanted


@dataclass(frozen=True)
class Evaluation:
    targets: list[str]
    bootstrap: int
    seed: int
    fluency_match: float
    min_matched_pairs: int
    advantage_match: float
    permutations: int


@dataclass(frozen=True)
class Replay:
    estimators: list[str]
    target: str
    draw: int
    k_percent: list[int]
    random_repeats: int
    seed: int
    checkpoints: list[str]  # window_end and/or final: where each replay measures the behavior (and stops)


@dataclass(frozen=True)
class Influence:
    checkpoint: str  # window_end or final: T, the step count whose weights f is measured at
    dtype: str
    segment_steps: int
    fd_rollouts: int
    fd_delta: float
    lds_subsets: int
    lds_fraction: float
    sets: list[str]  # replayed estimators whose leave-out sets are also retrained with shares zeroed
    seed: int


@dataclass(frozen=True)
class Placebo:
    enabled: bool
    seeds: list[int]


@dataclass(frozen=True)
class Checklist:
    target: str
    stratum: str
    step_metric: str
    rollout_metric: str
    fluency_metric: str
    fluency_strata: list[str]
    max_self_check_error: float
    min_behavior_gap: float
    max_control_rate: float
    min_unsaturated_gt_share: float
    min_draw_rank_correlation: float
    max_draw_spread: float
    max_seed_sd: float
    max_unfindable_share: float
    min_oracle_drop: float
    effect_target: str
    effect_metric: str
    min_effect_correlation: float
    min_influence_spearman: float
    alpha: float
    placebo_stratum: str


class NotGiven:
    """Stands for a section that the rule did not pass to its job; any use of it names the section."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        raise AttributeError(
            f"config section {self._name!r} was not passed to this job: add it to the rule's "
            f"config_for(...) in workflow/rules (reading it unpassed would miss reruns when it changes)"
        )

    def __repr__(self) -> str:
        return f"NotGiven({self._name!r})"


_SECTION_TYPES: dict[str, type] = {
    "compute": Compute,
    "model": Model,
    "task": Task,
    "planting": Planting,
    "probes": Probes,
    "grpo": Grpo,
    "sketch": Sketch,
    "targets": Targets,
    "evaluation": Evaluation,
    "replay": Replay,
    "influence": Influence,
    "placebo": Placebo,
    "checklist": Checklist,
}
_NESTED = {Model: {"tiny": TinyModel, "sft": Sft}}


def _typed(cls: type, raw: dict) -> Any:
    nested = _NESTED.get(cls, {})
    return cls(
        **{
            f.name: _typed(nested[f.name], raw[f.name]) if f.name in nested else raw[f.name]
            for f in fields(cls)
            if f.name in raw or f.default is MISSING
        }
    )


@dataclass(frozen=True)
class Config:
    """The whole run configuration (or the subset a job was given; the rest is `NotGiven`)."""

    run: str
    seeds: list[int]
    compute: Compute
    model: Model
    task: Task
    planting: Planting
    probes: Probes
    grpo: Grpo
    sketch: Sketch
    targets: Targets
    estimators: dict[str, dict]
    evaluation: Evaluation
    replay: Replay
    influence: Influence
    placebo: Placebo
    checklist: Checklist

    @classmethod
    def from_dict(cls, raw: dict) -> Config:
        """Typed sections of a validated config dict; sections missing from `raw` become `NotGiven`."""
        values = {}
        for f in fields(cls):
            if f.name not in raw:
                values[f.name] = NotGiven(f.name)
            elif f.name in _SECTION_TYPES:
                values[f.name] = _typed(_SECTION_TYPES[f.name], raw[f.name])
            else:
                values[f.name] = raw[f.name]
        return cls(**values)

    def to_dict(self) -> dict:
        """Plain values of the sections this config holds (for fingerprints and logs)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, NotGiven):
                out[f.name] = asdict(value) if hasattr(value, "__dataclass_fields__") else value
        return out

    def has(self, section: str) -> bool:
        """Whether this job was given `section`."""
        return not isinstance(getattr(self, section), NotGiven)

    @property
    def placebo_seeds(self) -> list[int]:
        return list(self.placebo.seeds) if self.placebo.enabled else []
