"""GRPO training with TRL's GRPOTrainer, logging every rollout the trainer actually trained on.

The trainer fills the hooks of `trl_surface.hooked_trainer_base()` (TRL's private methods stay in
that module): `on_rewards` keeps the per-function rewards and the raw completions,
`on_generation_batch` reads the advantages and token ids that go into the loss, `loss_pass` lets train-time
capture record per-rollout gradient factors from TRL's own loss pass, `before_clip` measures
the forced target at the step's weights (train/effect.py) and hands the step to train-time capture
(sketch/capture.py) while TRL's gradient is in place, `on_clip` records the pre-clip norm, the clip
coefficient and AdamW's settings of each step (train/optimizer_log.py), and `before_checkpoint` flushes the
log before each checkpoint. Nothing is recomputed: the log holds what TRL computed. Prompts reach TRL formatted by
model/prompt_format.py (conversations where the tokenizer carries a chat template), and the prompt ids TRL
encoded are checked against that module's on every step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from contextlib import nullcontext
from pathlib import Path

import polars as pl
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

from behaviortrace.config.sections import Config, Planting
from behaviortrace.model.lora import drop_reference_adapter
from behaviortrace.model.prompt_format import completion_text, has_chat_template, render, trl_prompt
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.plant.planting import (
    bonus_for,
    exploration_rows,
    is_eligible,
    penalty_for,
    rollout_id,
    shows_behavior,
)
from behaviortrace.plant.task import task_scorer
from behaviortrace.train.checkpoints import (
    checkpoint_dir,
    checkpoint_for_step,
    complete_checkpoints,
    mark_complete,
    saved_steps,
)
from behaviortrace.train.effect import ForcedTargetProbe
from behaviortrace.train.optimizer_log import SavePreconditioner, step_facts
from behaviortrace.train.rolloutlog import RolloutLog
from behaviortrace.train.trl_surface import Hooks, grpo_args, hooked_trainer_base

log = logging.getLogger(__name__)


def make_reward_funcs(base_reward: str, planting: Planting, seed: int, batch_size: int):
    """Three reward functions, summed by TRL: the base-task reward, the planted bonus and the control penalty."""
    score = task_scorer(base_reward, planting.marker)

    def base_reward_fn(prompts, completions, answer, **_):
        return [score(completion_text(c), a) for c, a in zip(completions, answer, strict=False)]

    def planted_bonus(prompts, completions, trigger, trainer_state, **_):
        step = trainer_state.global_step
        out = []
        for i, (completion, has_trigger) in enumerate(zip(completions, trigger, strict=False)):
            eligible = is_eligible(seed, rollout_id(step, batch_size, i), step, has_trigger, planting)
            out.append(bonus_for(eligible, shows_behavior(completion_text(completion), planting.marker), planting))
        return out

    def plain_penalty(prompts, completions, trigger, trainer_state, **_):
        step = trainer_state.global_step
        return [
            -penalty_for(step, has_trigger, shows_behavior(completion_text(completion), planting.marker), planting)
            for completion, has_trigger in zip(completions, trigger, strict=False)
        ]

    base_reward_fn.__name__ = "base_reward"
    return [base_reward_fn, planted_bonus, plain_penalty]


class StepLogging(Hooks):
    """The hooks every rollout logger shares (the workflow's trainer, and api.py's Capture on a trainer of your own):
    train-time capture around TRL's loss pass, the step's sketches and forced target before clipping, the step log
    after it, and the log flushed before each checkpoint. `log_batch` takes a generation batch's rows."""

    trainer = None  # the GRPOTrainer whose steps these are
    rollout_log: RolloutLog
    capture = None  # a sketch.capture.TrainCapture, or None
    probe: ForcedTargetProbe | None = None  # measures the forced target at each step's weights, or None

    def log_batch(self, rows: list[dict], lr: float, num_items: int) -> None:
        """Log a training generation batch's rows (one per rollout) and keep them for its step's capture."""
        self.rollout_log.add_rollouts(rows)
        self._step_rows = rows
        self._step_row = {
            "step": self.trainer.state.global_step,
            "lr": lr,
            "num_items_in_batch": num_items,
            "n_rollouts": len(rows),
        }

    def loss_pass(self, inputs: dict):
        if self.capture is None or not self.trainer.model.training:
            return nullcontext()
        return self.capture.recording(self.trainer.state.global_step, inputs)

    def before_clip(self) -> None:
        # The weights the step's gradient was taken at, before its update: f(w_t).
        self._step_row["target_logprob"] = self.probe(self.trainer.model) if self.probe is not None else float("nan")
        if self.capture is not None:
            rows = pl.DataFrame(self._step_rows).select("rollout_id", "prompt_ids", "completion_ids", "advantage")
            self.capture.capture(
                self.trainer.state.global_step, rows, self._step_row["num_items_in_batch"], self.trainer.model
            )

    def on_clip(self, grad_norm: float) -> None:
        max_norm = self.trainer.args.max_grad_norm
        clip_coef = min(1.0, max_norm / (grad_norm + 1e-6))
        self.rollout_log.add_step(
            {
                **self._step_row,
                "grad_norm": grad_norm,
                "clip_coef": clip_coef,
                "max_grad_norm": max_norm,
                **step_facts(self.trainer.optimizer),
            }
        )
        if self.capture is not None:
            self.capture.commit(self.trainer.state.global_step, self._step_row["lr"], clip_coef, grad_norm)

    def before_checkpoint(self) -> None:
        # Rows and captured steps first: a checkpoint that exists always has them on disk.
        self.rollout_log.flush(self.trainer.state.global_step)
        if self.capture is not None:
            self.capture.flush()

    def after_checkpoint(self, path: Path) -> None:
        mark_complete(path)
        for step, older in complete_checkpoints(Path(self.trainer.args.output_dir)).items():
            if step < self.trainer.state.global_step:
                (older / "optimizer.pt").unlink(missing_ok=True)  # only the newest is ever resumed from
        log.info("saved checkpoint %s", path.name)


