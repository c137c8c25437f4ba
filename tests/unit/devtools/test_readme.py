"""README: a new user can follow it from the quickstart on."""

from __future__ import annotations

import re

from tests.support.paths import REPO

ROOT = REPO


def text_before_first_command(readme: str, command: str) -> str:
    """The README text from the heading above the first code block that runs ``command``
    (a line starting with it) up to that block."""
    for block in re.finditer(r"^```[^\n]*\n(.*?)^```", readme, flags=re.M | re.S):
        if any(line.startswith(command + " ") for line in block.group(1).splitlines()):
            before = readme[: block.start()]
            return before[before.rfind("\n#") :]
    raise AssertionError(f"README never runs {command}")


def test_readme_says_where_dra_driver_is_before_using_it() -> None:
    """After ``make demo``/``make test`` the command is in .venv/bin, not on PATH."""
    note = text_before_first_command((ROOT / "README.md").read_text(), "dra-driver")
    assert "`.venv/bin/dra-driver`" in note
    assert "`pip install .`" in note
