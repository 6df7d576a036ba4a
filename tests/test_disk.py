"""A job whose files cannot fit on its disk is refused before its work starts, with the sizes and the key to change:
training's checkpoints, and the exact influence's saved states."""

import copy
import shutil

import pytest

from conftest import typed


def test_training_and_the_influence_are_refused_where_the_disk_cannot_hold_what_they_save(
    cfg, base_model_dir, cpu, tmp_path
):
    from behaviortrace.influence.stage import check_disk as influence_check
    from behaviortrace.model import models
    from behaviortrace.train.stage import check_disk as train_check

    model = models.load(base_model_dir, cpu)[0]
    params = sum(p.numel() for p in model.parameters())
    free = shutil.disk_usage(tmp_path).free
    train_check(typed(cfg), model, tmp_path / "train")  # the tests' own run fits
    raw = copy.deepcopy(cfg)
    raw["grpo"].update(steps=int(free // (8 * params)) + 10, save_every=1)  # a checkpoint per step: too many
    with pytest.raises(OSError, match=r"change grpo\.save_every") as err:
        train_check(typed(raw), model, tmp_path / "train")
    assert f"of {params:,} trainable parameters" in str(err.value) and "GB free" in str(err.value)

    influence = typed(cfg).influence
    influence_check(model, 10, set(), influence, tmp_path)
    steps = int(free // (3 * params * 8)) + 10  # a float64 state per step: more than the disk holds
    raw["influence"].update(segment_steps=1, dtype="float64")
    with pytest.raises(OSError, match=r"influence\.segment_steps") as err:
        influence_check(model, steps, set(), typed(raw).influence, tmp_path)
    assert f"{steps} saved training states (3 x {params:,} numbers each, float64)" in str(err.value)
    # Steps kept for retraining are states too: one segment, but every step kept.
    with pytest.raises(OSError, match=r"influence\.leave_step_out"):
        influence_check(
            model,
            steps,
            set(range(steps)),
            typed(cfg | {"influence": {**cfg["influence"], "segment_steps": steps}}).influence,
            tmp_path,
        )
