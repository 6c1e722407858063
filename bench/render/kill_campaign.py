"""Section 7 of RESULTS.md: the kill -9 campaign's crash safety of saves
(bench/kill_campaign.py, rendered from bench/kill_campaign.json)."""

from __future__ import annotations

from typing import Any

from _report import Report


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 7. kill -9 campaign: crash safety of saves (bench/kill_campaign.py)", "")
    if rep.section_failed("kill_campaign", res):
        return
    s, m = res["summary"], res["machine"]
    rep.add(
        f"Taken by `python bench/kill_campaign.py` on {m['date']} ({m['cpu']}, {m['cores']} "
        f"cores, torch {m['torch']}), {res['wall_s']:.0f} s; not re-run by `make bench`. Each "
        f"trial starts a real `shardwise train` (FSDPStrategy, a checkpoint after every one of "
        f"{res['max_iters']} iterations, max_keep_ckpts=3, 14 MB of state), waits for its "
        "first commit and a random delay (uniform in [0, 1.5) s), SIGKILLs every process of the "
        "run by pid (torchrun's workers live in sessions of their own), verifies every "
        "committed checkpoint against its manifest, then runs `shardwise train --resume` and "
        "checks that it continues from the iteration of the checkpoint it picked and ends "
        "with a final checkpoint that verifies. *Corrupt*: any of that fails; *hang*: a "
        "process survives the kill or the resume does not end within 240 s. *Mid-save*: the "
        "kill left a save's staging path behind.",
        "",
    )
    rows = [
        [kind, str(r["trials"]), str(r["ok"]), str(r["corrupt"]), str(r["hang"]), str(r["mid"])]
        for kind, r in sorted(s["by_kind"].items())
    ]
    rows.append(
        [
            "**all**",
            str(s["trials"]),
            str(s["ok"]),
            f"**{s['corrupt']}**",
            f"**{s['hang']}**",
            str(s["mid_save"]),
        ]
    )
    rep.table(["trials", "n", "ok", "corrupt", "hang", "mid-save"], rows)
    if s["corrupt"] or s["hang"]:
        rep.misses.append(
            f"kill campaign: {s['corrupt']} corrupt resumes and {s['hang']} hangs in "
            f"{s['trials']} trials (target 0 and 0); see bench/kill_campaign.json"
        )
    if "async" in res:
        _write_async_kills(rep, res["async"])


def _write_async_kills(rep: Report, res: dict[str, Any]) -> None:
    s, m = res["summary"], res["machine"]
    rep.add(
        "",
        f"**Asynchronous sharded saves** (`python bench/kill_campaign.py --async-trials "
        f"{s['trials']}`, {m['date']}, {res['wall_s']:.0f} s, load {m['loadavg_at_start'][0]} "
        "at start): a loop on 2 gloo ranks saves after every step with "
        "`save_checkpoint(async_save=True, max_keep_ckpts=3)` and reports each return; both "
        "ranks are SIGKILLed within 50 ms after the 2nd-5th reported save. The checkpoint a "
        "resume picks must verify, load whole, and be at most one save behind the last one "
        "reported (tests/async_kill.py).",
        "",
    )
    rep.table(
        ["trials", "ok", "more than one behind", "corrupt", "no save reported", "behind by"],
        [
            [
                str(s["trials"]),
                str(s["ok"]),
                f"**{s['behind']}**",
                f"**{s['corrupt']}**",
                str(s["none"]),
                ", ".join(map(str, s["behind_by"])),
            ]
        ],
    )
    if s["behind"] or s["corrupt"] or s["none"]:
        rep.misses.append(
            f"async kill campaign: {s['behind']} resumes more than one save behind, "
            f"{s['corrupt']} corrupt, {s['none']} without a reported save in {s['trials']} "
            "trials (target 0); see bench/kill_campaign.json"
        )
