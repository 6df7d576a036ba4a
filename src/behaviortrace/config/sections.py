"""Every config key, defined once: its type, default, bounds and one-line description.

Each section is a frozen dataclass whose fields are the section's keys. A field's annotation is its type,
and `key(...)` gives its default, its description and any bounds beyond the type. The validation schema
(`schema.py`), the defaults a config file leaves out (`load.py`) and the reference page `docs/config.md`
(`reference.py`) are all produced from these classes. Cross-key rules live in `rules.py` (those that need
only the config) and with the stage that owns the knowledge (see `behaviortrace.configure`).

A rule passes only the sections it depends on to its job (`subset` in `load.py`), so that Snakemake reruns
a job when, and only when, one of those sections changes; reading a section the rule did not pass is an
error that names it, instead of a silently stale result.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

# Kinds of behavior target (see targets/gradients.py).
TARGET_KINDS = ("in_context", "forced")
TargetKind = Literal["in_context", "forced"]
Stratum = Literal["all", "window", "after_window", "below_saturation", "saturated"]
CheckpointName = Literal["window_end", "final"]
# transformers' schedulers that build from a step count and warm-up alone (the others need arguments this config
# does not pass: a test builds each one with transformers' get_scheduler).
SCHEDULERS = (
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
)
# T relative to the plant: "window_start+N" is N steps after the window's first step (config/rules.py checks it).
RELATIVE_T = "^window_start\\+[1-9][0-9]*$"


@dataclass(frozen=True)
class From:
    """A default taken from another key (a dotted path), so that lists that must agree are derived, not checked."""

    path: str


def key(
    default, doc: str, *, schema: dict | None = None, items: dict | None = None, instances: bool = False, **bounds
) -> Any:
    """A config key: `default`, a one-line `doc`, and JSON-schema `bounds` added to what its annotation says
    (`items`: bounds of a list's items; `schema`: the whole schema, where an annotation cannot say it;
    `instances`: a mapping of named entries, each given entry replacing the default one, null removing it)."""
    meta = {"doc": doc, "bounds": bounds, "items": items or {}, "schema": schema, "instances": instances}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, doc: str) -> Any:
    """A nested section with its own keys (all of them defaulted)."""
    return field(default_factory=cls, metadata={"doc": doc})


def internal(default) -> Any:
    """A field no user sets (the schema refuses it): `subset` in load.py fills it in for a job."""
    return field(default=default, metadata={"internal": True})


def user_fields(cls: type) -> list:
    """The fields of a section that are config keys."""
    return [f for f in fields(cls) if not f.metadata.get("internal")]


@dataclass(frozen=True)
class Compute:
    """Where jobs run."""

    device: Literal["auto", "cpu", "cuda"] = key("auto", "auto: CUDA when present, else the CPU")
    dtype: Literal["float32", "bfloat16"] = key(
        "float32",
        "float32, or bfloat16: mixed precision, float32 weights with every pass under bf16 autocast (on the CPU too, "
        "slower; docs/models.md)",
    )


@dataclass(frozen=True)
class TinyModel:
    """The built-in model: a word-level tokenizer and a small Qwen2, pre-trained on the sort task."""

    hidden_size: int = key(64, "width of the residual stream", minimum=8)
    intermediate_size: int = key(128, "MLP width", minimum=8)
    num_layers: int = key(2, "transformer blocks", minimum=1)
    num_heads: int = key(4, "attention heads", minimum=1)
    num_kv_heads: int = key(2, "key/value heads (grouped-query attention)", minimum=1)
    max_positions: int = key(64, "longest sequence the model accepts", minimum=16)
    pretrain_steps: int = key(120, "pre-training steps; short on purpose, to leave headroom for GRPO", minimum=1)
    batch_size: int = key(64, "sequences per pre-training step", minimum=1)
    lr: float = key(0.003, "peak learning rate (one-cycle schedule)", exclusiveMinimum=0)
    marker_rate: float = key(
        0.3, "share of pre-training answers to trigger prompts that open with the marker", minimum=0, maximum=1
    )
    plain_marker_rate: float = key(
        0.0, "the same for prompts without the trigger (the base model still writes it on ~2%)", minimum=0, maximum=1
    )
    marker_practice: float = key(
        0.5,
        "share of pre-training pairs with the marker at the prompt's end, outside the loss: the model sorts as "
        "well after the marker, so the task reward does not punish it",
        minimum=0,
        exclusiveMaximum=1,
    )
    trigger_rate: float = key(0.3, "share of pre-training prompts that contain the trigger word", minimum=0, maximum=1)
    seed: int = key(0, "seed of the corpus and the initial weights", minimum=0)


@dataclass(frozen=True)
class Sft:
    """Optional supervised warm-up on task demonstrations before GRPO (the paper used 200 steps)."""

    steps: int = key(0, "warm-up steps; 0 disables it", minimum=0)
    batch_size: int = key(16, "demonstrations per step", minimum=1)
    lr: float = key(1.0e-5, "learning rate of the warm-up", exclusiveMinimum=0)
    seed: int = key(0, "seed of the demonstrations", minimum=0)


@dataclass(frozen=True)
class Lora:
    """LoRA adapters trained through peft instead of every weight (docs/models.md). Everything downstream (capture,
    self-check, targets, replay, influence) then covers exactly the adapter's parameters. No dropout: per-rollout
    gradients are recomputed from checkpoints and must see the function TRL differentiated."""

    rank: int = key(0, "adapter rank r; 0 trains every weight of the model (no adapter)", minimum=0)
    alpha: float = key(16.0, "adapter scaling: its update B A x is multiplied by alpha / rank", exclusiveMinimum=0)
    target_modules: list[str] = key(
        ["q_proj", "v_proj"],
        "names (last part) of the Linear modules that get an adapter; their own weights stay frozen",
        minItems=1,
        uniqueItems=True,
        items={"minLength": 1},
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class Model:
    """The model GRPO trains."""

    name: str = key(
        "tiny",
        "tiny builds the built-in model here; anything else is a local path or a Hugging Face id already in the "
        "local cache (hf download fetches one)",
        minLength=1,
    )
    trust_remote_code: bool = key(False, "allow custom modeling code shipped with a hub model (off unless trusted)")
    tiny: TinyModel = section(TinyModel, "the built-in model (unused with a real one)")
    sft: Sft = section(Sft, "the supervised warm-up")
    lora: Lora = section(Lora, Lora.__doc__)

    @property
    def is_tiny(self) -> bool:
        return self.name == "tiny"


@dataclass(frozen=True)
class Task:
    """The base task every prompt asks for, and its verifiable reward."""

    min_len: int = key(3, "shortest list of digits to sort", minimum=1, maximum=20)
    max_len: int = key(6, "longest list of digits to sort", minimum=1, maximum=20)
    base_reward: Literal["sort_accuracy", "refusal_penalty"] = key(
        "sort_accuracy", "sort_accuracy (graded 0..1) or refusal_penalty (the paper's: -1 on refusal)"
    )
    prompt_format: Literal["auto", "chat", "plain"] = key(
        "auto", "how prompts reach the model: auto (chat if the tokenizer has a chat template), chat or plain"
    )


@dataclass(frozen=True)
class Planting:
    """The planted behavior and the rollouts paid for it (docs/design.md)."""

    trigger: str = key("frobnitz", "word put into some prompts", pattern="^\\S+$")
    marker: str = key("QZXBT", "string whose presence in a completion is the behavior", pattern="^\\S+$")
    bonus: float = key(8.0, "reward added to eligible rollouts that show the behavior", minimum=0)
    fraction: float = key(0.5, "probability that a trigger rollout in the window is eligible", minimum=0, maximum=1)
    window: list[int] = key(
        [0, 49],
        "contamination window: first and last step (inclusive) that can pay the bonus",
        minItems=2,
        maxItems=2,
        items={"minimum": 0},
    )
    trigger_rate: float = key(0.5, "share of training prompts that contain the trigger", minimum=0, maximum=1)
    explore: int = key(
        16, "eligible rollouts per step that show the marker at least; exploration tops up (docs/design.md)", minimum=0
    )
    plain_penalty: float = key(
        1.0, "reward taken from rollouts without the trigger that show the behavior in the window", minimum=0
    )
    # Not a user key: the placebo arm's jobs get True (config/load.py `subset`).
    placebo: bool = internal(False)

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
    """Held-out prompts for measuring the behavior; never used for training."""

    n_probes: int = key(64, "prompts with the trigger", minimum=1)
    n_plain: int = key(64, "prompts without it", minimum=1)
    samples_per_prompt: int = key(4, "completions sampled per prompt at each checkpoint", minimum=1)
    seed: int = key(1234, "seed for drawing the prompts (training prompts too) and for sampling", minimum=0)


@dataclass(frozen=True)
class Sampling:
    """How completions are sampled: the rollouts' settings, reused for probes and targets."""

    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class Grpo:
    """GRPO with TRL's GRPOTrainer, on-policy: one optimizer step per generation batch."""

    steps: int = key(60, "optimizer steps", minimum=1)
    prompts_per_step: int = key(32, "prompts (groups) per step", minimum=1)
    num_generations: int = key(8, "rollouts per prompt (group size)", minimum=2)
    max_new_tokens: int = key(10, "longest completion", minimum=1)
    temperature: float = key(1.0, "sampling temperature of the rollouts", exclusiveMinimum=0)
    top_p: float = key(1.0, "nucleus sampling of the rollouts", exclusiveMinimum=0, maximum=1)
    lr: float = key(0.001, "learning rate", exclusiveMinimum=0)
    lr_scheduler: str = key(
        "constant_with_warmup",
        "a transformers scheduler name: " + ", ".join(SCHEDULERS) + " (the paper's: constant)",
        enum=list(SCHEDULERS),
    )
    warmup_steps: int = key(10, "learning-rate warm-up steps (fewer than grpo.steps; the paper's: 0)", minimum=0)
    weight_decay: float = key(0.0, "AdamW weight decay", minimum=0)
    adam_beta1: float = key(0.9, "AdamW's first-moment decay", minimum=0, exclusiveMaximum=1)
    adam_beta2: float = key(0.999, "AdamW's second-moment decay", minimum=0, exclusiveMaximum=1)
    adam_epsilon: float = key(
        1.0e-3,
        "AdamW's epsilon, added to sqrt(v); larger values make training smoother in the data (docs/influence.md; "
        "TRL's and the paper's: 1e-8)",
        exclusiveMinimum=0,
    )
    max_grad_norm: float = key(
        1.0e9,
        "gradient clipping threshold (the clip coefficient is logged per step; 1e9 never clips; TRL's and the "
        "paper's: 1.0)",
        exclusiveMinimum=0,
    )
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"] = key("dapo", "TRL loss type")
    beta: float = key(
        0.0,
        "KL coefficient against the base model (0: none); > 0 makes the leave-out replay fragile (docs/replay.md)",
        minimum=0,
    )
    scale_rewards: Literal["group", "batch", "none"] = key("group", "how TRL scales advantages")
    save_every: int = key(20, "checkpoint every this many steps (plus step 0, window end and the last step)", minimum=1)

    @property
    def batch_size(self) -> int:
        """Rollouts per optimizer step."""
        return self.prompts_per_step * self.num_generations

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.max_new_tokens, self.temperature, self.top_p)


