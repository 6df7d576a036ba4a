"""BehaviorTrace as a library, for a GRPO run of your own (docs/api.md).

`Capture` is a callback for your own TRL `GRPOTrainer`: it logs every rollout the trainer trains on and sketches its
gradient at its step's exact weights, with the hooks, train-time capture and outputs of the workflow's training job
(train/trl_surface.py, train/grpo.py, sketch/capture.py, train/outputs.py). `Run` opens what a capture left, makes a
target of your own at every saved checkpoint (targets/gradients.py) and scores any estimator that reads sketches
against it, by the contract rule score runs (score/contract.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import zarr
from transformers import TrainerCallback

from behaviortrace.common import device as devices
from behaviortrace.common.io import atomic_write_text, replace_dir, scratch_dir
from behaviortrace.config.load import complete
from behaviortrace.config.schema import check_schema
from behaviortrace.config.sections import SCHEDULERS, Config
from behaviortrace.gradients.logprob import forced_items
from behaviortrace.influence.inputs import start
from behaviortrace.influence.lds import Resamples, interval, predicted_changes
from behaviortrace.influence.metagradient import StateStore, exact_influence
from behaviortrace.influence.retrain import value_after
from behaviortrace.influence.sets import lds_subsets, units
from behaviortrace.model import models
from behaviortrace.model.prompt_format import completion_text, prompt_ids
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.plant.planting import rollout_id, shows_behavior
from behaviortrace.replay.retrain import update_error, weight_difference
from behaviortrace.score import contract
from behaviortrace.score.model_run import ModelRun, ModelTarget
from behaviortrace.score.view import SeedView, Target
from behaviortrace.sketch.capture import TrainCapture, shard_name
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.targets.gradients import items_sketch
from behaviortrace.targets.items import load_items, save_items
from behaviortrace.train.checkpoints import (
    checkpoint_dir,
    checkpoint_for_step,
    mark_complete,
    read_manifest,
    saved_steps,
)
from behaviortrace.train.effect import ForcedTargetProbe
from behaviortrace.train.grpo import SaveAt, StepLogging
from behaviortrace.train.optimizer_log import SavePreconditioner, checkpoint_denominator
from behaviortrace.train.outputs import finalize
from behaviortrace.train.rolloutlog import RolloutLog
from behaviortrace.train.trl_surface import SKETCHABLE_LOSSES, install_hooks

log = logging.getLogger(__name__)
CONFIG_FILE = "config.json"  # the settings a capture ran with, as a BehaviorTrace config
REPLAY_FILE = "replay.json"  # why the exact influence could not replay the run (empty: it can)
SECTIONS = ("grpo", "sketch", "planting", "model", "compute", "influence")


class Capture(StepLogging, TrainerCallback):
    """Logs and sketches every rollout of your own GRPOTrainer into `folder`.

    `behavior`: the text whose presence in a completion marks the behavior (the rollout log's `behavior` column).
    `sketch`: settings of the config's `sketch` section (docs/config.md; `mode` does not apply). `save_every`:
    checkpoint every this many steps, besides step 0 and the last; or `checkpoints`, the steps to checkpoint
    (a rollout's target is the one at the newest checkpoint at or before its step).
    `label_reward`: the name of one of your reward functions; a rollout it pays (reward > 0) is labeled (the
    `paid` column, what the checklist's metrics call the label). `probes`: prompts on which the forced target (the
    behavior's log-prob right after each) is measured at every step's weights, for the step log.
    Call `attach(trainer)` before `trainer.train()`; the outputs are written when training ends.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        behavior: str,
        sketch: dict | None = None,
        save_every: int = 20,
        checkpoints: list[int] | None = None,
        label_reward: str | None = None,
        probes: list[str] | None = None,
    ):
        self.folder = Path(folder)
        self.behavior, self.sketch_settings, self.save_every = behavior, dict(sketch or {}), save_every
        self.label_reward, self.probe_prompts, self.checkpoints = label_reward, probes, checkpoints
        self._captured: dict | None = None

    def attach(self, trainer) -> Capture:
        """Hook `trainer` (a trl.GRPOTrainer) and add this callback to it; refuses settings capture cannot follow."""
        args = trainer.args
        problems = _trainer_problems(trainer, self.label_reward)
        steps = args.max_steps
        if self.checkpoints is not None and not ({0, steps} <= set(self.checkpoints) <= set(range(steps + 1))):
            problems.append(f"checkpoints = {self.checkpoints}: steps from 0 to GRPOConfig.max_steps = {steps}, both")
        if problems:
            raise ValueError("this GRPOTrainer cannot be captured:\n  " + "\n  ".join(problems))
        self.cfg = capture_config(args, self.behavior, self.sketch_settings, self.save_every, trainer.model)
        self.trainer, self.seed = trainer, args.seed
        self.batch = args.per_device_train_batch_size
        self.train_dir = Path(args.output_dir)
        self.saved = (
            saved_steps(steps, self.save_every, steps) if self.checkpoints is None else sorted(self.checkpoints)
        )
        self.rollout_log = RolloutLog(self.train_dir / "parts")
        self.device = devices.resolve(self.cfg.compute)  # the capture's config read it off the trainer
        fingerprint = hashlib.sha256(json.dumps([self.cfg.to_dict(), self.seed], sort_keys=True).encode()).hexdigest()
        ref = trainer.ref_model if args.beta else None
        self.capture = TrainCapture(
            self.cfg,
            trainer.model,
            trainer.processing_class,
            ref,
            self.folder / "capture",
            self.saved,
            fingerprint,
            self.device,
        )
        if self.probe_prompts:
            self.probe = ForcedTargetProbe(
                trainer.processing_class, self.probe_prompts, self.behavior, args.temperature, self.device
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(json.dumps(self.cfg.to_dict(), indent=1) + "\n", self.folder / CONFIG_FILE)
        install_hooks(trainer, self)
        for callback in (SaveAt(self.saved), SavePreconditioner(self.train_dir, [s for s in self.saved if s < steps])):
            trainer.add_callback(callback)
        trainer.add_callback(self)
        return self

    # Hooks (train/trl_surface.py): what TRL computed, as it computed it.
    def on_rewards(self, completions, completion_ids, rewards) -> None:
        self._captured = {
            "completions": [completion_text(c) for c in completions],
            "completion_ids": completion_ids,
            "rewards": rewards.detach().double().cpu().numpy(),
        }

    def on_generation_batch(self, inputs, out) -> None:
        t, cap = self.trainer, self._captured
        step, batch, group = t.state.global_step, len(inputs), t.num_generations
        lr = float(t.optimizer.param_groups[0]["lr"])
        names = list(t.reward_func_names)
        weights = [float(w) for w in t.reward_weights]
        label = names.index(self.label_reward) if self.label_reward else None
        prompt_ids_, prompt_mask = out["prompt_ids"].cpu(), out["prompt_mask"].cpu().bool()
        advantages = out["advantages"].detach().float().cpu()
        ckpt = checkpoint_for_step(step, self.saved)
        rows = []
        for i, example in enumerate(inputs):
            rid = rollout_id(step, batch, i)
            rewards = cap["rewards"][i]
            ids = prompt_ids_[i][prompt_mask[i]].tolist()
            rows.append(
                {
                    "seed": self.seed,
                    "step": step,
                    "group_id": int(example["group_id"]) if "group_id" in example else rid // group,
                    "gen_index": i % group,
                    "rollout_id": rid,
                    "prompt": t.processing_class.decode(ids, skip_special_tokens=True),
                    "prompt_ids": ids,
                    "completion": cap["completions"][i],
                    "completion_ids": cap["completion_ids"][i],
                    # TRL's sum of the weighted rewards, unscored (NaN) rewards left out
                    "reward": sum(w * float(r) for w, r in zip(weights, rewards, strict=True) if not math.isnan(r)),
                    **{f"reward_{n}": float(r) for n, r in zip(names, rewards, strict=True)},
                    "advantage": float(advantages[i]),
                    "paid": bool(rewards[label] > 0) if label is not None else False,
                    "behavior": shows_behavior(cap["completions"][i], self.behavior),
                    "trigger": bool(example["trigger"]) if "trigger" in example else None,
                    "eligible": None,
                    "lr": lr,
                    "checkpoint": f"checkpoint-{ckpt}",
                    "checkpoint_step": ckpt,
                }
            )
        self.log_batch(rows, lr, int(out["num_items_in_batch"]))

    # TrainerCallback events.
    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.rollout_log.discard_from(state.global_step)  # a resumed run redoes the steps after its checkpoint
        problems = replay_problems(args, optimizer)
        atomic_write_text(json.dumps({"problems": problems}, indent=1) + "\n", self.folder / REPLAY_FILE)
        if state.global_step == 0:
            step0 = checkpoint_dir(self.train_dir, 0)
            self.trainer.save_model(str(step0))
            mark_complete(step0)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        steps = args.max_steps
        finalize(
            self.train_dir,
            steps,
            self.batch,
            self.folder / "rollouts.parquet",
            self.folder / "steps.parquet",
            self.folder / "checkpoints.json",
            self.saved,
            self.probe(self.trainer.model) if self.probe is not None else float("nan"),
        )
        log.info("captured %d steps of %d rollouts into %s", steps, self.batch, self.folder)
        return control


def _trainer_problems(trainer, label_reward: str | None) -> list[str]:
    """What capture cannot follow, each naming its GRPOConfig field: one optimizer step per generation batch, on
    one process, with a loss whose per-rollout split is implemented."""
    args, problems = trainer.args, []
    for field in ("steps_per_generation", "num_iterations", "gradient_accumulation_steps"):
        if getattr(args, field) != 1:
            problems.append(f"GRPOConfig.{field} = {getattr(args, field)}: capture needs 1")
    if args.loss_type not in SKETCHABLE_LOSSES:
        problems.append(f"GRPOConfig.loss_type = {args.loss_type!r}: capture splits {', '.join(SKETCHABLE_LOSSES)}")
    if args.max_steps <= 0:
        problems.append("GRPOConfig.max_steps is not set: checkpoints are planned from it")
    if args.use_vllm or trainer.accelerator.num_processes != 1:
        problems.append("capture runs on one process with transformers' generate (no vLLM, no distributed run)")
    if args.fp16:
        problems.append("GRPOConfig.fp16: capture checks its sketches in float32 or bf16 autocast only")
    names = list(trainer.reward_func_names)
    if label_reward is not None and label_reward not in names:
        problems.append(f"label_reward {label_reward!r} is none of the reward functions ({', '.join(names)})")
    return problems


def capture_config(args, behavior: str, sketch: dict, save_every: int, model) -> Config:
    """The BehaviorTrace config of a captured run: its GRPO settings read from the trainer's GRPOConfig, the sketch
    settings given, the behavior as the planting's marker; validated as a workflow config is."""
    batch = args.per_device_train_batch_size
    scheduler = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    grpo = {
        "steps": args.max_steps,
        "prompts_per_step": batch // args.num_generations,
        "num_generations": args.num_generations,
        "max_new_tokens": args.max_completion_length,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "lr": args.learning_rate,
        "lr_scheduler": scheduler if scheduler in SCHEDULERS else "constant",
        "warmup_steps": int(args.warmup_steps) if float(args.warmup_steps).is_integer() else 0,
        "weight_decay": args.weight_decay,
        "adam_beta1": args.adam_beta1,
        "adam_beta2": args.adam_beta2,
        "adam_epsilon": args.adam_epsilon,
        "max_grad_norm": args.max_grad_norm,
        "loss_type": args.loss_type,
        "beta": args.beta,
        "scale_rewards": args.scale_rewards,
        "save_every": save_every,
    }
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    raw = complete({"grpo": grpo, "sketch": {**sketch, "mode": "train"}, "planting": {"marker": behavior}})
    raw["model"]["name"] = str(name)
    on_cuda = next(model.parameters()).is_cuda
    raw["compute"] = {"device": "cuda" if on_cuda else "cpu", "dtype": "bfloat16" if args.bf16 else "float32"}
    check_schema(raw)
    return Config.from_dict({key: raw[key] for key in SECTIONS})


def replay_problems(args, optimizer) -> list[str]:
    """Why the exact influence could not replay this training step for step (it rebuilds the optimizer and schedule
    as transformers' Trainer builds them from the captured GRPO settings), each naming its GRPOConfig field."""
    problems = []
    scheduler = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    if scheduler not in SCHEDULERS:
        problems.append(f"GRPOConfig.lr_scheduler_type = {scheduler!r}: the replay knows {', '.join(SCHEDULERS)}")
    if not float(args.warmup_steps).is_integer():
        problems.append(f"GRPOConfig.warmup_steps = {args.warmup_steps}: the replay takes a whole number of steps")
    for field in ("lr_scheduler_kwargs", "optim_args"):
        if getattr(args, field, None):
            problems.append(f"GRPOConfig.{field} = {getattr(args, field)!r}: the replay builds the defaults")
    inner = type(getattr(optimizer, "optimizer", optimizer))
    if inner.__module__ != "torch.optim.adamw" or inner.__name__ != "AdamW":
        problems.append(f"the optimizer is {inner.__module__}.{inner.__name__}: the replay is torch's AdamW only")
    return problems


class Run:
    """A captured run (what `Capture` left in its folder): its rollout log, sketch stores and checkpoints."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        missing = [n for n in (CONFIG_FILE, "rollouts.parquet", "checkpoints.json") if not (self.folder / n).exists()]
        if missing:
            raise FileNotFoundError(f"{self.folder} holds no finished capture ({', '.join(missing)} missing)")
        self.cfg = Config.from_dict(json.loads((self.folder / CONFIG_FILE).read_text()))
        self.rollouts_path = self.folder / "rollouts.parquet"
        n = self.cfg.sketch.n_shards(self.cfg.grpo.steps)
        self.shards = [self.folder / "capture" / shard_name(i) for i in range(n)]
        self.checkpoints, self.adam = read_manifest(self.folder / "checkpoints.json")

    @property
    def rollouts(self) -> pl.DataFrame:
        return pl.read_parquet(self.rollouts_path)

    def target(
        self,
        name: str,
        *,
        behavior: str | None = None,
        prompts: list[str] | None = None,
        completions: list[tuple[str, str]] | None = None,
        device: dict | None = None,
    ) -> Target:
        """A target of your own at every saved checkpoint, sketched with the run's map, and saved as
        `targets/{name}.zarr` in the run's folder (a rerun reads it). Either `behavior` (a text) and `prompts`: the
        gradient of the behavior's mean log-prob right after each prompt (the workflow's forced target); or
        `completions`, (prompt, completion) pairs: the gradient of the mean log-prob of each whole completion."""
        if (behavior is None) == (completions is None) or (behavior is not None and not prompts):
            raise ValueError("give either behavior= with prompts=, or completions=")
        store = self.folder / "targets" / f"{name}.zarr"
        if not (store.exists() and zarr.open_group(store, mode="r").attrs.get("complete")):
            self._write_target(store, name, behavior, prompts, completions, device or _cpu())
        return Target.load(store, name, 0)

    def _write_target(self, store: Path, name: str, behavior, prompts, completions, device: dict) -> None:
        sketch, temperature = self.cfg.sketch, self.cfg.grpo.temperature
        arrays = {f"{name}{s}": [] for s in ("", "_norm", "_n", "_adam")}
        has_adam, adam_meta, smap, kept = [], {}, None, {}
        for step, path in self.checkpoints.items():
            model, tokenizer = models.load(path, device)
            if smap is None:
                smap = SketchMap.for_model(model, sketch.method, sketch.k, sketch.seed)
            items = kept[step] = _items(tokenizer, behavior, prompts, completions)
            denominator, meta = checkpoint_denominator(self.adam.get(step), step, smap.device)
            adam_meta = meta or adam_meta
            has_adam.append(denominator is not None)
            found = items_sketch(model, tokenizer, smap, items, temperature, sketch.chunk_rollouts, denominator, device)
            for suffix, key in (("", "sketch"), ("_norm", "norm"), ("_n", "n"), ("_adam", "adam_sketch")):
                arrays[f"{name}{suffix}"].append(found[key])
            log.info("target %s at checkpoint %d: %d items", name, step, found["n"])
        partial = store.with_name(store.name + ".partial")
        group = zarr.open_group(partial, mode="w")
        group.create_array("checkpoint_step", data=np.array(list(self.checkpoints), dtype="int64"))
        group.create_array("has_adam", data=np.array(has_adam, dtype=bool))
        for key, values in arrays.items():
            vector = key in (name, f"{name}_adam")
            group.create_array(key, data=np.asarray(values, dtype="float32" if vector else None))
        save_items(kept, partial, name)
        group.attrs.update({**smap.attrs(), "adam": adam_meta, "complete": True})
        replace_dir(partial, store)

    def score(self, estimator: str, target: Target | None = None, **settings) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Score every rollout with `estimator` (a module of behaviortrace.estimators, or any name with
        `module=`; `settings` are its config entry) against `target`: a rollout table and a step table, as the
        workflow's score files hold them. An estimator that needs the model (ekfac, trackstar, dattri_trak) reads
        the checkpoints and the target's items, and fits what it prepares in a scratch folder of the run's,
        removed when it is done (rule score_model's way)."""
        problems = contract.check_params(estimator, settings)
        if problems:
            raise ValueError("\n".join(problems))
        instance = contract.Instance.of(estimator, settings)
        if not instance.needs_model:
            view = SeedView(self.shards, self.rollouts_path)
            return contract.run(estimator, settings, view, target if instance.uses_target else None)
        if target is None:
            raise ValueError(f"estimator {estimator} needs a target")
        steps = [int(s) for s in target.checkpoint_steps]
        items = load_items(self.folder / "targets" / f"{target.kind}.zarr", steps, target.kind)
        with scratch_dir(self.folder / f".scratch-{estimator}") as scratch:
            run = ModelRun(self.cfg, self.rollouts_path, self.folder / "checkpoints.json", self.checkpoints[0], scratch)
            cfg = self.cfg
            model_target = ModelTarget(
                target.kind,
                0,
                target.checkpoint_steps,
                items,
                cfg.grpo.temperature,
                cfg.sketch.chunk_rollouts,
                run.device,
            )
            return contract.run(estimator, settings, run, model_target)

    def influence(
        self,
        behavior: str,
        prompts: list[str],
        *,
        end: int | None = None,
        semantics: str = "advantages",
        segment_steps: int = 50,
        dtype: str = "float64",
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The exact influence I_z of every rollout of the steps before `end` (default: every step) on f(w_end),
        the behavior's mean log-prob right after each prompt, through the replayed training (docs/influence.md),
        by the code of rule influence: a table of `rollout_id`, `step`, `influence` (under `semantics`),
        `influence_advantages` and `influence_held`; and the replay's check against each saved checkpoint it
        passes (`weight_difference`, the largest; `update_error`, the distance as a share of the update)."""
        traj, objective, end, device = _replay(self, behavior, prompts, end, semantics, dtype)
        checks = []

        def compare(step_done: int, t) -> None:
            if step_done in self.checkpoints:
                saved, first = self.checkpoints[step_done], self.checkpoints[0]
                difference = weight_difference(t.model, saved, device)
                share = update_error(t.model, saved, first, device)
                checks.append({"step": step_done, "weight_difference": difference, "update_error": share})

        with tempfile.TemporaryDirectory(dir=self.folder, prefix=".states-") as folder:
            result = exact_influence(traj, objective, end, segment_steps, StateStore(folder, "cpu"), (), compare)
        return result.table(channels=False), pl.DataFrame(
            checks, schema={"step": pl.Int64, "weight_difference": pl.Float64, "update_error": pl.Float64}
        )

    def lds(
        self,
        scores: dict[str, pl.DataFrame],
        behavior: str,
        prompts: list[str],
        *,
        removed: list[set[int]] | None = None,
        subsets: int = 50,
        percent: int = 50,
        level: str = "rollout",
        end: int | None = None,
        semantics: str = "advantages",
        dtype: str = "float64",
        seed: int = 0,
        bootstrap: int = 1000,
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The linear datamodeling score of each attribution in `scores` (name -> a table with `rollout_id` and
        `score`, as `score` returns, or `influence`, as `influence` returns). Training is replayed to `end` once per
        removed set, its rollouts weighted 0 (under `semantics`); an attribution's LDS is the Spearman correlation
        of minus each set's summed scores with f(w_end) after it, with a bootstrap interval over the sets
        (influence/lds.py; every attribution on the same resamples). The sets are `removed`, or `subsets` random
        subsets of `percent` % of the rollouts (level rollout) or groups (level group) before `end`, drawn with
        `seed`. Returns a table of `name`, `lds`, `low`, `high`, and one of the sets: `removed_ids`, `f`."""
        traj, objective, end, _ = _replay(self, behavior, prompts, end, semantics, dtype)
        if removed is None:
            units_ = units(self.rollouts.filter(pl.col("step") < end), level)
            removed = lds_subsets(units_, subsets, percent, seed, "api", int(self.rollouts["seed"][0]), level)
        first = traj.state()
        measured = np.array([value_after(traj, first, dict.fromkeys(s, 0.0), end, objective) for s in removed])
        resamples = Resamples(measured, bootstrap, seed, "api", level, percent)
        rows = []
        for name, table in scores.items():
            column = "score" if "score" in table.columns else "influence"
            by_id = dict(zip(table["rollout_id"].to_list(), table[column].to_list(), strict=True))
            ids = sorted(by_id)
            place = {z: i for i, z in enumerate(ids)}
            members = [np.array([place[z] for z in sorted(s) if z in place], dtype=int) for s in removed]
            point, samples = resamples.lds(predicted_changes(np.array([by_id[z] for z in ids], float), members))
            rows.append({"name": name, "lds": point, **dict(zip(("low", "high"), interval(samples), strict=True))})
        sets = pl.DataFrame({"removed_ids": [sorted(s) for s in removed], "f": measured})
        return pl.DataFrame(rows), sets


def _replay(run: Run, behavior: str, prompts: list[str], end: int | None, semantics: str, dtype: str):
    """The replayed training of a captured run at step 0, f (the behavior's mean log-prob after each prompt) and
    T; refused where the run's optimizer cannot be replayed."""
    problems = json.loads((run.folder / REPLAY_FILE).read_text())["problems"]
    if problems:
        raise ValueError("the exact influence cannot replay this run:\n  " + "\n  ".join(problems))
    steps = run.cfg.grpo.steps
    end = steps if end is None else end
    if not 0 < end <= steps:
        raise ValueError(f"end = {end}: a number of steps from 1 to the run's {steps}")
    cfg = dataclasses.replace(run.cfg, influence=dataclasses.replace(run.cfg.influence, semantics=semantics))
    step0 = run.checkpoints[0]  # TRL's reference model for the KL term is the model training started from
    traj, objective, device = start(cfg, run.rollouts, step0, step0, prompts, behavior, dtype)
    return traj, objective, end, device


def _items(tokenizer, behavior, prompts, completions) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, completion ids, scored positions) of a target, formatted as in training."""
    if behavior is not None:
        return forced_items(prompt_ids(tokenizer, prompts), marker_token_ids(tokenizer, behavior))
    firsts = prompt_ids(tokenizer, [p for p, _ in completions])
    seconds = [tokenizer(c, add_special_tokens=False)["input_ids"] for _, c in completions]
    return [(p, list(c), list(range(len(c)))) for p, c in zip(firsts, seconds, strict=True) if c]


def _cpu() -> dict:
    import torch

    return {"use_cuda": False, "device": "cpu", "dtype": "float32", "torch_dtype": torch.float32}
