"""The README names only what a fresh clone holds: every repository path it gives exists, and
none leads out of the repository (material beside it, such as a corpus, is not shipped)."""

from __future__ import annotations

import re

from tests.distributed import REPO

DOCS = ["README.md", "docs/architecture.md", "examples/README.md"]
# a path as the README writes it: inside backticks, starting at one of the repository's folders
REPO_PATH = re.compile(r"(?<![\w/.])((?:\.\./|\.ci/|src/|tests/|examples/|bench/|docs/)[\w./*-]*)")


def _named_paths(doc: str) -> list[str]:
    text = (REPO / doc).read_text(encoding="utf-8")
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.S | re.M)
    spans = blocks + re.findall(r"`([^`]+)`", prose)
    return sorted({m.rstrip(".") for span in spans for m in REPO_PATH.findall(span)})


def test_no_document_points_outside_the_repository():
    outside = {doc: [p for p in _named_paths(doc) if p.startswith("../")] for doc in DOCS}
    assert outside == {doc: [] for doc in DOCS}


def test_every_repository_path_the_readme_names_exists():
    named = _named_paths("README.md")
    assert "examples/quickstart.py" in named and "tests/test_quickstart.py" in named
    missing = [p for p in named if not any(REPO.glob(p.rstrip("/")))]
    assert missing == []