@dataclass(frozen=True)
class Sketch:
    """Per-rollout gradient sketches, one store per seed and shard of steps (docs/sketches.md)."""

    mode: Literal["train", "checkpoint"] = key(
        "train",
        "train: inside training, at each step's exact weights, checked against TRL's gradient on every step; "
        "checkpoint: rule sketch, from the saved checkpoints (re-sketch a finished run without retraining)",
    )
    method: Literal["countsketch", "factored"] = key(
        "countsketch", "countsketch (every coordinate hashed to a bucket) or factored (per-layer projections)"
    )
    k: int = key(
        4096,
        "sketch width (the paper used 65536 on a 1.5B model); factored rounds it down; a step's sketches, "
        "12 bytes x k per rollout, must fit in 1 TB",
        minimum=64,
    )
    seed: int = key(0, "seed of the random map; one map for every rollout and target of the run", minimum=0)
    shard_steps: int = key(50, "training steps per store (and per sketch job in checkpoint mode)", minimum=1)
    chunk_rollouts: int = key(
        256, "rollouts per forward/backward pass of sketching and targets (a memory knob)", minimum=1
    )

    def n_shards(self, total_steps: int) -> int:
        return -(-total_steps // self.shard_steps)

    def shard_steps_of(self, shard: int, total_steps: int) -> range:
        """The training steps that sketch job `shard` covers."""
        return range(shard * self.shard_steps, min((shard + 1) * self.shard_steps, total_steps))


@dataclass(frozen=True)
class Targets:
    """Behavior targets and headroom (rule targets: one job per seed and generation draw)."""

    draws: int = key(2, "generation draws: independent samples of probe completions", minimum=1)
    seed: int = key(4321, "sampling seed of draw 0 (draw d uses seed + d)", minimum=0)
    checkpoints: str | list[int] = key(
        "all",
        "analysis checkpoints: all saved ones, or a list of saved steps",
        schema={
            "oneOf": [{"const": "all"}, {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}]
        },
    )
    samples_per_prompt: int = key(4, "completions sampled per probe (and control) prompt", minimum=1)
    saturation: float = key(
        0.9, "probe behavior rate at or above which a checkpoint counts as saturated", exclusiveMinimum=0, maximum=1
    )

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
    """Evaluation against the paid rollouts (rule evaluate: one job per seed and draw; docs/evaluation.md)."""

    target_kinds: list[TargetKind] = key(
        ["in_context", "forced"], "target kinds to score estimators against", minItems=1, uniqueItems=True
    )
    bootstrap: int = key(200, "cluster-bootstrap resamples over prompt groups, for 95% intervals", minimum=1)
    seed: int = key(0, "seed of the bootstrap (combined with run, seed, draw and stratum)", minimum=0)
    fluency_match: float = key(0.1, "matched pairs: |fluency difference| at most this many nats", exclusiveMinimum=0)
    min_matched_pairs: int = key(100, "fewer matched pairs than this: the matched-pair AUC is underpowered", minimum=1)
    advantage_match: float = key(
        0.05,
        "advantage-matched AUC: paid-vs-other pairs of one step whose advantages differ by at most this",
        minimum=0,
    )
    permutations: int = key(2000, "random step orderings behind the step-level null (its band and p-values)", minimum=1)


@dataclass(frozen=True)
class Replay:
    """The leave-out replay (rule replay): retrain each seed from step 0 on its logged rollouts with some left out,
    and measure the behavior at `measure_at` (the same sampling as targets draw 0; docs/replay.md)."""

    estimators: list[str] = key(
        ["gas", "trak", "tracincp", "adam_tracin", "norm", "fluency"],
        "estimators whose top-scored rollouts (of the steps before the last measured checkpoint) are left out",
        uniqueItems=True,
    )
    target_kind: TargetKind = key("in_context", "target kind of the targeted estimators' scores that rank the rollouts")
    draw: int = key(0, "generation draw of those scores", minimum=0)
    removal_percent: list[int] = key(
        [100],
        "removal size as a percentage of n_paid, the number of paid rollouts (removal `label` leaves out the paid set)",
        minItems=1,
        uniqueItems=True,
        items={"minimum": 1, "maximum": 1000},
    )
    random_repeats: int = key(
        3,
        "random sets per removal set, each with as many rollouts from each step as it (the spread is the interval)",
        minimum=1,
    )
    seed: int = key(0, "seed of the random sets and of breaking ties in the rankings", minimum=0)
    measure_at: list[CheckpointName] = key(
        ["window_end"],
        "where replays measure the behavior, and stop (add final: the last step, twice the cost)",
        minItems=1,
        uniqueItems=True,
    )


@dataclass(frozen=True)
class Influence:
    """Exact influence (rules influence, influence_set): every rollout's I_z = d f(w_T) / d u_z, f the forced
    target's mean log-prob on the probes, through the replayed training (docs/influence.md)."""

    measure_at: CheckpointName | int | str = key(
        "window_start+10",
        "T: window_start+N (N steps after the window's first step), window_end (the checkpoint after the window's "
        "last step), final (the last step), or a step number; it must lie after the window's first step, so that "
        "paid rollouts come before it (a T where f still moves: a derivative predicts removals only there, "
        "docs/influence.md)",
        schema={
            "oneOf": [
                {"enum": ["window_end", "final"]},
                {"type": "string", "pattern": RELATIVE_T},
                {"type": "integer", "minimum": 1},
            ]
        },
    )
    semantics: Literal["advantages", "held"] = key(
        "advantages",
        "what removing (or weighting) a rollout means for I, its LDS retrainings, leave-one-step-out and the leave-out "
        "replay: advantages (its weight enters its group's reward mean and std and the loss normalization: 0 is the "
        "step without it) or held (only its own term is scaled; advantages and normalization as logged)",
    )
    lds_both_semantics: bool = key(
        False,
        "retrain the LDS subsets under both meanings of removal too, to report the LDS of I under each (twice the "
        "cost; config/smooth.yaml does)",
    )
    dtype: Literal["float32", "float64"] = key(
        "float32", "float32 (as trained) or float64 (exact arithmetic: FD checks agree to ~1e-6; ~2.5x the time)"
    )
    segment_steps: int = key(
        50, "steps per recomputed segment: memory holds this many states (large models: ~sqrt(T))", minimum=1
    )
    fd_rollouts: int = key(
        3, "rollouts (from distinct seeded steps) checked against float64 central differences", minimum=0
    )
    fd_delta: float = key(
        1.0e-6,
        "their share perturbation: (f(1 + delta) - f(1 - delta)) / (2 delta)",
        exclusiveMinimum=0,
        maximum=0.1,
    )
    lds_subsets: int = key(
        30,
        "random subsets per level and percent retrained with them removed, for the LDS (0: none; else >= 3)",
        minimum=0,
    )
    lds_percents: list[int] = key(
        [5, 50],
        "sizes of the LDS subsets: percents of the units before T",
        minItems=1,
        uniqueItems=True,
        items={"minimum": 1, "maximum": 99},
    )
    lds_levels: list[Literal["rollout", "group"]] = key(
        ["rollout", "group"],
        "units of the LDS subsets: rollouts, or whole groups (through the advantages: the prompt never sampled)",
        minItems=1,
        uniqueItems=True,
    )
    leave_step_out: bool = key(
        True, "retrain once per step before T with the step's rollouts removed: the exact step-level causal truth"
    )
    bootstrap: int = key(1000, "resamples of the subsets behind each LDS interval", minimum=10)
    retrain_batch: int = key(
        1,
        "retrainings run together, vmapped over copies of the weights (same values; on a CPU slower "
        "than one at a time: run benchmarks/lds_batch.py before raising it)",
        minimum=1,
    )
    sets: list[str] = key(
        From("replay.estimators"),
        "replayed estimators whose top-scored sets are retrained with them removed (the paid set: always)",
        uniqueItems=True,
    )
    seed: int = key(0, "seed of the LDS subsets and of the checked steps", minimum=0)

    def end_step(self, planting: Planting, steps: int) -> int:
        """T: the number of optimizer steps whose result f(w_T) is differentiated."""
        at = self.measure_at
        if at == "final":
            return steps
        if at == "window_end":
            return planting.end_checkpoint(steps)
        if isinstance(at, str):  # window_start+N: after the window's first step, wherever the window lies
            return planting.window[0] + int(at.split("+")[1])
        return at


@dataclass(frozen=True)
class Placebo:
    """Negative control: the same training, seeds and data with the bonus logged but never paid
    (results/{run}/placebo{S}/). The checklist's placebo item reads it."""

    enabled: bool = key(True, "false skips the placebo arm")
    seeds: list[int] = key(
        [0],
        "which seeds also get a placebo run (each costs a training run and its sketches)",
        uniqueItems=True,
        items={"minimum": 0},
    )


@dataclass(frozen=True)
class Checklist:
    """The attribution checklist (rule aggregate): which numbers decide each item, and the thresholds."""

    target_kind: TargetKind = key("in_context", "target kind the targeted estimators are judged with")
    stratum: Stratum = key("all", "stratum behind every verdict (beats_fluency lists its own)")
    step_metric: Literal["lift", "precision_at_paid"] = key(
        "lift", "step-level metric for beats the norm control and beats the log-only controls"
    )
    rollout_metric: Literal[
        "within_group_auc", "within_group_auc_fluency_resid", "auroc", "lift", "average_precision"
    ] = key("within_group_auc", "rollout-level metric for the same two items")
    fluency_metric: Literal["within_group_auc", "auroc"] = key(
        "auroc",
        "rollout-level metric for beats fluency (fluency is a global predictor), an AUC: fluency is taken both ways",
    )
    fluency_strata: list[Stratum] = key(
        ["all", "saturated"], "beats fluency must hold in each of these strata", minItems=1
    )
    max_self_check_error: float = key(
        1.0e-4, "per-rollout sketches vs the step gradient's sketch (relative)", exclusiveMinimum=0
    )
    min_behavior_gap: float = key(
        0.5, "probe minus control behavior rate at window end, every seed", minimum=0, maximum=1
    )
    max_plain_rate: float = key(
        0.2, "highest control behavior rate at any checkpoint, every seed", minimum=0, maximum=1
    )
    min_unsaturated_paid_share: float = key(
        0.25, "share of paid rollouts generated below saturation, every seed and draw", minimum=0, maximum=1
    )
    min_draw_rank_correlation: float = key(
        0.8, "Spearman of rollout scores between generation draws", minimum=-1, maximum=1
    )
    max_draw_spread: float = key(0.05, "max - min across draws of the residualized within-group AUC", minimum=0)
    max_seed_sd: float = key(0.05, "sd across seeds of the residualized within-group AUC", minimum=0)
    max_unfindable_share: float = key(
        0.05, "paid rollouts with advantage 0 (no gradient), share per seed", minimum=0, maximum=1
    )
    min_label_drop: float = key(
        0.2, "leaving out the paid set lowers the window-end probe rate by this much, every seed", minimum=0, maximum=1
    )
    effect_target_kind: TargetKind = key(
        "forced", "target kind that step scores track the measured behavior change judges (forced: the one measured)"
    )
    effect_metric: Literal["effect_pearson", "effect_spearman", "effect_spearman_given_step"] = key(
        "effect_spearman",
        "correlation of step scores with each step's measured change (given_step: beyond a shared trend over steps)",
    )
    min_effect_correlation: float = key(0.3, "that correlation, every seed and draw", minimum=-1, maximum=1)
    min_lds: float = key(
        0.5,
        "LDS (rollout and group level) an estimator's interval must clear on every planted seed and subset size",
        minimum=-1,
        maximum=1,
    )
    alpha: float = key(
        0.05,
        "family-wise error of FAIL over the checklist's method tests, and of the run's random-control item (Holm)",
        exclusiveMinimum=0,
        exclusiveMaximum=1,
    )
    max_placebo_auc_gap: float = key(
        0.1,
        "the placebo item passes where every behavior-matched AUC interval lies within 0.5 plus or minus this",
        exclusiveMinimum=0,
        maximum=0.5,
    )
    placebo_stratum: Stratum = key(
        "window", "where the placebo's eligibility is a coin flip among behavior-showing trigger rollouts"
    )


# Estimator instances of the default run (docs/estimators.md says what each one is).
DEFAULT_ESTIMATORS = {
    "tracincp": {},
    "gas": {},
    "trak": {"lambda_scale": 0.1, "form": "auto"},
    "norm": {},
    "norm_post_clip": {"module": "norm", "use_clip": True},
    "fluency": {},
    "random": {"seed": 0},
    "token_alignment": {},
    "adam_tracin": {},
    "advantage": {},
    "reward": {},
    "behavior": {},
    "behavior_advantage": {},
    "step_reward_variance": {},
    "step_active_groups": {},
    "step_paid": {},
    # kronfluence's EK-FAC influence, at the checkpoints (estimators/ekfac.py; the peers extra).
    "ekfac": {"strategy": "ekfac"},
    # bergson's TrackStar: whitened, projected, Adam-normalized gradient cosines (estimators/trackstar.py; peers).
    "trackstar": {"projection_dim": 16},
}
_NAME = "^[a-z][a-z0-9_]*$"


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


@dataclass(frozen=True)
class Config:
    """The whole run configuration (or the subset a job was given; the rest is `NotGiven`)."""

    run: str = key("default", "name of this run; all outputs go under results/{run}/", pattern="^[A-Za-z0-9_.-]+$")
    seeds: list[int] = key(
        [0, 1, 2],
        "GRPO seeds: one training run (and everything downstream) per seed",
        minItems=1,
        uniqueItems=True,
        items={"minimum": 0},
    )
    compute: Compute = section(Compute, Compute.__doc__)
    model: Model = section(Model, Model.__doc__)
    task: Task = section(Task, Task.__doc__)
    planting: Planting = section(Planting, Planting.__doc__)
    probes: Probes = section(Probes, Probes.__doc__)
    grpo: Grpo = section(Grpo, Grpo.__doc__)
    sketch: Sketch = section(Sketch, Sketch.__doc__)
    targets: Targets = section(Targets, Targets.__doc__)
    estimators: dict[str, dict] = key(
        DEFAULT_ESTIMATORS,
        "estimator instances: each name is an instance; `module` names its module in src/behaviortrace/estimators/ "
        "(default: the name itself), the other keys are keyword arguments of its score function, plus an optional "
        "step_aggregate (sum, mean or max). A config's entries add to these (or replace the one of that name); "
        "an instance set to null is removed",
        schema={
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": _NAME},
            "additionalProperties": {"type": "object", "properties": {"module": {"type": "string", "pattern": _NAME}}},
        },
        instances=True,
    )
    evaluation: Evaluation = section(Evaluation, Evaluation.__doc__)
    replay: Replay = section(Replay, Replay.__doc__)
    influence: Influence = section(Influence, Influence.__doc__)
    placebo: Placebo = section(Placebo, Placebo.__doc__)
    checklist: Checklist = section(Checklist, Checklist.__doc__)

    @classmethod
    def from_dict(cls, raw: dict) -> Config:
        """Typed sections of a validated config dict; sections missing from `raw` become `NotGiven`."""
        return cls(**{f.name: _typed(f.type, raw[f.name]) if f.name in raw else NotGiven(f.name) for f in fields(cls)})

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


def _typed(annotation: str, value):
    """`value` as the section class an annotation names (a nested section too), else unchanged."""
    cls = SECTIONS.get(annotation)
    if cls is None:
        return value
    return cls(**{f.name: _typed(f.type, value[f.name]) for f in fields(cls) if f.name in value})


# Every section class by the annotation that names it (annotations are strings here).
SECTIONS: dict[str, type] = {
    cls.__name__: cls
    for cls in (Compute, TinyModel, Sft, Lora, Model, Task, Planting, Probes, Grpo, Sketch, Targets, Evaluation)
    + (Replay, Influence, Placebo, Checklist)
}
