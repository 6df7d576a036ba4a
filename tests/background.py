"""Long runs the tests share (a whole study, the GPU check's workflows), started in the background as soon as the
session's tests are collected, and waited for by the fixtures that need them.

A study takes minutes of CPU, and the tests that read it are few beside the hundreds that do not: started early, it
runs while they do. Under pytest-xdist the first worker to collect starts each run (a lock file decides) and every
worker waits for that one: a run lives in the session's shared temporary folder. The run is a chain of commands in a
process of its own (this file, run as a script), which writes the first failing command's exit code, or 0, to the
file `exit` when it ends, and every command's output to `log`.

    python tests/background.py FOLDER COMMANDS_JSON     # what a started run executes
    python tests/background.py --detach FOLDER COMMANDS_JSON NICE   # starts it, no child of the caller
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

EXIT, LOG, STARTED, COST = "exit", "log", "started", "cost.json"


@dataclasses.dataclass
class Command:
    """One command of a run: its arguments, folder, extra environment, and a file (in the run's folder) for its
    standard output, else the run's log."""

    argv: list[str]
    cwd: str
    env: dict = dataclasses.field(default_factory=dict)
    stdout: str | None = None


class Background:
    """One named run under `root` (the session's shared temporary folder)."""

    def __init__(self, root: Path, name: str):
        self.folder = Path(root) / name

    def start(self, build: Callable[[Path], list[Command]], nice: int = 0) -> bool:
        """Start the commands `build(folder)` makes (writing what they read into the run's folder), one after
        another, at the scheduling priority `nice` (os.nice: higher yields to the tests), unless this session started
        them already; whether this call started them."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (self.folder / STARTED).exists():
                return False
            commands = build(self.folder)
            spec = json.dumps([dataclasses.asdict(c) for c in commands], default=str)
            # Started through a short-lived middle process, so that the run is no child of this one: its CPU time
            # is its own (cost.json), not counted in whichever test's process reaps it.
            subprocess.run([sys.executable, __file__, "--detach", str(self.folder), spec, str(nice)], check=True)
            return True

    def wait(self) -> tuple[int, str]:
        """Its exit code (the first failing command's, or 0) and the last lines of its output, once it has ended."""
        while not (self.folder / EXIT).exists():
            time.sleep(0.5)
        log = (self.folder / LOG).read_text(errors="replace") if (self.folder / LOG).exists() else ""
        return int((self.folder / EXIT).read_text()), log[-6000:]


def stop_unfinished(root: Path) -> list[str]:
    """Stop every run under `root` that has not ended (the session ended without waiting for it: a test failed
    first, or it was interrupted); their names."""
    stopped = []
    for started in Path(root).glob(f"*/{STARTED}"):
        if not (started.parent / EXIT).exists():
            try:
                os.killpg(int(started.read_text()), signal.SIGTERM)
                stopped.append(started.parent.name)
            except (ProcessLookupError, ValueError):
                pass
    return stopped


def runs_cpu(root: Path) -> dict[str, tuple[float, float]]:
    """The CPU and wall seconds of every ended run under `root`, by name."""
    return {p.parent.name: tuple(json.loads(p.read_text())) for p in Path(root).glob(f"*/{COST}")}


def _run(folder: Path, spec: str) -> int:
    code, started = 0, time.perf_counter()
    with open(folder / LOG, "w") as log:
        for command in map(lambda c: Command(**c), json.loads(spec)):
            log.write(f"$ {' '.join(command.argv)}\n")
            log.flush()
            out = open(folder / command.stdout, "w") if command.stdout else log  # noqa: SIM115 (closed below)
            env = {**os.environ, **command.env}
            code = subprocess.run(command.argv, cwd=command.cwd, env=env, stdout=out, stderr=log).returncode
            if out is not log:
                out.close()
            if code:
                break
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    (folder / COST).write_text(json.dumps([children.ru_utime + children.ru_stime, time.perf_counter() - started]))
    tmp = folder / f".{EXIT}.tmp"
    tmp.write_text(str(code))
    os.replace(tmp, folder / EXIT)
    return code


def _detach(folder: Path, spec: str, nice: int) -> None:
    """Start the run in its own session and process group, at priority `nice`, write its pid, and return."""
    proc = subprocess.Popen(
        [sys.executable, __file__, str(folder), spec],
        start_new_session=True,  # its own process group: stopped as one (stop_unfinished)
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.nice(nice),
    )
    (folder / STARTED).write_text(str(proc.pid))


if __name__ == "__main__":
    if sys.argv[1] == "--detach":
        _detach(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(_run(Path(sys.argv[1]), sys.argv[2]))
