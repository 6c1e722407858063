"""The report writer every section of ``bench/RESULTS.md`` shares: :class:`Report` (the
lines, the figures that miss their target, the sections that failed) and the formatting
helpers (``_s`` seconds, ``_r`` a ratio, ``_mb`` megabytes, ``_met`` a target met or not).

Each section's renderer is ``bench/render/<section>.py``; ``bench/run_all.py`` puts them
together. Nothing here imports torch: rendering reads JSON only.
"""

from __future__ import annotations

from typing import Any

#: The step-time and checkpoint-I/O targets against the raw baseline (sections 2 and 3).
STEP_TARGET = 1.02
IO_TARGET = 1.10
#: Issue 20's target for the full format's loads (load_checkpoint, resume) against torch.
FULL_LOAD_TARGET = 1.05


def _s(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:.0f} s"
    if x >= 1:
        return f"{x:.2f} s"
    return f"{x * 1000:.1f} ms"


def _r(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _mb(x: float | None) -> str:
    return "–" if x is None else f"{x / 1e6:,.1f} MB"


def _met(value: float | None, target: float) -> str:
    if value is None:
        return "–"
    return "yes" if value <= target else "**no**"


def _bytes(x: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:.0f} B"


class Report:
    def __init__(self, sections: dict[str, Any] | None = None) -> None:
        self.lines: list[str] = []
        self.misses: list[str] = []
        self.problems: list[str] = []
        self.sections = sections or {}  # every section's results, for cross-references

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(header) + " |", "|" + "---|" * len(header))
        for row in rows:
            self.add("| " + " | ".join(row) + " |")
        self.add("")

    def section_failed(self, title: str, result: dict[str, Any]) -> bool:
        status = result.get("status")
        if status == "ok":
            return False
        detail = result.get("error") or result.get("reason") or ""
        self.add(f"**{status}**:", "", "```", str(detail).strip()[-3000:], "```", "")
        self.problems.append(f"{title}: {status}")
        return True


def _breakdown(profiles: dict[str, Any], label: str) -> str:
    """The measured reason for a slow checkpoint operation: where cProfile puts the time of
    one shardwise call against one call of its raw baseline, category by category."""
    mine, theirs = profiles.get(label), profiles.get(f"raw {label}")
    if not mine:
        return "no profile"
    if not theirs:
        parts = [f"{k} {v:.3f} s" for k, v in mine["breakdown_s"].items()]
        top = [f"{f['frame']} {f['s']:.3f} s" for f in mine.get("self", [])[:3]]
        return (
            f"cProfile of one call ({mine['profiled_s']:.3f} s): "
            + ", ".join(parts)
            + ("; most self time: " + ", ".join(top) if top else "")
        )
    cats = set(mine["breakdown_s"]) | set(theirs["breakdown_s"])
    diff = {c: mine["breakdown_s"].get(c, 0.0) - theirs["breakdown_s"].get(c, 0.0) for c in cats}
    ranked = sorted(diff.items(), key=lambda kv: -abs(kv[1]))
    parts = [
        f"{c} {mine['breakdown_s'].get(c, 0.0):.3f} vs {theirs['breakdown_s'].get(c, 0.0):.3f} s"
        for c, d in ranked
        if abs(d) >= 0.01
    ][:5]
    own = mine.get("shardwise_cumulative", [])[:4]
    return (
        f"cProfile of one call each, shardwise {mine['profiled_s']:.3f} s against the raw "
        f"baseline {theirs['profiled_s']:.3f} s; by category (shardwise vs raw): "
        + ("; ".join(parts) or "no category differs by 10 ms")
        + (
            "; inside shardwise (cumulative): "
            + ", ".join(f"{f['frame']} {f['s'] * 1e3:.1f} ms" for f in own)
            if own
            else ""
        )
    )
