"""The package's import graph: which behaviortrace module imports which, and whether the house rules hold.

Rules (tests/test_architecture.py checks them):
- no import cycle between modules (package `__init__` files import nothing of the package);
- a `stage` module (what a rule's script calls) is imported by no module of the package;
- estimators import only the vector helpers, never stages or training code;
- dependencies point down: the subpackages stand in the layers of `LAYERS`, lowest first, and a library
  module (any module of a subpackage but its `stage`) imports only its own subpackage and the layers below
  its own; subpackages that share a layer do not import each other. The stage modules, and the modules
  directly in `src/behaviortrace/` outside any subpackage, stand above every layer: they may import any
  library module (never a stage), and no library module imports them.

Run `python diagnostics/import_graph.py` to print the graph (one line per module, its imports after
the arrow), any cycle, and any broken rule.
"""

from __future__ import annotations

import sys

from behaviortrace.common.imports import PACKAGE_ROOT, imported_modules, module_files

# The subpackages of src/behaviortrace/, one layer per entry, from the lowest to the highest (docs/layout.md
# shows them in this order). A library module imports its own subpackage and the layers below its own only.
LAYERS: list[tuple[str, ...]] = [
    ("config",),  # the schema, loading and the typed sections: everything reads the config
    ("common",),  # atomic writes, devices, seeds, code digests, Markdown, vector helpers
    ("plant", "gradients"),  # the task and its planted behavior; batches, log-probs, per-example capture
    ("model",),  # the tiny model, loading real ones, the prompt format, the SFT warm-up
    ("train", "behavior"),  # GRPO and TRL's surface, checkpoints; behavior rates
    ("sketch",),  # sketch maps, the capture preflight, the sketcher, train-time capture, stores
    ("targets", "estimators"),  # target gradients; the estimator modules (on the vector helpers alone)
    ("score",),  # the estimator contract (it loads the estimators), SeedView and Target
    ("evaluate", "replay"),  # metrics and their cells; removal sets and retraining
    ("report", "influence"),  # tables, checklist, figures, results page; exact influence
]
# Where the stage modules and the package's top-level modules stand: above every layer.
TOP = len(LAYERS)


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
            allowed = ("behaviortrace.common.vectors", "behaviortrace.common", "behaviortrace")
            extra = sorted(t for t in targets if t not in allowed)
            if extra:
                problems.append(f"estimator {src} imports {', '.join(extra)} (only behaviortrace.common.vectors)")
    return problems


def subpackages() -> list[str]:
    """The subpackages of src/behaviortrace/ (folders with an `__init__.py`), by name."""
    return sorted(path.parent.name for path in PACKAGE_ROOT.glob("*/__init__.py"))


def layer_of(name: str, layers: list[tuple[str, ...]] = LAYERS) -> int | None:
    """The layer of module `name`: -1 for the package itself (its `__init__` holds the version only), TOP for a
    stage and for a module directly in the package, the index in `layers` of its subpackage for any other
    module, and None for a module of a subpackage that no layer holds."""
    parts = name.split(".")
    if len(parts) == 1:
        return -1
    index = {package: i for i, layer in enumerate(layers) for package in layer}
    if parts[1] in index:
        return TOP if is_stage(name) else index[parts[1]]
    return None if parts[1] in subpackages() else TOP


def upward_imports(edges: dict[str, set[str]], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Every import of a library module that breaks the layer order: one of a higher layer (a stage or a
    top-level module included), or one of another subpackage of its own layer; and every module of a
    subpackage that no layer holds."""
    problems = []
    for src, targets in sorted(edges.items()):
        own = layer_of(src, layers)
        if own is None:
            problems.append(f"{src}: its subpackage is in no layer (diagnostics/import_graph.py LAYERS)")
            continue
        if own == TOP:
            continue
        # A package's `__init__` counts only where none of its modules is imported (they name it).
        for dst in sorted(t for t in targets if not any(u.startswith(t + ".") for u in targets)):
            theirs = layer_of(dst, layers)
            if theirs is None or theirs > own:
                problems.append(f"{src} (layer {own}) imports {dst} (layer {theirs}): a higher layer")
            elif theirs == own and dst.split(".")[1] != src.split(".")[1]:
                problems.append(f"{src} imports {dst}: another subpackage of its own layer ({own})")
    return problems


def main() -> int:
    edges = graph()
    shown = graph(with_packages=False)
    short = lambda name: name.removeprefix("behaviortrace.") or "behaviortrace"  # noqa: E731
    for name in sorted(shown):
        print(f"{short(name):<26} -> {', '.join(sorted(short(t) for t in shown[name])) or '-'}")
    found = cycles(edges)
    problems = rule_violations(edges) + upward_imports(edges)
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
