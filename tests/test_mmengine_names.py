"""mmengine's public names: every name in mmengine 0.10.7's ``__all__`` of a module shardwise
mirrors is in the counterpart module, or in the README's table of deliberate absences with the
reason ("mmengine's public names that shardwise does not have"), and the table names nothing
that shardwise has."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.distributed import REPO

pytest.importorskip("mmengine", reason="mmengine's __all__ is what is compared with")

#: mmengine's module -> the shardwise module that mirrors it.
COUNTERPARTS = {
    "mmengine.dist": "shardwise.dist",
    "mmengine.registry": "shardwise.registry",
    "mmengine.config": "shardwise.config",
    "mmengine.optim": "shardwise.optim",
    "mmengine.hooks": "shardwise.runner.hooks",
    "mmengine.runner": "shardwise.runner",
    "mmengine.logging": "shardwise.logging",
    "mmengine.visualization": "shardwise.visualization",
    "mmengine._strategy": "shardwise.strategies",
}

SECTION = "### mmengine's public names that shardwise does not have"


def documented_absences() -> dict[str, str]:
    """``{'mmengine.module.name': reason}`` from the README's table."""
    text = (REPO / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `(mmengine[\w.]*)\.(\w+)` \| (.+?) \|$", section, flags=re.M)
    return {f"{module}.{name}": reason for module, name, reason in rows}


def missing_names() -> set[str]:
    missing = set()
    for mmengine_module, shardwise_module in COUNTERPARTS.items():
        ours = importlib.import_module(shardwise_module)
        for name in importlib.import_module(mmengine_module).__all__:
            if not hasattr(ours, name):
                missing.add(f"{mmengine_module}.{name}")
    return missing


def test_every_mmengine_public_name_is_here_or_a_documented_absence():
    absences = documented_absences()
    undocumented = sorted(missing_names() - set(absences))
    assert not undocumented, (
        "mmengine names shardwise has neither in the counterpart module nor in the README's "
        f"table '{SECTION}': {undocumented}"
    )


def test_the_table_of_absences_names_only_what_is_absent_and_says_why():
    absences = documented_absences()
    assert len(absences) > 30  # the table was read
    present = sorted(set(absences) - missing_names())
    assert not present, f"in the README's table but shardwise has them now: {present}"
    assert all(len(reason.split()) >= 2 for reason in absences.values())
    assert set(absences) <= {
        f"{module}.{name}" for module in COUNTERPARTS for name in _all(module)
    }, "rows that name no public mmengine name"


def _all(module: str) -> list[str]:
    return importlib.import_module(module).__all__
