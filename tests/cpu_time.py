"""`--cpu-durations N`: the N tests (setup, call and teardown together) that took the most CPU time, this process's
and its ended child processes' (a workflow a fixture runs counts where it runs), beside their wall time, and the
session's total. CI's time on two cores is set by CPU time, which --durations (wall time) does not show."""

from __future__ import annotations

import resource
import time

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N", help="list the N costliest tests by CPU")


_TIMES: dict[str, tuple[float, float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _TIMES[item.nodeid] = (_cpu() - cpu, time.perf_counter() - wall)


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _TIMES:
        return
    total = sum(cpu for cpu, _ in _TIMES.values())
    terminalreporter.write_sep("=", f"slowest {n} tests by CPU time (all {len(_TIMES)}: {total:.0f} CPU s)")
    for nodeid, (cpu, wall) in sorted(_TIMES.items(), key=lambda kv: -kv[1][0])[:n]:
        terminalreporter.write_line(f"{cpu:8.1f} CPU s {wall:8.1f} s  {nodeid}")