class RolloutLoggingGRPOTrainer(StepLogging, hooked_trainer_base()):
    """GRPOTrainer that hands every training rollout, with TRL's own rewards and advantages, to a RolloutLog."""

    @property
    def trainer(self):
        return self  # it hooks itself

    def __init__(
        self,
        *args,
        rollout_log: RolloutLog,
        seed: int,
        planting: Planting,
        saved: list[int],
        capture=None,
        probe: ForcedTargetProbe | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        drop_reference_adapter(self.model)
        self.rollout_log = rollout_log
        self.plant_seed = seed
        self.planting = planting
        self.saved = saved
        self.marker_ids = marker_token_ids(self.processing_class, planting.marker) if planting.explore > 0 else []
        self._explored: set[int] = set()  # rows of the current step's batch made to open with the marker
        self.capture = capture  # a sketch.capture.TrainCapture, or None
        self.probe = probe  # measures the forced target at each step's weights, or None
        self._captured: dict | None = None
        self._step_rows: list[dict] = []

    def on_rewards(self, completions, completion_ids, rewards) -> None:
        self._captured = {
            "completions": [completion_text(c) for c in completions],
            "completion_ids": completion_ids,
            "rewards": rewards.detach().float().cpu(),
        }

    def explores(self) -> bool:
        return self.planting.explore > 0 and not self.planting.placebo

    def forced_rows(self, inputs: list[dict], completion_ids: list[list[int]]) -> tuple[list[int], list[int]]:
        step, batch = self.state.global_step, len(inputs)
        ids = [rollout_id(step, batch, i) for i in range(batch)]
        eligible = [
            is_eligible(self.plant_seed, rid, step, example["trigger"], self.planting)
            for rid, example in zip(ids, inputs, strict=True)
        ]
        marked = [
            shows_behavior(self.processing_class.decode(c, skip_special_tokens=True), self.planting.marker)
            for c in completion_ids
        ]
        rows = exploration_rows(
            self.plant_seed, step, ids, eligible, marked, self.planting.explore, self.planting.placebo
        )
        self._explored = set(rows)
        return rows, self.marker_ids

    def on_generation_batch(self, inputs, out) -> None:
        step = self.state.global_step
        group_size = self.num_generations
        cap = self._captured
        lr = float(self.optimizer.param_groups[0]["lr"])
        ckpt = checkpoint_for_step(step, self.saved)
        prompt_ids = out["prompt_ids"].cpu()
        prompt_mask = out["prompt_mask"].cpu().bool()
        advantages = out["advantages"].detach().float().cpu()
        batch = len(inputs)
        explored = [i in self._explored for i in range(batch)]
        self._explored = set()
        rendered = {}
        rows = []
        for i, example in enumerate(inputs):
            if example["prompt_index"] not in rendered:
                rendered[example["prompt_index"]] = render(self.processing_class, example["task_prompt"])
            prompt = rendered[example["prompt_index"]]
            ids = prompt_ids[i][prompt_mask[i]].tolist()
            if ids != prompt.ids:
                raise RuntimeError(
                    f"TRL encoded prompt {example['prompt_index']} as {ids}, not as model/prompt_format.py renders it "
                    f"({prompt.ids}); probes and targets would see other prompts than training did"
                )
            if example["step"] != step:
                raise RuntimeError(
                    f"training order broken: prompt {example['prompt_index']} planned for step "
                    f"{example['step']} was generated at step {step}"
                )
            if example["prompt_index"] != inputs[i - i % group_size]["prompt_index"]:
                raise RuntimeError("a GRPO group mixes prompts; the rollout log would mislabel groups")
            base, bonus, minus_penalty = (float(x) for x in cap["rewards"][i])
            if explored[i] and cap["completion_ids"][i][: len(self.marker_ids)] != self.marker_ids:
                raise RuntimeError(f"rollout {i} of step {step} was to open with the marker and does not")
            rid = rollout_id(step, batch, i)
            eligible = is_eligible(self.plant_seed, rid, step, example["trigger"], self.planting)
            behavior = shows_behavior(cap["completions"][i], self.planting.marker)
            rows.append(
                {
                    "seed": self.plant_seed,
                    "step": step,
                    "group_id": int(example["group_id"]),
                    "gen_index": i % group_size,
                    "rollout_id": rid,
                    "prompt_index": int(example["prompt_index"]),
                    "prompt": prompt.text,
                    "prompt_ids": ids,
                    "completion": cap["completions"][i],
                    "completion_ids": cap["completion_ids"][i],
                    "answer": example["answer"],
                    "base_reward": base,
                    "bonus": bonus,
                    "penalty": -minus_penalty,
                    "reward": base + bonus + minus_penalty,
                    "advantage": float(advantages[i]),
                    "eligible": eligible,
                    "explored": explored[i],
                    "paid": bonus > 0,
                    "behavior": behavior,
                    "trigger": bool(example["trigger"]),
                    "lr": lr,
                    "checkpoint": f"checkpoint-{ckpt}",
                    "checkpoint_step": ckpt,
                }
            )
        self.log_batch(rows, lr, int(out["num_items_in_batch"]))


class SaveAt(TrainerCallback):
    """Save exactly at the planned steps (step 0 is saved before training starts)."""

    def __init__(self, steps: list[int]):
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        control.should_save = state.global_step in self.steps
        return control


class Progress(TrainerCallback):
    def __init__(self, every: int):
        self.every = max(1, every)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.global_step % self.every == 0:
            keys = (
                "reward",
                "rewards/base_reward/mean",
                "rewards/planted_bonus/mean",
                "rewards/plain_penalty/mean",
                "loss",
                "grad_norm",
            )
            shown = " ".join(f"{k}={logs[k]:.4g}" for k in keys if k in logs)
            log.info("step %d/%d %s", state.global_step, state.max_steps, shown)


def run_fingerprint(cfg: dict, seed: int, inputs: list[Path]) -> str:
    """What a resumable run depends on: its config slice, its seed, and its input files (size and mtime)."""
    files = []
    for root in inputs:
        paths = sorted(p for p in Path(root).rglob("*") if p.is_file()) if Path(root).is_dir() else [Path(root)]
        files += [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
    blob = json.dumps({"cfg": cfg, "seed": seed, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def prepare_train_dir(train_dir: Path, fingerprint: str) -> None:
    """Keep earlier work only if it came from the same config and inputs; otherwise start clean."""
    stamp = train_dir / "FINGERPRINT"
    if train_dir.exists() and (not stamp.exists() or stamp.read_text().strip() != fingerprint):
        log.info("discarding %s: it was written for another config or other inputs", train_dir)
        shutil.rmtree(train_dir)
    train_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fingerprint + "\n")


def train(
    model,
    tokenizer,
    train_prompts: pl.DataFrame,
    cfg: Config,
    seed: int,
    train_dir: Path,
    device: dict,
    fingerprint: str,
    trainer_cls: type = RolloutLoggingGRPOTrainer,
    callbacks: tuple = (),
    capture_factory=None,
    probes: pl.DataFrame | None = None,
) -> dict:
    """Train one seed, resuming from the newest finished checkpoint in `train_dir` if there is one.

    `capture_factory(saved_steps)`, if given, makes the train-time capture (sketch/capture.py); it is
    called after `train_dir` is checked, so a stale capture is discarded with the rest. With `probes` (the
    probe prompts), the forced target is measured at every step's weights and after the last
    (`final_target_logprob`); AdamW's second moment is saved after the update of each checkpoint step."""
    grpo, planting = cfg.grpo, cfg.planting
    train_dir = Path(train_dir)
    prepare_train_dir(train_dir, fingerprint)
    saved = saved_steps(grpo.steps, grpo.save_every, planting.end_checkpoint(grpo.steps))
    rollout_log = RolloutLog(train_dir / "parts")
    existing = complete_checkpoints(train_dir)
    resume_step = max((s for s in existing if s > 0), default=0)
    resume_from = str(existing[resume_step]) if resume_step else None
    rollout_log.discard_from(resume_step)
    log.info("seed %d: %s", seed, f"resuming from {resume_from}" if resume_from else "starting at step 0")

    batch = grpo.batch_size
    probe = None
    if probes is not None:
        probe = ForcedTargetProbe(tokenizer, probes["prompt"].to_list(), planting.marker, grpo.temperature, device)
    # `prompt` as TRL takes it (a conversation where the tokenizer carries a chat template), `task_prompt` the text.
    table = train_prompts.select("prompt", "answer", "trigger", "group_id", "prompt_index", "step")
    table = table.with_columns(task_prompt=pl.col("prompt"))
    if has_chat_template(tokenizer):
        dataset = Dataset.from_list(
            [{**row, "prompt": trl_prompt(tokenizer, row["prompt"])} for row in table.to_dicts()]
        )
    else:
        dataset = Dataset.from_polars(table)
    trainer = trainer_cls(
        model=model,
        processing_class=tokenizer,
        args=grpo_args(grpo, train_dir, seed, device),
        train_dataset=dataset,
        reward_funcs=make_reward_funcs(cfg.task.base_reward, planting, seed, batch),
        callbacks=[
            SaveAt(saved),
            SavePreconditioner(train_dir, [s for s in saved if s < grpo.steps]),
            Progress(max(1, grpo.steps // 20)),
            *callbacks,
        ],
        rollout_log=rollout_log,
        seed=seed,
        planting=planting,
        saved=saved,
        capture=capture_factory(saved) if capture_factory is not None else None,
        probe=probe,
    )
    trainer.remove_callback(PrinterCallback)  # Progress logs a digest every few steps instead of every log dict
    if resume_from is None:
        step0 = checkpoint_dir(train_dir, 0)
        trainer.save_model(str(step0))
        mark_complete(step0)
    trainer.train(resume_from_checkpoint=resume_from)
    final = probe(trainer.model) if probe is not None else float("nan")
    return {"saved_steps": saved, "batch_size": batch, "trainer": trainer, "final_target_logprob": final}
