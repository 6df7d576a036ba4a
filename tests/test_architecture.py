"""The house plan holds: no import cycle, stages called by scripts only, estimators on the contract alone,
rule files holding rules only, and scripts that read their paths from Snakemake."""

import ast
import re
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "diagnostics"))
import import_graph  # noqa: E402


def test_the_import_graph_has_no_cycle_and_keeps_the_rules():
    edges = import_graph.graph()
    assert import_graph.cycles(edges) == []
    assert import_graph.rule_violations(edges) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(edges) == [["a", "b", "c"]]
    assert import_graph.rule_violations({"x": {"behaviortrace.train.stage"}})


def test_every_subpackage_with_a_rule_has_a_stage_module_and_package_files_import_nothing():
    package = ROOT / "src" / "behaviortrace"
    for init in package.rglob("__init__.py"):
        found = [n for n in ast.walk(ast.parse(init.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert found == [], f"{init} imports; importing any submodule would run it"
    scripts = (ROOT / "workflow" / "scripts").glob("*.py")
    used = {m.group(1) for s in scripts for m in re.finditer(r"behaviortrace\.(\w+)\.stage", s.read_text())}
    assert used == {p.parent.name for p in package.glob("*/stage.py")}


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


def test_the_slurm_profile_sizes_every_rule():
    """A rule missing from the profile would run on the cluster with the small defaults (60 min, 4 GB)."""
    import yaml

    rules = {
        m.group(1)
        for path in [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk")]
        for m in re.finditer(r"^rule (\w+):", path.read_text(), flags=re.M)
    }
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert rules - {"all"} == set(profile["set-resources"]), rules ^ set(profile["set-resources"])
