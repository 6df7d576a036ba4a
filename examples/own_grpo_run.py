"""A GRPO run of your own, captured and scored by BehaviorTrace's Python API (docs/api.md); no Snakemake.

It trains the built-in tiny model of a workflow run with a plain TRL GRPOTrainer, on that run's prompts and reward
functions and with its GRPO settings, so that its scores can be set beside the workflow's: replace the model, the
prompts, the reward functions and the settings with your own.

    python examples/own_grpo_run.py results/default own_run      # after `make run`

It writes `own_run/capture/` (the rollout log, sketches, checkpoints' manifest, targets) and one score file per
estimator, `own_run/scores/{estimator}.parquet`; with `--influence`, also the exact influence
(`own_run/influence.parquet`) and the LDS of it and of every estimator (`own_run/lds.parquet`).
"""

import argparse
import time
from pathlib import Path

import polars as pl
import yaml
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from behaviortrace.api import Capture, Run
from behaviortrace.common.device import resolve
from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.train.grpo import make_reward_funcs

# Estimators to score with (a module of behaviortrace.estimators each, with its settings from the run's config): four
# that read sketches, dattri's TRAK, which reads the checkpoints (the peers extra, installed by `make run`), and two
# controls.
ESTIMATORS = ("gas", "trak", "adam_tracin", "tracincp", "dattri_trak", "reward", "random")


def main(results: Path, out: Path, influence: bool) -> None:
    started = time.time()
    # The workflow run's recorded config: its GRPO settings, its planted behavior and its estimators' settings.
    cfg = Config.from_dict(yaml.safe_load((results / "config.yaml").read_text()))
    g, seed = cfg.grpo, cfg.seeds[0]
    model, tokenizer = models.load(results / "base_model", resolve(cfg.compute))
    prompts = pl.read_parquet(results / "data" / "train_prompts.parquet")
    dataset = Dataset.from_polars(prompts.select("prompt", "answer", "trigger", "group_id"))
    args = GRPOConfig(
        output_dir=str(out / "train"),
        seed=seed,
        data_seed=seed,
        max_steps=g.steps,
        per_device_train_batch_size=g.batch_size,
        num_generations=g.num_generations,
        shuffle_dataset=False,  # the planted study plans which prompts each step trains on
        max_completion_length=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        learning_rate=g.lr,
        lr_scheduler_type=g.lr_scheduler,
        warmup_steps=g.warmup_steps,
        weight_decay=g.weight_decay,
        adam_beta1=g.adam_beta1,
        adam_beta2=g.adam_beta2,
        adam_epsilon=g.adam_epsilon,
        max_grad_norm=g.max_grad_norm,
        loss_type=g.loss_type,
        beta=g.beta,
        scale_rewards=g.scale_rewards,
        save_strategy="no",  # the capture saves the checkpoints it plans
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=dataset,
        reward_funcs=make_reward_funcs(cfg.task.base_reward, cfg.planting, seed, g.batch_size),
    )
    end = cfg.planting.end_checkpoint(g.steps)  # the workflow also saves the checkpoint that closes the window
    checkpoints = sorted({0, g.steps, end, *range(0, g.steps + 1, g.save_every)})
    sketch = {key: getattr(cfg.sketch, key) for key in ("method", "k", "seed", "shard_steps", "chunk_rollouts")}
    Capture(
        out / "capture",
        behavior=cfg.planting.marker,
        sketch=sketch,
        checkpoints=checkpoints,
        label_reward="planted_bonus",
    ).attach(trainer)
    trainer.train()
    trained = time.time()

    run = Run(out / "capture")
    probes = pl.read_parquet(results / "data" / "probe_prompts.parquet")["prompt"].to_list()
    target = run.target("forced", behavior=cfg.planting.marker, prompts=probes)
    (out / "scores").mkdir(parents=True, exist_ok=True)
    for name in ESTIMATORS:
        rollouts, _steps = run.score(name, target, **(cfg.estimators[name] or {}))
        rollouts.write_parquet(out / "scores" / f"{name}.parquet")
    paid = run.rollouts["paid"].sum()
    print(f"{run.rollouts.height} rollouts ({paid} labeled) captured in {trained - started:.1f} s")
    print(f"{len(ESTIMATORS)} estimators scored against the forced target in {time.time() - trained:.1f} s")
    if influence:
        # The exact influence on f(w_T) at the window's end, and each estimator's LDS beside it: the causal truth.
        scored = time.time()
        end = cfg.influence.end_step(cfg.planting, g.steps)
        exact, checks = run.influence(cfg.planting.marker, probes, end=end)
        exact.write_parquet(out / "influence.parquet")
        scores = {name: pl.read_parquet(out / "scores" / f"{name}.parquet") for name in ESTIMATORS}
        lds, _sets = run.lds({"exact influence": exact, **scores}, cfg.planting.marker, probes, end=end, subsets=20)
        lds.write_parquet(out / "lds.parquet")
        print(f"exact influence to step {end} and the LDS of 20 retrained subsets in {time.time() - scored:.1f} s")
        print(f"replay against the checkpoints: largest share of the update {checks['update_error'].max():.1e}")
        for row in lds.iter_rows(named=True):
            print(f"  LDS {row['name']:<16} {row['lds']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}]")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a workflow run's folder (results/{run})")
    parser.add_argument("out", type=Path, help="where the capture and the scores go")
    parser.add_argument("--influence", action="store_true", help="also the exact influence and every LDS (minutes)")
    main(**vars(parser.parse_args()))
