"""A job whose files cannot fit on its disk, or whose states cannot fit its memory, is refused before its work starts,
with the sizes and the key to change: training's checkpoints, and the exact influence's saved and held states."""

import copy
import shutil

import pytest

from conftest import typed


def test_training_and_the_influence_are_refused_where_the_disk_cannot_hold_what_they_save(
    cfg, base_model_dir, cpu, tmp_path
):
    from behaviortrace.influence.resources import check_disk as influence_check
    from behaviortrace.model import models
    from behaviortrace.train.checkpoints import check_disk as train_check

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


def _write(root, files: dict) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_memory_a_job_may_take_is_the_tightest_of_the_machine_and_its_cgroups(tmp_path):
    """SLURM and containers cap a job by its cgroup (v1 or v2), on the job's folder above the step's; the machine's
    available memory does not show it. Page cache the kernel can drop counts as room."""
    from behaviortrace.common.memory import available_memory, require_memory

    gb = 2**30
    v1 = tmp_path / "v1"
    _write(
        v1,
        {
            "proc/meminfo": f"MemTotal: {64 * gb // 1024} kB\nMemAvailable: {8 * gb // 1024} kB\n",
            "proc/self/cgroup": "5:cpu,cpuacct:/job_7\n4:memory:/job_7/step_0\n",
            "sys/fs/cgroup/memory/job_7/memory.limit_in_bytes": str(4 * gb),
            "sys/fs/cgroup/memory/job_7/memory.usage_in_bytes": str(3 * gb),
            "sys/fs/cgroup/memory/job_7/memory.stat": f"cache {gb}\ntotal_inactive_file {gb // 2}\n",
            "sys/fs/cgroup/memory/job_7/step_0/memory.limit_in_bytes": str(2**63 - 4096),  # no limit of its own
            "sys/fs/cgroup/memory/job_7/step_0/memory.usage_in_bytes": str(3 * gb),
        },
    )
    assert available_memory(v1) == gb + gb // 2
    v2 = tmp_path / "v2"
    _write(
        v2,
        {
            "proc/meminfo": f"MemAvailable: {gb // 1024} kB\n",
            "proc/self/cgroup": "0::/slurm/job_1/step_0\n",
            "sys/fs/cgroup/slurm/job_1/memory.max": str(16 * gb),
            "sys/fs/cgroup/slurm/job_1/memory.current": str(2 * gb),
            "sys/fs/cgroup/slurm/job_1/step_0/memory.max": "max",
            "sys/fs/cgroup/slurm/job_1/step_0/memory.current": str(2 * gb),
        },
    )
    assert available_memory(v2) == gb  # the machine is tighter than the job's limit here
    with pytest.raises(MemoryError, match=r"need 2\.1 GB of memory, and this job can take 1\.1 GB.*change some\.key"):
        require_memory(2 * gb, "the states", "some.key", v2)
    require_memory(gb, "the states", "some.key", v2)
    require_memory(10**15, "the states", "some.key", tmp_path / "elsewhere")  # nothing to read: nothing refused
    machine = int(next(line for line in open("/proc/meminfo") if line.startswith("MemAvailable")).split()[1]) * 1024
    assert 0 < available_memory() <= 1.1 * machine  # this machine's own files (the memory moved while reading)


def test_the_influence_is_refused_where_a_segment_of_states_cannot_fit_in_memory(cfg, base_model_dir, cpu):
    from behaviortrace.common.memory import available_memory
    from behaviortrace.influence.resources import check_memory
    from behaviortrace.model import models

    model = models.load(base_model_dir, cpu)[0]
    params = sum(p.numel() for p in model.parameters())
    check_memory(model, 10, typed(cfg).influence)  # the tests' own run fits
    steps = int(available_memory() // (3 * params * 8)) + 10  # a segment of float64 states larger than memory
    raw = copy.deepcopy(cfg)
    raw["influence"].update(segment_steps=steps, dtype="float64")
    with pytest.raises(MemoryError, match=r"change influence\.segment_steps") as err:
        check_memory(model, steps, typed(raw).influence)
    assert f"{steps} training states of a segment (3 x {params:,} numbers each, float64)" in str(err.value)
    check_memory(model, steps, typed(raw | {"influence": {**raw["influence"], "segment_steps": 2}}).influence)
