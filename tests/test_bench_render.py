"""bench/RESULTS.md is rendered from the benches' JSON alone: every section's renderer
(``bench/render/<section>.py``) renders the figures stored in bench/results.json, a figure
above its target is listed among the misses, and rendering needs no torch."""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.distributed import REPO

BENCH = REPO / "bench"
STORED = json.loads((BENCH / "results.json").read_text())


@pytest.fixture
def run_all(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("run_all")


def memory_checkpoint_result() -> dict[str, Any]:
    """What bench/memory_checkpoint.py's run() returns, every figure within its target."""
    return {
        "status": "ok",
        "section": "memory_checkpoint",
        "mode": "full",
        "wall_s": 612.0,
        "size": "25M",
        "batch": 8,
        "one_process": dict(
            added=0.021,
            step_s=0.41,
            snapshot_step_s=0.419,
            state_mb=305.2,
            blocked_s=0.004,
            target=0.035,
        ),
        "two_ranks": dict(
            step_s=0.52,
            every1_step_s=0.61,
            every10_step_s=0.53,
            added_every1=0.17,
            added_every10=0.019,
            added_every1_s=0.088,
            copy_s=0.08,
            over_copy=1.1,
            state_mb_per_rank=152.6,
            targets=dict(over_copy=1.2, every10=0.035),
        ),
        "async_save": dict(
            loop_none_s=5.0,
            loop_async_s=5.1,
            loop_sync_s=7.0,
            added_async=0.02,
            added_sync=0.4,
            ratio=0.05,
            target=0.1,
        ),
        "recovery": {
            "s3": {
                "to_first_step_s": 6.1,
                "build_s": 2.0,
                "resume_s": 3.5,
                "resumed_from": "s3",
            },
            "checkpoint_mb": 305.4,
            "memory": {
                "to_first_step_s": 3.1,
                "build_s": 2.0,
                "resume_s": 0.6,
                "resumed_from": "memory",
                "local_mb": 305.2,
                "fetched_mb": 152.6,
            },
            "disk": {
                "to_first_step_s": 4.0,
                "build_s": 2.0,
                "resume_s": 1.4,
                "resumed_from": "disk",
            },
        },
    }


def render_memory_checkpoint(res: dict[str, Any]):
    from _report import Report
    from render import memory_checkpoint

    rep = Report({"memory_checkpoint": res})
    memory_checkpoint.write(rep, res)
    return rep, "\n".join(rep.lines)


def test_every_section_that_runs_has_a_renderer(run_all: ModuleType) -> None:
    from render import WRITERS

    assert set(run_all.SECTIONS) <= set(WRITERS)
    assert set(run_all.FULL_ONLY) <= set(run_all.SECTIONS)
    assert "memory_checkpoint" in run_all.FULL_ONLY  # ~10 minutes of both cores


@pytest.mark.parametrize("name", sorted(STORED["sections"]))
def test_each_stored_section_renders(run_all: ModuleType, name: str) -> None:
    from _report import Report
    from render import WRITERS

    rep = Report(STORED["sections"])
    WRITERS[name](rep, STORED["sections"][name])
    assert rep.lines[0].startswith(("## ", "**"))


def test_the_whole_report_renders_from_the_stored_results(run_all: ModuleType) -> None:
    text = run_all.render(STORED, STORED["mode"] == "quick", STORED["wall_s"])
    assert text.startswith("# shardwise benchmarks")
    assert "could not render" not in text and "rendering failed" not in text


def test_memory_checkpoint_renders_every_figure_group_with_its_target(run_all: ModuleType) -> None:
    rep, text = render_memory_checkpoint(memory_checkpoint_result())
    assert text.startswith(
        "## 15. The memory tier: a checkpoint every step in host memory "
        "(bench/memory_checkpoint.py)"
    )
    assert "--full --only memory_checkpoint --merge" in text
    for group in ("one process", "2 ranks", "asynchronous storage save", "node loss"):
        assert group in text
    for figure in ("+2.1%", "**1.100**", "+1.9%", "**0.050**", "≤ 3.5%", "≤ 1.2", "≤ 0.1"):
        assert figure in text
    assert "305.2 MB local, 152.6 MB fetched" in text and "305.4 MB checkpoint" in text
    assert "**no**" not in text and rep.misses == [] and rep.problems == []


@pytest.mark.parametrize(
    "group, key, value, reported",
    [
        ("one_process", "added", 0.05, "memory tier, one process: a snapshot every step adds"),
        ("two_ranks", "over_copy", 1.5, "1.500x a plain copy"),
        ("two_ranks", "added_every10", 0.04, "a snapshot every 10 steps adds +4.0%"),
        ("async_save", "ratio", 0.3, "an async save adds 0.300x a sync save's loop time"),
    ],
)
def test_memory_checkpoint_figure_above_its_target_is_a_miss(
    run_all: ModuleType, group: str, key: str, value: float, reported: str
) -> None:
    res = memory_checkpoint_result()
    res[group][key] = value
    rep, text = render_memory_checkpoint(res)
    assert "**no**" in text
    assert len(rep.misses) == 1 and reported in rep.misses[0], rep.misses


def test_memory_checkpoint_without_s3_or_a_memory_resume(run_all: ModuleType) -> None:
    res = memory_checkpoint_result()
    res["recovery"]["s3"] = "moto[server] is not installed"
    res["recovery"]["memory"]["resumed_from"] = "storage"
    rep, text = render_memory_checkpoint(res)
    assert "| s3 | moto[server] is not installed |" in text
    assert rep.problems == [
        "memory_checkpoint: the restart after a node loss resumed from storage, not from "
        "memory (section 15)"
    ]


def test_a_failed_memory_checkpoint_run_is_reported(run_all: ModuleType) -> None:
    res = {"status": "error", "error": "Traceback ...\nRuntimeError: boom"}
    rep, text = render_memory_checkpoint(res)
    assert "RuntimeError: boom" in text and rep.problems == ["memory_checkpoint: error"]


def test_the_report_is_placed_after_section_14(run_all: ModuleType) -> None:
    results = copy.deepcopy(STORED)
    results["sections"]["memory_checkpoint"] = memory_checkpoint_result()
    text = run_all.render(results, False, 1.0)
    assert "## 15. The memory tier" in text and "could not render" not in text
    if "## 14." in text:
        assert text.index("## 14.") < text.index("## 15.")


def test_rendering_imports_no_torch() -> None:
    code = (
        "import json, sys; sys.path.insert(0, 'bench'); import run_all; "
        "r = json.load(open('bench/results.json')); run_all.render(r, True, 1.0); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
