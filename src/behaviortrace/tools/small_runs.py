"""The tests' small configs: the default run's config shrunk so that a real GRPO run takes seconds, and the
workflow the tests run whole. Diagnostics reuse them."""

from __future__ import annotations

import copy

import yaml

from behaviortrace.tools.checkout import checkout


def default_config() -> dict:
    """The default run's whole config: config/config.yaml with every default filled in."""
    from behaviortrace.config.load import complete

    return complete(yaml.safe_load((checkout() / "config" / "config.yaml").read_text()))


def small_config() -> dict:
    """The default config, shrunk so that a real GRPO run takes seconds."""
    cfg = copy.deepcopy(default_config())
    cfg["seeds"] = [0]
    cfg["model"]["tiny"]["pretrain_steps"] = 40
    cfg["probes"].update(n_probes=8, n_plain=8, samples_per_prompt=2)
    cfg["grpo"].update(steps=6, prompts_per_step=3, num_generations=4, save_every=2, warmup_steps=0)
    # TRL's optimizer (the paper's; the default run's is the smooth regime): every step clipped, epsilon 1e-8, so
    # that the replay and the influence's clipping adjoint are checked where training is not smooth.
    cfg["grpo"].update(adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler="constant")
    cfg["influence"].update(measure_at="window_end", lds_percents=[50], leave_step_out=False)
    cfg["grpo"]["beta"] = 0.1  # the default run has no KL term; the tests check its gradients and replay too
    cfg["planting"]["window"] = [0, 2]
    cfg["planting"]["explore"] = 2  # below a step's eligible rollouts, so exploration tops up rather than forcing all
    # Two shards of three steps; chunks of 5 rollouts split the 12 rollouts of a step unevenly.
    cfg["sketch"].update(k=256, shard_steps=3, chunk_rollouts=5)
    cfg["targets"].update(samples_per_prompt=4)
    cfg["evaluation"]["bootstrap"] = 50
    cfg["replay"].update(estimators=["gas", "norm"], random_repeats=2, measure_at=["window_end", "final"])
    # Exact influence in float64, so that the job's own finite-difference check is exact; an estimator's set too.
    # A step-0 share of this run stays linear only below a delta of about 1e-6 (docs/influence.md): 1e-7.
    cfg["influence"].update(dtype="float64", fd_rollouts=2, fd_delta=1e-7, sets=["gas"])
    # dattri's TRAK (config/peers.yaml), projected below the 12 rollouts of the fewest a checkpoint generates, so
    # that its kernel is not singular without a ridge.
    cfg["estimators"]["dattri_trak"] = {"proj_dim": 8}
    return cfg


def workflow_config() -> dict:
    """The small config as the workflow tests run it (two seeds and a placebo seed)."""
    cfg = small_config()
    cfg.update(run="wf", seeds=[0, 1])
    cfg["planting"]["fraction"] = 1.0  # more paid rollouts in a six-step run
    # The smooth regime (docs/influence.md: AdamW's epsilon well above 1e-8, no clipping), where the exact
    # influence is the positive control of the checklist's LDS items; the LDS at both levels, and
    # leave-one-step-out. Small subsets (10% and 25% of the 9 groups and 36 rollouts before T): at 50% a
    # look-up of the reward predicted this run's removals as well as I did (margin -0.00 [-0.12, +0.11]).
    cfg["grpo"].update(adam_epsilon=1e-3, max_grad_norm=1e9)
    # Both meanings of removal retrained (config/smooth.yaml's setting; the default retrains its configured one only).
    cfg["influence"].update(
        lds_subsets=60, lds_percents=[10, 25], leave_step_out=True, bootstrap=500, lds_both_semantics=True
    )
    return cfg
