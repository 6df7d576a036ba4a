"""The README, the pages under docs/ and config/README.md name only things that exist here.

- Every repository path they name in backticks exists: relative to the page, to the repository root, or to
  the package (`src/behaviortrace/`). Run outputs (`results/...`, or paths inside a run folder such as
  `tables/summary.md`) are not repository paths and are skipped; a placeholder (`{name}`) is checked up to
  its non-placeholder prefix, a glob must match. A dotted `behaviortrace.` name must import.
- Every Markdown link to a local file resolves, and so does its `#anchor`.
- Every ```python and ```yaml block parses. Every ```bash block parses (`bash -n`), and each of its
  commands has a target that exists: `make` targets are in the Makefile, options are Snakemake's own,
  `python script.py` answers `--help`, and `snakemake` commands run as dry runs in a temporary copy of the
  workflow (nothing is written to the checkout); commands that differ only in options that change no
  plan share one dry run.

The checkers are plain functions, so the last test shows that each of them can fail.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, fake_hub_cache, preset_hub_models

PACKAGE = ROOT / "src" / "behaviortrace"
DOCS = sorted([ROOT / "README.md", ROOT / "config" / "README.md", *(ROOT / "docs").glob("*.md")])
# Suffixes of source files: a span ending in one is a repository path wherever it points.
SOURCE_SUFFIXES = (".py", ".smk", ".rst", ".sh", ".yaml", ".yml", ".toml", ".cfg")
# What a dry run of the workflow needs from the checkout.
WORKFLOW_FILES = ("Snakefile", "workflow", "config", "profiles", "envs")
SNAKEMAKE = ("snakemake", ".venv/bin/snakemake")
PYTHON = ("python", "python3", ".venv/bin/python")
TIMEOUT = 600


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# Reading Markdown ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    return SPAN.findall(prose(text))


def link_targets(text: str) -> list[str]:
    return LINK.findall(SPAN.sub("", prose(text)))


def anchors(text: str) -> set[str]:
    """GitHub's anchors of the page's headings."""
    out = set()
    for line in prose(text).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


# Checkers (each returns a list of problems; empty when fine) -----------------------------------------------


@cache
def top_level() -> frozenset[str]:
    """First path components of the repository's files (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    if listed.returncode == 0 and listed.stdout.strip():
        return frozenset(line.split("/")[0] for line in listed.stdout.splitlines())
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith(".") and p.name != "results")


def is_repo_path(span: str) -> bool:
    """Whether a backticked span names a file or folder of the repository (not a run output, a command, a
    config key or a URL)."""
    if any(c.isspace() for c in span) or span.startswith(("-", "$", "~", "results/", ".venv/")) or "://" in span:
        return False
    first = span.split("/")[0]
    return ("/" in span and first in top_level()) or span in top_level() or span.endswith(SOURCE_SUFFIXES)


def path_problems(span: str, page: Path) -> list[str]:
    """Problems with a repository path named on `page`."""
    if span.startswith("behaviortrace."):
        return dotted_problems(span)
    if not is_repo_path(span):
        return []
    bases = [page.parent, ROOT, PACKAGE]
    if "{" in span or "<" in span:
        prefix = re.split(r"[{<]", span)[0]
        prefix = prefix[: prefix.rfind("/") + 1]
        if not prefix:
            return []
        found = any((base / prefix).is_dir() for base in bases)
        return [] if found else [f"{span}: no folder {prefix}"]
    if "*" in span:
        found = any(list(base.glob(span.rstrip("/"))) for base in bases)
        return [] if found else [f"{span}: matches nothing"]
    found = any((base / span).exists() for base in bases)
    return [] if found else [f"{span}: no such file or folder"]


def dotted_problems(name: str) -> list[str]:
    """A dotted name `behaviortrace.module[.attribute...]` must import and resolve."""
    parts = name.rstrip("()").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return [f"{name}: {'.'.join(parts[:cut])} has no {attr}"]
            obj = getattr(obj, attr)
        return []
    return [f"{name}: does not import"]


