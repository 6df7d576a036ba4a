"""Which project modules a source file imports: the one reading of imports behind the code digests (score
jobs' in score/contract.py, the evaluation cache's in evaluate/cache.py) and the import-graph check
(behaviortrace/layers.py)."""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = Path(path).resolve().relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their `__init__.py`)."""
    return {module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> frozenset[str]:
    """Project modules `path` imports anywhere (top level or inside functions), with the packages whose
    `__init__` files importing them runs."""
    stat = Path(path).stat()
    return _imported_modules(Path(path), stat.st_mtime_ns, stat.st_size, frozenset(known))


@functools.lru_cache(maxsize=4096)
def _imported_modules(path: Path, mtime_ns: int, size: int, known: frozenset[str]) -> frozenset[str]:
    """`imported_modules`, parsed once per file version (each score job's digest walks the same modules: parsing
    them again for each of a run's estimators cost Snakemake seconds)."""
    found = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                # `from pkg import module` imports the module; `from pkg.module import thing`, pkg.module.
                submodule = f"{node.module}.{a.name}"
                if submodule in known:
                    found.add(submodule)
                elif node.module in known:
                    found.add(node.module)
    for name in list(found):
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(found & known)


def dependency_files(modules: list[str]) -> list[Path]:
    """The files of `modules` and of every project module they import, transitively."""
    files = module_files()
    known = set(files)
    todo, seen = list(modules), set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(imported_modules(files[module], known) - seen)
    return sorted(files[m] for m in seen)


def code_digest(paths: list[Path]) -> str:
    """A digest of the source files, independent of where the checkout lies."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
