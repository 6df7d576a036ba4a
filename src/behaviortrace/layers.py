"""The house plan, checked (tests/test_architecture.py; `python diagnostics/import_graph.py` prints it).

The package stands on floors. The library subpackages stand in the layers of `LAYERS`, lowest first: a library
module imports only its own subpackage and the layers below its own, and subpackages that share a layer do not
import each other. Above every layer stand the floors that only callers use: `jobs` (the rules' entry points, one
module per rule file, each exporting job functions only), `tools` (what benchmarks, diagnostics and tests share)
and the modules directly in `src/behaviortrace/` (the Python API, the config's loading for Snakemake, this plan).
They may import any library module; no library module imports them, and no job imports a tool.

The tools (benchmarks/, diagnostics/, examples/, tests/, workflow/scripts/) import the installed package, never a
file by its path: no `sys.path` edits and no import of another tool's script, so every arrow between them is an
import of the package, which this plan sees. From `jobs` they import job functions only. Estimators import only the
vector helpers, and no import closes a cycle (package `__init__` files import nothing).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from behaviortrace.common.imports import PACKAGE_ROOT, imported_modules, module_files

# The library subpackages of src/behaviortrace/, one layer per entry, from the lowest to the highest (docs/layout.md
# shows them in this order). A library module imports its own subpackage and the layers below its own only.
LAYERS: list[tuple[str, ...]] = [
    ("config",),  # the schema, loading and the typed sections: everything reads the config
    ("common",),  # atomic writes, devices, seeds, code digests, Markdown, vector helpers
    ("plant", "gradients"),  # the task and its planted behavior; batches, log-probs, per-example capture
    ("model",),  # the tiny model, loading real ones, the prompt format, the SFT warm-up
    ("train", "behavior"),  # GRPO and TRL's surface, checkpoints, the run's outputs; behavior rates
    ("sketch",),  # sketch maps, the capture preflight, the sketcher, train-time capture, stores
    ("targets", "estimators"),  # target gradients; the estimator modules (on the vector helpers alone)
    ("score",),  # the estimator contract (it loads the estimators), SeedView and Target, ModelRun
    ("evaluate", "replay"),  # metrics and their cells; removal sets and retraining
    ("report", "influence"),  # tables, checklist, figures, results page; exact influence
    ("preflight",),  # every job that needs the model tried on it; the base model
]
# The floors above every layer, used by callers only: the rules' entry points and the tools' shared code.
FLOORS = ("jobs", "tools")
TOP = len(LAYERS)  # where the floors and the package's top-level modules stand
# Folders of the repository whose Python files are tools: callers of the package.
TOOL_FOLDERS = ("benchmarks", "diagnostics", "examples", "tests", "workflow/scripts")
# A job module's public names: its job functions, and its logger.
JOB_MODULE_NAMES = ("log",)


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


def floor_of(name: str) -> str | None:
    """The floor above the layers that module `name` stands on (`jobs`, `tools`), or None."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def rule_violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a floor's module from where it may not be imported, and estimators importing more than the
    vector helpers."""
    problems = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            floor = floor_of(dst)
            if floor and floor_of(src) != floor:
                problems.append(f"{src} imports {dst} (the {floor} floor is imported by callers only)")
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
    module of a floor and for a module directly in the package, the index in `layers` of its subpackage for any
    other module, and None for a module of a subpackage that no layer holds."""
    parts = name.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] in FLOORS:
        return TOP
    index = {package: i for i, layer in enumerate(layers) for package in layer}
    if parts[1] in index:
        return index[parts[1]]
    return None if parts[1] in subpackages() else TOP


def upward_imports(edges: dict[str, set[str]], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Every import of a library module that breaks the layer order: one of a higher layer (a floor or a
    top-level module included), or one of another subpackage of its own layer; and every module of a
    subpackage that no layer holds."""
    problems = []
    for src, targets in sorted(edges.items()):
        own = layer_of(src, layers)
        if own is None:
            problems.append(f"{src}: its subpackage is in no layer (behaviortrace/layers.py LAYERS)")
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


def job_module_exports(folder: Path = PACKAGE_ROOT / "jobs") -> list[str]:
    """Public names of a `jobs` module that are not job functions (a name ending in `_job`)."""
    problems = []
    for path in sorted(Path(folder).glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for name in names:
                if not name.startswith("_") and not name.endswith("_job") and name not in JOB_MODULE_NAMES:
                    problems.append(f"jobs/{path.name} exports {name}, which is no job function")
    return problems


def tool_files(root: Path) -> list[Path]:
    """Every Python file of the tool folders of the checkout at `root`."""
    return sorted(p for folder in TOOL_FOLDERS if (root / folder).exists() for p in (root / folder).rglob("*.py"))


def tool_graph(root: Path) -> dict[str, set[str]]:
    """Tool file (relative to `root`) -> the package's modules it imports."""
    known = set(module_files())
    return {p.relative_to(root).as_posix(): imported_modules(p, known) for p in tool_files(root)}


def tool_violations(root: Path) -> list[str]:
    """Tools that reach code by its path (a `sys.path` edit, an import of another tool's script) or import from
    `jobs` anything but job functions."""
    scripts = {
        p.stem for folder in ("benchmarks", "diagnostics", "examples") for p in (Path(root) / folder).glob("*.py")
    }
    problems = []
    for path in tool_files(root):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                problems.append(f"{where}:{node.lineno} uses sys.path (import the installed package)")
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names if a.name.split(".")[0] in scripts]
                problems += [f"{where}:{node.lineno} imports the script {name} by its path" for name in found]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in scripts:
                    problems.append(f"{where}:{node.lineno} imports the script {node.module} by its path")
                if node.module.startswith("behaviortrace.jobs"):
                    others = [a.name for a in node.names if not a.name.endswith("_job")]
                    problems += [
                        f"{where}:{node.lineno} imports {name} from {node.module} (jobs export jobs)" for name in others
                    ]
    return problems


def main(root: Path) -> int:
    edges = graph()
    shown = graph(with_packages=False)
    short = lambda name: name.removeprefix("behaviortrace.") or "behaviortrace"  # noqa: E731
    for name in sorted(shown):
        print(f"{short(name):<26} -> {', '.join(sorted(short(t) for t in shown[name])) or '-'}")
    tools = tool_graph(root)
    found = cycles(edges)
    problems = rule_violations(edges) + upward_imports(edges) + job_module_exports() + tool_violations(root)
    arrows = sum(map(len, edges.values()))
    print(
        f"\n{len(edges)} modules, {arrows} import edges; {len(tools)} tool files, "
        f"{sum(map(len, tools.values()))} imports of the package; {len(found)} cycles, {len(problems)} rule violations"
    )
    for c in found:
        print("cycle:", " <-> ".join(short(n) for n in c))
    for p in problems:
        print("violation:", p)
    return 1 if found or problems else 0
