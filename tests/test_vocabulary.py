"""One word per concept (the glossary of docs/design.md): the retired synonyms appear nowhere in code or docs. The
generated results pages change with the next run that writes them, and the changelog keeps history's words."""

import re

from conftest import ROOT

# Retired word -> the glossary's word for it.
RETIRED = {
    r"ground[ _-]truths?": "the label, or a truth (the measured effect, the replay, the exact influence)",
    r"\bGT\b|_gt\b": "the label at step level: the paid steps",
    r"(?i:\boracle)": "the label (removal `label`, `checklist.min_label_drop`)",
    r"(?i:control prompts?)": "plain prompts (a control is an estimator)",
    r"paid_per_step|(?<![\w.])[\"']labels[\"'](?=,\s*[\"']none[\"'])": "the row `label`",
    r"\bK\b(?!-FAC)": "M, the segment length (k is the sketch width)",
}
SOURCES = ("src", "workflow", "benchmarks", "diagnostics", "examples", "tests", "config", "profiles", "docs")
SUFFIXES = (".py", ".smk", ".rst", ".md", ".yaml")
# Generated from a run (the next run's page uses the words), this file, which names the retired words, and the
# benchmark that reads runs from before the renames, which names them too.
SKIPPED = {"docs/results.md", "docs/paper_shape_results.md", "tests/test_vocabulary.py"}


# Lines that must keep a retired word: the label set's seeds are drawn from its former name, so that a run draws the
# random comparison sets it drew before the rename (replay/removal.py).
KEPT = {"src/behaviortrace/replay/removal.py": "SEED_SALT = "}


def files(root):
    found = [root / "README.md", root / "Snakefile", root / "Makefile"]
    for folder in SOURCES:
        found += [p for p in (root / folder).rglob("*") if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return [p for p in found if p.exists() and p.relative_to(root).as_posix() not in SKIPPED]


def retired_words(root) -> list[str]:
    """Every line of the code and docs under `root` that uses a retired word, with the word to use instead."""
    hits = []
    for path in files(root):
        kept = KEPT.get(path.relative_to(root).as_posix())
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if kept and line.startswith(kept):
                continue
            for pattern, instead in RETIRED.items():
                if re.search(pattern, line, re.IGNORECASE if pattern.startswith("ground") else 0):
                    hits.append(f"{path.relative_to(root)}:{n}: {line.strip()[:80]!r}: use {instead}")
    return hits


def test_code_and_docs_use_the_glossarys_words():
    assert retired_words(ROOT) == []


def test_the_check_finds_each_retired_word(tmp_path):
    (tmp_path / "docs").mkdir()
    lines = [
        "the ground-truth rollouts",
        "precision at |GT|",
        "removal = 'oracle'",
        "held-out control prompts",
        'rows += step_rows((arm, seed, None, "labels", "none"), counts)',
        "K states in memory",
        "labels = cell.labels; EK-FAC and K-FAC fits; the planted label; plain prompts",  # fine
    ]
    (tmp_path / "docs" / "page.md").write_text("\n".join(lines) + "\n")
    hits = retired_words(tmp_path)
    assert [int(h.split(":")[1]) for h in hits] == [1, 2, 3, 4, 5, 6]
