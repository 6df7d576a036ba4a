"""`--cpu-durations N`: the N tests (setup, call and teardown together) that took the most CPU time, their process's
and its ended child processes' (a workflow a test runs counts where it runs), beside their wall time; the session's
total; and the CPU time of each background run (tests/background.py), which no test's process counts. CI's time on
two cores is set by CPU time, which --durations (wall time) does not show. Under pytest-xdist each worker measures
its own tests and sends them to the controller, which prints."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from behaviortrace.common.io import cpu_seconds


def _cpu() -> float:
    return sum(cpu_seconds())


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N", help="list the N costliest tests by CPU")


_TIMES: dict[str, list[float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _TIMES[item.nodeid] = [_cpu() - cpu, time.perf_counter() - wall]


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand its times to the controller
        session.config.workeroutput["cpu_times"] = _TIMES


def pytest_testnodedown(node, error):
    _TIMES.update(getattr(node, "workeroutput", {}).get("cpu_times", {}))


def pytest_terminal_summary(terminalreporter, config):
    from background import runs_cpu
    from conftest import shared_root

    n = config.getoption("--cpu-durations")
    if n is None or not _TIMES:
        return
    total = sum(cpu for cpu, _ in _TIMES.values())
    terminalreporter.write_sep("=", f"slowest {n} tests by CPU time (all {len(_TIMES)}: {total:.0f} CPU s)")
    for nodeid, (cpu, wall) in sorted(_TIMES.items(), key=lambda kv: -kv[1][0])[:n]:
        terminalreporter.write_line(f"{cpu:8.1f} CPU s {wall:8.1f} s  {nodeid}")
    runs = runs_cpu(Path(shared_root(config)))
    if runs:
        terminalreporter.write_sep("=", f"background runs ({sum(c for c, _ in runs.values()):.0f} CPU s)")
        for name, (cpu, wall) in sorted(runs.items(), key=lambda kv: -kv[1][0]):
            terminalreporter.write_line(f"{cpu:8.1f} CPU s {wall:8.1f} s  {name}")
