"""Section 4 of RESULTS.md: model size × world size (bench/scale.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _report import Report, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 4. Scale: model size × world size", "")
    if rep.section_failed("scale", res):
        return
    rep.add(
        f"Batch {res['batch']}×64 tokens per rank, AdamW, one thread per rank (4 ranks share "
        "this machine's cores, so world size 4 is oversubscribed); 1B rows: batch 1×64 and "
        "plain SGD, their checkpoints hold the weights alone (AdamW's moments would take the "
        "state past this machine's memory). Step: median of the timed "
        "steps (3 at 10M, 2 at 100M on ≤ 2 ranks, else 1; after one warm-up), raw loop "
        "interleaved: an indication only; section 1 is the precise overhead figure. Save: "
        "best of the repeats, against "
        "`os.write`+`fsync` of the same bytes (each FSDP rank its share, at once). Load: "
        "`resume` (weights, optimizer, RNG) after evicting the page cache, against reading "
        "the files (full checkpoints: every rank reads the whole file, as every rank loads "
        "it). FSDP builds the model on the meta device and initialises it shard by shard.",
        "",
    )
    rows = []
    for r in res["rows"]:
        head = [r["size"], f"{r['params'] / 1e6:,.1f}M", r["strategy"], str(r["world_size"])]
        if r.get("status") != "ok":
            reason = r.get("reason") or r.get("error") or ""
            rows.append(
                head + [f"{r.get('status')}: {str(reason).splitlines()[0][:120]}"] + [""] * 5
            )
            if r.get("status") == "error":
                rep.problems.append(
                    f"scale {r['size']} {r['strategy']} x{r['world_size']}: {reason}"
                )
            continue
        rows.append(
            head
            + [
                f"{_s(r['step_s'])} / {_s(r['raw_step_s'])} = {_r(r['step_ratio'])}"
                if r["raw_step_s"]
                else f"{_s(r['step_s'])} ({r.get('raw_note') or 'raw copy does not fit in RAM'})",
                f"{_s(r['save_s'])} / {_s(r['floor_write_s'])} = {_r(r['save_ratio'])}",
                f"{_s(r['load_s'])} / {_s(r['floor_read_s'])} = {_r(r['load_ratio'])}",
                f"{r['ckpt_gb']:.2f} GB",
                f"{max(r['peak_rss_gb_per_rank']):.2f} GB",
                _s(r["prepare_s"]),
            ]
        )
    rep.table(
        [
            "size",
            "params",
            "strategy",
            "ranks",
            "step: shardwise / raw = ratio",
            "save / disk write = ratio",
            "resume / disk read = ratio",
            "checkpoint",
            "peak RSS / rank",
            "prepare",
        ],
        rows,
    )
    for note in res.get("notes", []):
        rep.add(note, "")
    _scale_targets(rep, res)
    if res.get("chart"):
        rep.add(f"![scale]({Path(res['chart']).name})", "")


def _scale_targets(rep: Report, res: dict[str, Any]) -> None:
    """Targets on single rows (``res['targets']``: size, strategy, world_size, figure
    ``'save_ratio'`` or ``'load_ratio'``, target, the measured reason should it miss)."""
    lines = []
    for t in res.get("targets", []):
        row = next(
            (
                r
                for r in res["rows"]
                if (r["size"], r["strategy"], r["world_size"])
                == (t["size"], t["strategy"], t["world_size"])
                and r.get("status") == "ok"
            ),
            None,
        )
        what = "resume / disk read" if t["figure"] == "load_ratio" else "save / disk write"
        name = f"{t['size']} {t['strategy']} x{t['world_size']}, {what}"
        if row is None:
            lines.append(f"{name} ≤ {t['target']}: not measured")
            continue
        met = row[t["figure"]] <= t["target"]
        lines.append(
            f"{name} ≤ {t['target']}: {_r(row[t['figure']])} ({'met' if met else '**no**'})"
        )
        if not met:
            reason = t.get("reason", "")
            rep.misses.append(
                f"Scale, {name}: {_r(row[t['figure']])} > {t['target']}. {reason}".rstrip()
            )
    if lines:
        rep.add("Targets (issue 20): " + "; ".join(lines) + ".", "")