def link_problems(target: str, page: Path) -> list[str]:
    """Problems with a Markdown link on `page`: a local file must exist, its anchor must be a heading."""
    if re.match(r"^[a-z]+:", target):  # https:, mailto:
        return []
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return [f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"]
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
        return [f"{target}: no heading #{anchor} in {dest.name}"]
    return []


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block, one per line (continuation lines joined, comments dropped)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        argv = list(lexer)
        if argv:
            out.append(argv)
    return out


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


def command_problems(argv: list[str]) -> list[str]:
    """Problems found without running anything. Commands that need running (snakemake, python scripts) are
    checked for their target here and run by the tests below."""
    program, args = argv[0], argv[1:]
    shown = shlex.join(argv)
    if any(token in (";", "&&", "||", "|", "&", ">", "<") for token in argv):
        return [f"{shown}: one command per line, without pipes or redirections"]
    if program == "make":
        missing = [t for t in args if not t.startswith("-") and t not in make_targets()]
        return [f"{shown}: no make target {t}" for t in missing]
    if program == "export":
        return [f"{shown}: {a} is not NAME=VALUE" for a in args if not re.match(r"^[A-Z_][A-Z0-9_]*=", a)]
    if program == "cp":
        paths = [a for a in args if not a.startswith("-")]
        problems = [f"{shown}: no {src}" for src in paths[:-1] if not (ROOT / src).exists()]
        if paths and not (ROOT / paths[-1]).parent.exists():
            problems.append(f"{shown}: no folder for {paths[-1]}")
        return problems
    if program in SNAKEMAKE:
        report = args[args.index("--report") + 1] if "--report" in args[:-1] else "results/"
        problems = [] if report.startswith("results/") else [f"{shown}: the report should go under results/"]
        return problems + snakemake_option_problems(argv)
    if program in PYTHON:
        if args[:1] == ["-m"]:
            return [] if importlib.util.find_spec(args[1]) else [f"{shown}: no module {args[1]}"]
        return [] if args and (ROOT / args[0]).is_file() else [f"{shown}: no script {args[:1]}"]
    if "/" in program:
        script = ROOT / program
        if not (script.is_file() and os.access(script, os.X_OK)):
            return [f"{shown}: {program} is not an executable file of the repository"]
        return []
    return [f"{shown}: no check for the program {program!r}; use one the docs test knows"]


# Options that change no plan, with the number of values each takes: a command is dry-run without them.
NOT_PLANNING = {"-n": 0, "--dry-run": 0, "--cores": 1, "--resources": 1, "--report": 1}


def dry_run_args(argv: list[str]) -> list[str]:
    """A snakemake command as the dry run it stands for (a report needs a finished run, so `--report` is
    checked by Snakemake's argument parser only)."""
    args, out, skip = argv[1:], [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg in NOT_PLANNING:
            skip = NOT_PLANNING[arg]
        else:
            out.append(arg)
    return [*out, "-n"]


def snakemake_option_problems(argv: list[str]) -> list[str]:
    """What Snakemake's own argument parser refuses."""
    from snakemake.cli import get_argument_parser

    def refuse(*args):
        raise ValueError(args[-1] if args else "refused")

    parser = get_argument_parser()
    parser.exit = parser.error = refuse  # report instead of exiting the test process
    try:
        parser.parse_args(argv[1:])
    except ValueError as err:
        return [f"{shlex.join(argv)}: {err}"]
    return []


def dry_run(args: list[str], workdir: Path) -> subprocess.CompletedProcess:
    """Snakemake, from this Python, in a fresh copy of the workflow under `workdir`."""
    workdir.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        source, dest = ROOT / name, workdir / name
        shutil.copytree(source, dest) if source.is_dir() else shutil.copy(source, dest)
    # Validation wants a preset's hub model in the local cache (config/rules.py): as if downloaded.
    cache = fake_hub_cache(workdir / ".hf_cache", *preset_hub_models())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "snakemake", *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=TIMEOUT)


def answers_help(script: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, script, "--help"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)


# What the pages name -------------------------------------------------------------------------------------


def bash_commands() -> list[list[str]]:
    return [argv for page in DOCS for lang, body in fenced_blocks(page.read_text()) if lang == "bash"
            for argv in commands(body)]  # fmt: skip


def distinct(items) -> list:
    seen, out = set(), []
    for item in items:
        key = tuple(item) if isinstance(item, list) else item
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


# Snakemake commands that differ only in options that change no plan: one dry run each.
SNAKEMAKE_RUNS = distinct([dry_run_args(argv) for argv in bash_commands() if argv[0] in SNAKEMAKE])
SCRIPTS = distinct([argv[1] for argv in bash_commands() if argv[0] in PYTHON and argv[1:2] != ["-m"]])
# A run the dry-run checker must refuse (a config file that does not exist).
BROKEN_RUN = ["--configfile", "config/no_such_config.yaml", "-n"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every dry run and --help of the pages, and one broken dry run, a few at a time."""
    root = tmp_path_factory.mktemp("docs_runs")
    jobs = {("snakemake", tuple(args)): (dry_run, args, root / f"run{i}") for i, args in enumerate(SNAKEMAKE_RUNS)}
    jobs[("snakemake", tuple(BROKEN_RUN))] = (dry_run, BROKEN_RUN, root / "broken")
    jobs.update({("python", script): (answers_help, script) for script in SCRIPTS})
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {key: pool.submit(fn, *rest) for key, (fn, *rest) in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


# Tests ---------------------------------------------------------------------------------------------------


def test_the_readme_links_every_page_under_docs():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in link_targets((ROOT / "README.md").read_text())}
    pages = set((ROOT / "docs").glob("*.md"))
    assert pages, "no pages under docs/"
    assert not {p.resolve() for p in pages} - linked, "pages under docs/ that the README does not link"
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150, "the README should stay short"


def test_the_readme_states_the_default_runs_time_from_its_own_page():
    """The README's cost of the default run is the one docs/results.md (the run's own page) measured."""
    page = re.search(r"The run took ([0-9.]+) min of wall time", (ROOT / "docs" / "results.md").read_text())
    readme = re.search(r"the default run took ([0-9.]+) min", (ROOT / "README.md").read_text())
    assert page and readme, "the README or docs/results.md no longer states the default run's time"
    assert readme.group(1) == page.group(1), "README.md's time of the default run is not docs/results.md's"


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_named_paths_exist(page):
    problems = [p for span in code_spans(page.read_text()) for p in path_problems(span, page)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_links_resolve(page):
    problems = [p for target in link_targets(page.read_text()) for p in link_problems(target, page)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_bash_blocks_parse_and_name_what_exists(page):
    for lang, body in fenced_blocks(page.read_text()):
        if lang != "bash":
            continue
        parsed = subprocess.run(["bash", "-n"], input=body, capture_output=True, text=True)
        assert parsed.returncode == 0, f"{rel(page)}: bash cannot parse\n{body}\n{parsed.stderr}"
        problems = [p for argv in commands(body) for p in command_problems(argv)]
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_python_and_yaml_blocks_parse(page):
    for lang, body in fenced_blocks(page.read_text()):
        if lang == "python":
            compile(body, f"{rel(page)} (python block)", "exec")
        elif lang == "yaml":
            assert isinstance(yaml.safe_load(body), dict), f"{rel(page)}: a yaml block that is not a mapping"


@pytest.mark.parametrize("args", SNAKEMAKE_RUNS, ids=shlex.join)
def test_snakemake_commands_plan_as_dry_runs(runs, args):
    res = runs[("snakemake", tuple(args))]
    assert res.returncode == 0, f"snakemake {shlex.join(args)}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_answer_help(runs, script):
    res = runs[("python", script)]
    assert res.returncode == 0, f"python {script} --help\n{res.stderr[-3000:]}"


def test_the_checkers_catch_what_does_not_exist(runs, tmp_path):
    page = ROOT / "docs" / "any.md"
    # Paths: a missing file, a missing prefix of a placeholder, a glob matching nothing, a stale dotted name.
    assert path_problems("src/behaviortrace/estimators/no_such_estimator.py", page)
    assert path_problems("workflow/rules/no_such_rules.smk", page)
    assert path_problems("no_such_module.py", page)
    assert path_problems("src/behaviortrace/no_such_package/{name}.py", page)
    assert path_problems("workflow/rules/*.nothing", page)
    assert path_problems("behaviortrace.config.sections.Config.subset", page)
    # ... and what exists passes, while run outputs and config keys are not paths.
    assert not path_problems("src/behaviortrace/estimators/{name}.py", page)
    assert not path_problems("score/contract.py", page)
    assert not path_problems("behaviortrace.sketch.store.read_rows", page)
    assert not path_problems("tables/summary.md", page) and not path_problems("planting.window", page)
    # Links: a missing page, a missing anchor.
    assert link_problems("no_such_page.md", page)
    assert link_problems("evaluation.md#no-such-heading", page)
    assert not link_problems("evaluation.md#the-checklist", page)
    # Commands: an unknown make target, a missing script, a program nobody checks.
    assert command_problems(["make", "no-such-target"])
    assert command_problems([".venv/bin/python", "benchmarks/no_such_benchmark.py"])
    assert command_problems(["rm", "-rf", "results"])
    # A dry run of a command whose config file does not exist fails.
    assert runs[("snakemake", tuple(BROKEN_RUN))].returncode != 0


def test_the_checklist_items_in_evaluation_md_are_the_codes_in_its_order():
    """docs/evaluation.md lists every run item, and every method item under the number the checklist page gives
    it: a renamed, added or reordered item fails here until the page follows."""
    import re

    from behaviortrace.report import checklist as C

    page = (ROOT / "docs" / "evaluation.md").read_text()
    numbered = re.findall(r"^\| (\d+) \| `(\w+)` \|", page, re.M)
    assert [(int(n), item) for n, item in numbered] == [(i + 1, item) for i, item in enumerate(C.ITEMS)]
    for item in C.RUN_ITEMS:
        assert re.search(rf"^\| `{item}` \|", page, re.M), item
