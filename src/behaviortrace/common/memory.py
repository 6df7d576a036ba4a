"""Refuse a job whose working set cannot fit the memory it may use before the hours of work that would end in an
out-of-memory kill (by the kernel, or by SLURM's cgroup limit, which the machine's free memory does not show)."""

from __future__ import annotations

from pathlib import Path

UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a number near 2^63


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _meminfo_available(root: Path) -> int | None:
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """What a cgroup folder still allows: its limit less its usage, page cache the kernel can drop not counted."""
    limit, usage = _read(folder / limit_file), _read(folder / usage_file)
    if limit is None or usage is None or limit == "max" or int(limit) >= UNLIMITED:
        return None
    stat = dict(line.split() for line in (_read(folder / "memory.stat") or "").splitlines() if " " in line)
    return int(limit) - int(usage) + int(stat.get(inactive_key, 0))


def _cgroup_available(root: Path) -> int | None:
    """The tightest room over this process's memory cgroup and its parents (v1 or v2)."""
    rooms = []
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            mounts = [root / "sys/fs/cgroup", root / "sys/fs/cgroup/unified"]
            files = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mounts = [root / "sys/fs/cgroup/memory"]
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        for mount in mounts:
            folder = mount / path.lstrip("/")
            while True:
                room = _cgroup_room(folder, *files)
                if room is not None:
                    rooms.append(room)
                if folder == mount:
                    break
                folder = folder.parent
    return min(rooms) if rooms else None


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes this process can still take: the machine's available memory, capped by its cgroup's room. None where
    neither can be read (not Linux): then nothing is refused."""
    found = [b for b in (_meminfo_available(root), _cgroup_available(root)) if b is not None]
    return min(found) if found else None


def require_memory(need: int, what: str, keys: str, root: Path = Path("/")) -> None:
    """Raise MemoryError unless `need` bytes fit in what this process can still take."""
    free = available_memory(root)
    if free is not None and need > free:
        raise MemoryError(
            f"{what} need {need / 1e9:,.1f} GB of memory, and this job can take {free / 1e9:,.1f} GB (the machine's "
            f"available memory, within its cgroup's limit); ask for more memory, or change {keys}"
        )
