"""The design notes are in the repository, and every reference to them in the code resolves to a section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_design_reference_in_the_code_names_a_section_of_docs_design_md():
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "design.md").read_text(), re.MULTILINE))
    code = [
        p
        for d in ("components", "pipelines", "tests", "benchmarks", "scripts")
        for p in (ROOT / d).rglob("*")
        if p.suffix in (".py", ".sh")
    ]
    references = [(p.name, n) for p in code for n in re.findall(r"design\.md section (\d+)", p.read_text())]
    assert references  # the code does point there
    assert [r for r in references if r[1] not in sections] == []
    outside = "DESIGN" + ".md"  # the environment's notes, not in the repository
    assert not [p.name for p in code if outside in p.read_text()]


def test_the_docs_options_and_their_defaults_are_the_settings_types():
    """The docs keep no option tables (`tritonship <step> --help` lists every option, made from the settings
    types); where they name a step's option with its default, as "`--canary-round-s` (60)", both are the type's."""
    from components.release.step_settings import COMMANDS

    options = {o.flag: o for kind in COMMANDS.values() for o in kind.options().values() if o.cli}
    named = [
        (path.name, flag, said)
        for path in (ROOT / "README.md", ROOT / "docs" / "guide.md")
        for flag, said in re.findall(r"`(--[a-z0-9-]+)` \((\d[\d.]*)\)", path.read_text())
    ]
    assert named  # the guide does name some
    assert [(f, flag, said) for f, flag, said in named if flag not in options] == []
    assert [(f, flag, said) for f, flag, said in named if float(said) != options[flag].default] == []
