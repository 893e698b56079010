"""The README: short (issue 55: at most 250 lines, the rest in docs/), its links lead to files that exist, and the
install and test commands it gives are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 250


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "the README links to its docs"
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_ci_installs_and_tests_the_way_the_readme_says():
    readme, ci = README.read_text(encoding="utf-8"), (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in ('python -m pip install -e ".[test]"', "python -m pytest -q -n 2 tests",
                    "python -m icml_jax.models.fetch smollm2-135m-instruct gemma3-270m"):
        assert command in ci, command
        assert " ".join(command.split()) in " ".join(readme.split()), command
