"""The package's import graph: which behaviortrace module imports which, and whether the house rules hold.

Rules (tests/test_architecture.py checks them):
- no import cycle between modules (package `__init__` files import nothing of the package);
- a `stage` module (what a rule's script calls) is imported by no module of the package;
- estimators import only the scoring helpers, never stages or training code.

Run `python diagnostics/import_graph.py` to print the graph (one line per module, its imports after
the arrow), any cycle, and any broken rule.
"""

from __future__ import annotations

import sys

from behaviortrace.common.imports import imported_modules, module_files


def graph(with_packages: bool = True) -> dict[str, set[str]]:
    """Module -> project modules it imports; `with_packages=False` leaves out the package `__init__`
    files (they import nothing, so they cannot close a cycle)."""
    mods = module_files()
    known = set(mods)
    packages = {name for name, path in mods.items() if path.name == "__init__.py"}
    edges = {name: imported_modules(path, known) - {name} for name, path in mods.items()}
    if not with_packages:
        edges = {name: deps - packages for name, deps in edges.items() if name not in packages}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def is_stage(name: str) -> bool:
    return name.endswith(".stage")


def rule_violations(edges: dict[str, set[str]]) -> list[str]:
    problems = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            if is_stage(dst):
                problems.append(f"{src} imports the stage {dst} (stages are called by scripts only)")
        if src.startswith("behaviortrace.estimators."):
            allowed = ("behaviortrace.score.vectors", "behaviortrace.score", "behaviortrace")
            extra = sorted(t for t in targets if t not in allowed)
            if extra:
                problems.append(f"estimator {src} imports {', '.join(extra)} (only behaviortrace.score.vectors)")
    return problems


def main() -> int:
    edges = graph()
    shown = graph(with_packages=False)
    short = lambda name: name.removeprefix("behaviortrace.") or "behaviortrace"  # noqa: E731
    for name in sorted(shown):
        print(f"{short(name):<26} -> {', '.join(sorted(short(t) for t in shown[name])) or '-'}")
    found = cycles(edges)
    problems = rule_violations(edges)
    print(
        f"\n{len(edges)} modules, {sum(map(len, edges.values()))} import edges, {len(found)} cycles, "
        f"{len(problems)} rule violations"
    )
    for c in found:
        print("cycle:", " <-> ".join(short(n) for n in c))
    for p in problems:
        print("violation:", p)
    return 1 if found or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
