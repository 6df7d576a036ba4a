"""The house plan holds (behaviortrace/layers.py): no import cycle, dependencies that point down the layers of
docs/layout.md, the floors above them (jobs, tools) imported by callers only, job modules exporting job functions
only, tools that import the installed package and nothing by its path, estimators on the vector helpers alone, rule
files holding rules only, and scripts that read their paths from Snakemake."""

import ast
import json
import re
import subprocess
import sys

from behaviortrace import layers as import_graph
from conftest import ROOT


def test_the_import_graph_has_no_cycle_and_keeps_the_rules():
    edges = import_graph.graph()
    assert import_graph.cycles(edges) == []
    assert import_graph.rule_violations(edges) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(edges) == [["a", "b", "c"]]
    assert import_graph.rule_violations({"x": {"behaviortrace.jobs.train"}})


def test_dependencies_point_down_the_layers():
    assert import_graph.upward_imports(import_graph.graph()) == []


def test_the_layer_check_finds_a_planted_upward_import():
    up = import_graph.upward_imports
    assert up({"behaviortrace.replay.table": {"behaviortrace.report.tables"}})  # a higher layer
    assert up({"behaviortrace.influence.markdown": {"behaviortrace.report.tables"}})  # a peer in its own layer
    assert up({"behaviortrace.score.contract": {"behaviortrace.configure"}})  # a top-level module
    assert up({"behaviortrace.sketch.maps": {"behaviortrace.jobs.model"}})  # a stage
    unlayered = [layer for layer in import_graph.LAYERS if layer != ("model",)]
    assert up({"behaviortrace.model.models": set()}, unlayered)  # a subpackage in no layer
    # Down the layers, within a subpackage, and from a stage or a top-level module to anything: fine.
    fine = {
        "behaviortrace.report.checklist": {"behaviortrace", "behaviortrace.common.markdown", "behaviortrace.replay"},
        "behaviortrace.sketch.capture": {"behaviortrace.sketch.loss_pass", "behaviortrace.train.checkpoints"},
        "behaviortrace.jobs.model": {"behaviortrace.sketch.preflight", "behaviortrace.model.models"},
        "behaviortrace.configure": {"behaviortrace.score.contract", "behaviortrace.train.trl_surface"},
    }
    assert up(fine) == []


def test_every_subpackage_stands_in_one_layer_and_the_layout_doc_shows_them_in_layer_order():
    layered = [(i, package) for i, layer in enumerate(import_graph.LAYERS) for package in layer]
    assert sorted([package for _, package in layered] + list(import_graph.FLOORS)) == import_graph.subpackages()
    doc = (ROOT / "docs" / "layout.md").read_text()
    rows = [(int(n), name) for n, name in re.findall(r"^\| (\d+) \| `src/behaviortrace/(\w+)/` \|", doc, re.M)]
    assert rows == layered


def test_package_docstrings_name_only_modules_that_exist():
    for init in (ROOT / "src" / "behaviortrace").glob("*/__init__.py"):
        named = set(re.findall(r"(?<![\w/])(\w+)\.py\b", ast.get_docstring(ast.parse(init.read_text())) or ""))
        missing = sorted(n for n in named if not (init.parent / f"{n}.py").exists())
        assert missing == [], f"{init} names {', '.join(missing)}, which do not exist"


