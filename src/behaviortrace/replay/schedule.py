"""Which jobs a leave-out replay waits on, for Snakemake's scheduling priorities.

An estimator's replay is the longest job downstream of its score jobs, so the jobs on its path (the seed's
Gram matrix, the estimator's score job, which writes the file that ranks its rollouts) and the replay itself run
before other ready jobs. Rerunning one replayed estimator then ends with its evaluations, not its replays.
Replays that need no scores (full, label, random) fill the gaps.
"""

from __future__ import annotations

from behaviortrace.config.sections import Replay
from behaviortrace.score.contract import UNDRAWN, Instance

PRIORITY = 10
# Replays that leave out a built-in set rather than an estimator's top-scored set.
BUILTIN = ("full", "label", "random")


def replay_priority(removal: str) -> int:
    return 0 if removal in BUILTIN else PRIORITY


def ranking_score(instance: Instance, replay: Replay) -> tuple[str, int]:
    """The (target kind, draw) of the score file whose rollout scores rank an estimator's replay."""
    return (replay.target_kind, replay.draw) if instance.uses_target else ("none", UNDRAWN)


def feeds_replay(
    job: dict,
    replay: Replay,
    planted_seeds: list[int],
    instances: dict[str, Instance],
) -> int:
    """PRIORITY for a sketch_gram or score job (`job`: its wildcards) that a replay waits on, else 0.

    sketch_gram jobs have no estimator (every replayed estimator that prepares reads them); a score job scores every
    draw and target kind of its estimator and seed, the one that ranks the replayed rollouts among them."""
    if job["arm"] != "planted" or int(job["seed"]) not in planted_seeds:
        return 0
    removal = job.get("estimator")
    if removal is None:
        return PRIORITY if any(instances[m].prepares for m in replay.estimators) else 0
    return PRIORITY if removal in replay.estimators else 0
