"""Every caption of the HTML report (workflow/report/*.rst) is clean reStructuredText. Rendered as `snakemake
--report` renders it (Jinja, then docutils' HTML writer), it raises no docutils system message: a `|paid steps|` in a
caption, for example, is a substitution reference that is defined nowhere, and the report prints an ERROR for it
and shows a "Docutils System Messages" box under the figure."""

import io
from pathlib import Path
from types import SimpleNamespace

import docutils.core
import jinja2
import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = sorted((ROOT / "workflow" / "report").glob("*.rst"))


def rst_problems(text: str) -> list[str]:
    """docutils' messages at WARNING (level 2) and above on `text`, and any system message in its HTML."""
    stream = io.StringIO()
    overrides = {"report_level": 2, "halt_level": 5, "warning_stream": stream}
    body = docutils.core.publish_parts(text, writer="html", settings_overrides=overrides)["body"]
    problems = stream.getvalue().splitlines()
    if "system-message" in body and not problems:
        problems.append("the HTML holds a docutils system message")
    return problems


class _AnyConfig(dict):
    def __missing__(self, key):
        return f"<{key}>"


def render_caption(path: Path, config: dict | None = None) -> str:
    """The caption as the report's Jinja environment renders it (a placeholder for every config value, or
    `config`)."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(path.read_text()).render(snakemake=SimpleNamespace(config=config or _AnyConfig()))


@pytest.mark.parametrize("path", CAPTIONS, ids=[p.name for p in CAPTIONS])
def test_caption_renders_without_a_docutils_message(path):
    """The report's front page reads the settings of the run's config: it renders with every preset's."""
    if path.name != "workflow.rst":
        assert rst_problems(render_caption(path)) == []
        return
    import yaml

    from behaviortrace.config.load import complete

    for preset in sorted((path.parents[2] / "config").glob("*.yaml")):
        text = render_caption(path, complete(yaml.safe_load(preset.read_text())))
        assert rst_problems(text) == [], preset.name
        assert "T (exact influence): step" in text and "- optimizer: AdamW" in text


@pytest.mark.parametrize(
    "text, message",
    [
        # The lift caption before issue 30 (which named the paid steps with two pipes): an ERROR/3 of the report.
        (
            "Lift (precision at |paid steps| divided by chance) at step level.",
            'Undefined substitution referenced: "paid steps"',
        ),
        ("the number of *paid rollouts.", "Inline emphasis start-string without end-string"),
        ("the key ``checklist of the config.", "Inline literal start-string without end-string"),
        ("see `the table`_ below.", 'Unknown target name: "the table"'),
    ],
)
def test_the_check_finds_what_the_report_would_print(text, message):
    problems = rst_problems(text)
    assert any(message in p for p in problems), problems