def test_each_rule_file_has_a_job_module_that_exports_job_functions_only_and_package_files_import_nothing():
    package = ROOT / "src" / "behaviortrace"
    for init in package.rglob("__init__.py"):
        found = [n for n in ast.walk(ast.parse(init.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert found == [], f"{init} imports; importing any submodule would run it"
    rule_files = {p.stem for p in (ROOT / "workflow" / "rules").glob("*.smk")} - {"common"}
    assert {p.stem for p in (package / "jobs").glob("*.py")} - {"__init__"} == rule_files
    scripts = (ROOT / "workflow" / "scripts").glob("*.py")
    used = {m.group(1) for s in scripts for m in re.finditer(r"from behaviortrace\.jobs\.(\w+) import", s.read_text())}
    assert used == rule_files
    assert import_graph.job_module_exports() == []


def test_the_export_check_finds_a_helper_in_a_job_module(tmp_path):
    (tmp_path / "train.py").write_text(
        "log = 1\n_private = 2\n\n\ndef train_job():\n    pass\n\n\ndef setup():\n    pass\n"
    )
    assert import_graph.job_module_exports(tmp_path) == ["jobs/train.py exports setup, which is no job function"]


def test_tools_import_the_installed_package_and_nothing_by_its_path(tmp_path):
    assert import_graph.tool_violations(ROOT) == []
    graph = import_graph.tool_graph(ROOT)
    assert "behaviortrace.api" in graph["examples/own_grpo_run.py"]  # the tools' arrows are in the graph
    # The check can fail: a planted checkout whose benchmark edits sys.path, imports a diagnostic by its path and a
    # helper from a job module.
    for folder in ("benchmarks", "diagnostics"):
        (tmp_path / folder).mkdir()
    (tmp_path / "diagnostics" / "probe.py").write_text("X = 1\n")
    (tmp_path / "benchmarks" / "b.py").write_text(
        "import sys\nsys.path.insert(0, 'diagnostics')\nimport probe\nfrom behaviortrace.jobs.influence import setup\n"
    )
    found = import_graph.tool_violations(tmp_path)
    assert sorted(found) == [
        "benchmarks/b.py:2 uses sys.path (import the installed package)",
        "benchmarks/b.py:3 imports the script probe by its path",
        "benchmarks/b.py:4 imports setup from behaviortrace.jobs.influence (jobs export jobs)",
    ]


def test_rule_files_hold_rules_only_and_scripts_take_paths_from_snakemake():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        if smk.name == "common.smk":
            continue
        text = smk.read_text()
        assert not re.search(r"^(def |[A-Z_]+ =|from |import )", text, re.M), smk
        assert "results/" not in text, f"{smk}: paths belong in common.smk"
    for script in (ROOT / "workflow" / "scripts").glob("*.py"):
        text = script.read_text()
        assert "results/" not in text and "snakemake.config" not in text, script


# The rules whose jobs run the model; every other job reads tables, logs or sketches, and must not pay seconds of
# imports (torch, transformers, TRL) for it, nor matplotlib unless it draws.
MODEL_SCRIPTS = {"base_model", "behavior", "preflight", "targets", "train_grpo"}
HEAVY = ("torch", "transformers", "trl", "matplotlib")


def _loaded_by(modules: list[str]) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing `modules`."""
    imports = "".join(f"import {m}\n" for m in modules)
    code = f"import json, sys\n{imports}print(json.dumps(list(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {name.split(".")[0] for name in json.loads(out)}


def test_jobs_that_read_tables_import_no_model_library():
    modules = set()
    for script in sorted((ROOT / "workflow" / "scripts").glob("*.py")):
        if script.stem not in MODEL_SCRIPTS:
            tree = ast.parse(script.read_text())
            modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {"behaviortrace.jobs.score", "behaviortrace.jobs.report", "behaviortrace.jobs.influence"} <= modules
    assert not _loaded_by(sorted(modules)) & set(HEAVY)
    # The check can fail: a model rule's own job module loads them.
    assert {"torch", "transformers", "trl"} <= _loaded_by(["behaviortrace.jobs.train"])


def test_the_slurm_profile_sizes_every_rule():
    """A rule missing from the profile would run on the cluster with the small defaults (60 min, 4 GB)."""
    import yaml

    rules = {
        m.group(1)
        for path in [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk")]
        for m in re.finditer(r"^\s*rule (\w+):", path.read_text(), flags=re.M)  # a rule defined under an `if` too
    }
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert rules - {"all"} == set(profile["set-resources"]), rules ^ set(profile["set-resources"])
