"""Section 5 of RESULTS.md: meta-device initialisation (bench/meta_init.py's table)."""

from __future__ import annotations

from typing import Any

from _report import Report


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 5. Meta-device initialisation (bench/meta_init.py)", "")
    if rep.section_failed("meta_init", res):
        return
    if res.get("args"):
        rep.add(
            f"Run as `python bench/meta_init.py {' '.join(res['args'])}`: quick mode leaves out "
            "its FSDP contender (minutes on this machine); `--full` runs it.",
            "",
        )
    rep.add(res["text"], "")
