"""Section 9 of RESULTS.md: start-up of the shardwise command (bench/cli_startup.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _met, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 9. Start-up of the shardwise command (bench/cli_startup.py)", "")
    if rep.section_failed("cli_startup", res):
        return
    rep.add(
        f"Each command is a fresh process, timed from spawn to exit, best of "
        f"{res['runs_per_command']} runs (contenders interleaved, ABBA), next to "
        "`python -c 'import torch'` in the same run; the checkpoints are a small full `.pth` "
        "(with its manifest) and the same converted to sharded. *Imports* come from "
        "`python -X importtime` of the same command: whether it imported torch, and which of "
        "transformers, mmengine, Ray, TensorBoard, the runner and the strategies (none needed).",
        "",
    )
    rows = []
    for row in res["rows"]:
        target = row.get("target_s")
        rows.append(
            [
                f"`{row['command']}`",
                _s(row["best_s"]),
                _s(row["median_s"]),
                _r(row["vs_import_torch"]),
                "yes" if row["imports_torch"] else "no",
                ", ".join(row["heavy_imports"]) or "none",
                str(row["modules"]),
                "–" if target is None else f"{_s(target)}: {_met(row['best_s'], target)}",
            ]
        )
        if target is not None and row["best_s"] > target:
            rep.misses.append(_startup_miss(row, res["rows"], target))
    rep.table(
        [
            "command",
            "best",
            "median",
            "× import torch",
            "imports torch",
            "heavy imports",
            "modules",
            "target",
        ],
        rows,
    )


def _startup_miss(row: dict[str, Any], rows: list[dict[str, Any]], target: float) -> str:
    """Why a command misses its start-up target, from what it imported."""
    torch = next(r for r in rows if "import torch" in r["command"])
    head = f"`{row['command']}` starts in {_s(row['best_s'])} (target {_s(target)}): "
    if not row["imports_torch"]:
        return head + f"without torch ({row['modules']} modules)"
    need = (
        "it reports torch's version, build and devices"
        if row["command"].endswith(" env")
        else "it reads the checkpoint with torch"
    )
    extra = row["modules"] - torch["modules"]
    why = (
        "which reading a sharded checkpoint needs"
        if "sharded" in row["command"]
        else "through checkpoint.formats, sharded.py and local.py, which a full .pth does not "
        "need; making those imports lazy waits for the checkpoint package's restructuring"
    )
    more = (
        f"; it imports {extra} modules beyond torch's {torch['modules']} "
        f"(torch.distributed.checkpoint and DTensor, {why})"
        if extra > 100
        else ""
    )
    return head + f"{need}, and `import torch` alone takes {_s(torch['best_s'])} here{more}"
