"""Section 15 of RESULTS.md: the memory tier, a checkpoint every step in host memory
(bench/memory_checkpoint.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _met, _r, _s


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}"


def _mb_of(x: float | None) -> str:
    return "–" if x is None else f"{x:,.1f} MB"


def _above(value: float | None, target: float) -> bool:
    return value is not None and value > target


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add(
        "## 15. The memory tier: a checkpoint every step in host memory "
        "(bench/memory_checkpoint.py)",
        "",
    )
    if rep.section_failed("memory_checkpoint", res):
        return
    rep.add(
        f"`python bench/run_all.py{' --full' * (res.get('mode') == 'full')} --only "
        f"memory_checkpoint --merge` (bench/memory_checkpoint.py): the {res['size']} GPT with "
        f"AdamW, batch {res['batch']}, each figure against its baseline measured in the same "
        "run. A snapshot is the training state copied into host memory (`/dev/shm`) and, on "
        "2 ranks, replicated to the other rank; an added step time is the median over "
        "alternating blocks (ABBA) of (step with snapshots / step without) - 1.",
        "",
    )
    _one_process(rep, res["one_process"])
    _two_ranks(rep, res["two_ranks"])
    _async_save(rep, res["async_save"])
    _recovery(rep, res["recovery"])


def _one_process(rep: Report, one: dict[str, Any]) -> None:
    target = one["target"]
    rep.add(
        "**Added step time, one process** (one intra-op thread: the other core is free for "
        "the snapshot's copy, write and bookkeeping): steps with a snapshot after every step "
        "against the same steps without, on one prepared strategy; *blocked* is the time a "
        "snapshot held the training loop, per snapshot.",
        "",
    )
    iqr = one.get("added_iqr")
    rep.table(
        [
            "state",
            "step",
            "step, snapshot every step",
            "added",
            "rounds (their IQR)",
            "blocked",
            "target",
            "met",
        ],
        [
            [
                f"{one['state_mb']:,.1f} MB",
                _s(one["step_s"]),
                _s(one["snapshot_step_s"]),
                f"**{_pct(one['added'])}**",
                f"{one.get('rounds', '–')}"
                + (f" ({_pct(iqr[0])} – {_pct(iqr[1])})" if iqr else ""),
                _s(one["blocked_s"]),
                f"≤ {target:.1%}",
                _met(one["added"], target),
            ]
        ],
    )
    if _above(one["added"], target):
        rep.misses.append(
            f"memory tier, one process: a snapshot every step adds {_pct(one['added'])} to the "
            f"step ({_s(one['step_s'])} -> {_s(one['snapshot_step_s'])}; target "
            f"{target:.1%}; the loop is blocked {_s(one['blocked_s'])} per snapshot of "
            f"{one['state_mb']:,.1f} MB"
            + (
                f"; the rest comes with the background write ({_s(one['write_s'])} a "
                "snapshot): its Python (the plan's and the snapshot's bookkeeping, the "
                "metadata's pickle) holds the interpreter lock the training thread's "
                "forward needs, while a background thread that only copies the same bytes "
                "adds nothing measurable here (+0.1 %, 2026-12-07)"
                if one.get("write_s") is not None
                else ""
            )
            + "; section 15)"
        )


def _two_ranks(rep: Report, two: dict[str, Any]) -> None:
    targets = two["targets"]
    rep.add(
        "**Added step time, 2 ranks** (one thread each: both cores train, none is free): FSDP "
        "over gloo, each rank its own failure domain (the snapshot replicated to the other "
        "rank), a snapshot every step and every 10 steps against none; the floor is a plain "
        "copy of the same bytes (each rank's state into preallocated buffers, timed on the "
        "same ranks between the blocks). Times are the slowest rank's.",
        "",
    )
    rep.table(
        ["figure", "value", "baseline", "ratio", "target", "met"],
        [
            [
                "snapshot every step: added time against a plain copy",
                f"{_s(two['added_every1_s'])} ({_pct(two['added_every1'])}; step "
                f"{_s(two['step_s'])} -> {_s(two['every1_step_s'])})",
                f"copy of {two['state_mb_per_rank']:,.1f} MB per rank: {_s(two['copy_s'])}",
                f"**{_r(two['over_copy'])}**",
                f"≤ {targets['over_copy']}",
                _met(two["over_copy"], targets["over_copy"]),
            ],
            [
                "snapshot every 10 steps: added step time",
                f"step {_s(two['every10_step_s'])}",
                f"step {_s(two['step_s'])}",
                f"**{_pct(two['added_every10'])}**",
                f"≤ {targets['every10']:.1%}",
                _met(two["added_every10"], targets["every10"]),
            ],
        ],
    )
    if _above(two["over_copy"], targets["over_copy"]):
        rep.misses.append(
            f"memory tier, 2 ranks: a snapshot every step adds {_s(two['added_every1_s'])} per "
            f"step, {_r(two['over_copy'])}x a plain copy of the rank's "
            f"{two['state_mb_per_rank']:,.1f} MB ({_s(two['copy_s'])}; target "
            f"{targets['over_copy']}x"
            + (
                f"; measured: the write into memory takes {_s(two['write_s'])} and the "
                f"exchange with the peer (its snapshot out, the peer's in, over gloo's TCP) "
                f"{_s(two['replicate_s'])} a snapshot, on the cores that train: a write, a "
                "send and a receive of the bytes against the floor's one copy"
                if two.get("replicate_s") is not None
                else ""
            )
            + (
                f"; the exchange alone, with nothing else running, takes "
                f"{_s(two['exchange_s'])}: a copy and the transfer of the bytes are "
                f"{_r((two['copy_s'] + two['exchange_s']) / two['copy_s'])}x the copy"
                if two.get("exchange_s") is not None
                else ""
            )
            + "; section 15)"
        )
    if _above(two["added_every10"], targets["every10"]):
        rep.misses.append(
            f"memory tier, 2 ranks: a snapshot every 10 steps adds {_pct(two['added_every10'])} "
            f"to the step ({_s(two['step_s'])} -> {_s(two['every10_step_s'])}; target "
            f"{targets['every10']:.1%}; section 15)"
        )


def _async_save(rep: Report, a: dict[str, Any]) -> None:
    target = a["target"]
    rep.add(
        "**An asynchronous storage save's added loop time, one process**: a 12-step loop with "
        "a sharded save to the local disk after steps 4 and 8 (not after the last, where the "
        "loop's end would wait for the whole write) against the same loop without saves, and "
        "with synchronous saves, each loop ending when its last save is committed; an added "
        "time is the median over rounds of (the loop - the same round's loop without saves), "
        "and the ratio is (async added) / (sync added).",
        "",
    )
    rep.table(
        [
            "loop, no saves",
            "async saves (added)",
            "sync saves (added)",
            "async added / sync added",
            "target",
            "met",
        ],
        [
            [
                _s(a["loop_none_s"]),
                f"{_s(a['loop_async_s'])} ({_pct(a['added_async'])})",
                f"{_s(a['loop_sync_s'])} ({_pct(a['added_sync'])})",
                f"**{_r(a['ratio'])}**",
                f"≤ {target}",
                _met(a["ratio"], target),
            ]
        ],
    )
    if _above(a["ratio"], target):
        rep.misses.append(
            f"memory tier: an async save adds {_r(a['ratio'])}x a sync save's loop time "
            f"({_pct(a['added_async'])} against {_pct(a['added_sync'])} of "
            f"{_s(a['loop_none_s'])}; target {target}; section 15)"
        )


def _recovery(rep: Report, rec: dict[str, Any]) -> None:
    rep.add(
        "**Recovery after a node loss** (2 ranks, one a node; node 1's memory removed): a "
        "restarted run's seconds from its start to the end of its first step, resuming from "
        "memory (the snapshot gathered from rank 0's own memory and the replica it holds for "
        "rank 1), from the disk (the sharded checkpoint of the same step), and from `s3://` "
        "(moto's server in this process); *build* is building the model and the strategy, "
        "*resume* loading the state. Times are the slowest rank's.",
        "",
    )
    rows = []
    for tier in ("memory", "disk", "s3"):
        r = rec.get(tier)
        if not isinstance(r, dict):  # "s3": why it did not run
            rows.append([tier, str(r or "not run"), "–", "–", "–", "–"])
            continue
        if tier == "memory":
            read = f"{_mb_of(r.get('local_mb'))} local, {_mb_of(r.get('fetched_mb'))} fetched"
        else:
            read = f"{_mb_of(rec.get('checkpoint_mb'))} checkpoint"
        rows.append(
            [
                tier,
                r["resumed_from"],
                f"**{_s(r['to_first_step_s'])}**",
                _s(r["build_s"]),
                _s(r["resume_s"]),
                read,
            ]
        )
    rep.table(["tier", "resumed from", "to the first step", "build", "resume", "read"], rows)
    memory = rec.get("memory")
    if isinstance(memory, dict) and memory["resumed_from"] != "memory":
        rep.problems.append(
            f"memory_checkpoint: the restart after a node loss resumed from "
            f"{memory['resumed_from']}, not from memory (section 15)"
        )
