"""Section 11 of RESULTS.md: pipeline parallelism against torch's raw schedule
(bench/pipeline.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _met, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 11. Pipeline parallelism: pp=2 against torch's raw schedule, and the bubble", "")
    if rep.section_failed("pipeline", res):
        return
    rep.add(
        f"Model: CharGPT from {res['model_source']}, {res['model_params'] / 1e6:.2f}M parameters "
        f"(4 blocks, d=128), batch {res['batch']} in {res['n_microbatches']} microbatches, "
        f"pp={res['pp']} on 2 gloo ranks, one intra-op thread each, AdamW. shardwise: "
        "`FSDPStrategy(parallelism=dict(pp=2), pipeline=dict(schedule=..., n_microbatches=4))`, "
        "its `strategy.pipeline.train_step` (what the Runner calls: schedule, the last stage's "
        "loss broadcast, optimizer step, zero_grad). Raw: the same split by hand (a copy of the "
        "GPT without the other stage's modules: embeddings and blocks 0-1 / blocks 2-3, norm "
        "and head), torch's `PipelineStage` and `Schedule1F1B`/`ScheduleGPipe` with the same "
        "microbatches and loss, plain AdamW, no `fully_shard` (pp alone has nothing to shard: "
        "FSDPStrategy leaves such stages plain modules too). Same weights, same batches, "
        "ABBA blocks, ratio = median of per-block ratios (IQR), as in section 1. *CPU*: the "
        "same ratio of each step's CPU time (`time.process_time`, the process's own work, "
        "which other load on the shared cores does not stretch), per rank. *Raw + "
        "fully_shard*: the raw stage sharded by `fully_shard` over a data-parallel mesh of "
        "size 1, what FSDPStrategy did to each stage before (a diagnostic contender, timed "
        "in the same rotation). "
        f"Measured by `python bench/pipeline.py --{res.get('mode', 'quick')}` (section wall "
        f"{res.get('wall_s')} s) on {res.get('date')}, load average "
        f"{res.get('loadavg_at_start')} → "
        f"{res.get('loadavg_at_end')} (`uptime`; 2 cores shared with other work)"
        + (f"; {res['note']}" if res.get("note") else "")
        + ".",
        "",
    )
    rows = []
    for schedule, c in res.get("cases", {}).items():
        if c.get("status") != "ok":
            rows.append([schedule, c.get("status", "?")] + [""] * 8)
            rep.problems.append(
                f"pipeline/{schedule}: {c.get('status')}: {c.get('reason') or c.get('error')}"
            )
            continue
        iqr = c["round_ratio_p25_p75"]
        cpu = c.get("cpu_per_step") or {}
        rows.append(
            [
                f"{schedule}, pp=2",
                _s(c["shardwise_step"]["median_s"]),
                _s(c["raw_step"]["median_s"]),
                f"{_r(c['ratio'])} [{_r(iqr[0])}–{_r(iqr[1])}]",
                f"≤ {c['target']}",
                _met(c["ratio"], c["target"]),
                " / ".join(
                    f"{_r(v['ratio'])} [{_r(v['ratio_p25_p75'][0])}–{_r(v['ratio_p25_p75'][1])}]"
                    for v in cpu.values()
                )
                or "-",
                _s(c["raw_fully_shard_step"]["median_s"]),
                _r(c["ratio_to_raw_fully_shard"]),
                "yes" if c["same_losses"] else "**no**",
            ]
        )
        if not c["meets_target"]:
            where = c["profile_categories"]["rank0"]
            parts = ", ".join(
                f"{k} {_s(where['shardwise'][k])} vs {_s(where['raw'][k])}"
                for k in where["shardwise"]
                if k != "profiled_step_s"
            )
            own = ", ".join(
                f"{k} {_s(v['shardwise_self_s_per_step'])}" for k, v in c["profile"].items()
            )
            cpus = ", ".join(
                f"{k} {_r(v['ratio'])} ({_s(v['shardwise_cpu_s'])} vs {_s(v['raw_cpu_s'])})"
                for k, v in cpu.items()
            )
            rep.misses.append(
                f"pipeline/{schedule}: shardwise / raw torch = {_r(c['ratio'])} (target "
                f"{c['target']}), IQR of the block ratios [{_r(iqr[0])}–{_r(iqr[1])}]; CPU "
                f"time per step shardwise / raw: {cpus or 'not measured'}; shardwise's own "
                f"frames per step: {own}. cProfile, rank 0, own time per step, shardwise vs "
                f"raw: {parts}"
            )
    rep.table(
        [
            "schedule",
            "shardwise step",
            "raw torch step",
            "ratio [IQR]",
            "target",
            "met",
            "CPU ratio, rank 0 / rank 1 [IQR]",
            "raw + fully_shard (size-1 mesh)",
            "shardwise / raw + fully_shard",
            "same losses",
        ],
        rows,
    )
    bubble = res.get("bubble") or {}
    if bubble.get("status") != "ok":
        rep.add(f"Bubble: {bubble.get('status')}: {bubble.get('reason') or bubble.get('error')}")
        rep.problems.append(f"pipeline/bubble: {bubble.get('status')}")
        return
    rep.add(
        "**Bubble fraction**, measured on shardwise's stages: each stage's `forward_one_chunk` "
        "and `backward_one_chunk` calls (and the last stage's loss) are timed on their rank "
        "(*busy*), the schedule's step (`schedule.step` alone, after a barrier; no optimizer) "
        "is the wall; per rank bubble = 1 − busy / wall, the figure is the median over steps of "
        "the two ranks' mean. *Peer wait*: time in the schedule's waits for sends/receives "
        "(idle for the other rank, plus gloo's transfer). Theory, for equal stages and free "
        "communication: (p−1)/(m+p−1) for GPipe and 1F1B (p stages, m microbatches), "
        "(p−1)/(v·m+p−1) for Interleaved1F1B (v stages per rank). What theory leaves out "
        "shows as extra idle: gloo transfers, the schedule's own Python, unequal stages (the "
        "last holds the head and the loss) and, on this shared machine, a rank waiting for a "
        "core.",
        "",
    )
    rows = []
    for b in bubble["schedules"].values():
        r0, r1 = b["ranks"]["rank0"], b["ranks"]["rank1"]
        rows.append(
            [
                b["schedule"],
                f"{b['n_stages']} ({res['pp']} ranks × {b['stages_per_rank']})",
                f"{b['n_microbatches']} ({b['microbatch']} sequences each)",
                f"{b['measured']:.3f} [{b['measured_p25_p75'][0]:.3f}–"
                f"{b['measured_p25_p75'][1]:.3f}]",
                f"{b['theoretical']:.3f}",
                f"{_s(r0['busy_s'])} / {_s(r0['wall_s'])} (wait {_s(r0['peer_wait_s'])})",
                f"{_s(r1['busy_s'])} / {_s(r1['wall_s'])} (wait {_s(r1['peer_wait_s'])})",
            ]
        )
    rep.table(
        [
            "schedule",
            "stages",
            "microbatches",
            "bubble measured [IQR]",
            "theory",
            "rank 0 busy / wall (peer wait)",
            "rank 1 busy / wall (peer wait)",
        ],
        rows,
    )
    rep.add(_pipeline_reading(res), "")
    if res.get("bubble_note"):  # the reading of the run's figures, written when merged
        rep.add(res["bubble_note"], "")


def _pipeline_reading(res: dict[str, Any]) -> str:
    """Section 11's reading of the run: its figures, what shardwise adds to a step, and
    where the bubble departs from theory."""
    ok = {s: c for s, c in res.get("cases", {}).items() if c.get("status") == "ok"}
    parts: list[str] = []
    if ok:
        walls = " and ".join(f"{_r(c['ratio'])} ({s})" for s, c in ok.items())
        cpu = [v["ratio"] for c in ok.values() for v in (c.get("cpu_per_step") or {}).values()]
        cpu_text = f", and per-rank CPU time per step {min(cpu):.3f}-{max(cpu):.3f}" if cpu else ""
        verdict = (
            "so shardwise's step is the raw schedule's"
            if all(c["meets_target"] for c in ok.values())
            else "and shardwise's step measures"
        )
        text = (
            "Reading of this run: pp-only stages are plain modules (no `fully_shard` over the "
            "data-parallel mesh of size 1: plain parameters, plain AdamW), "
            f"{verdict}: {walls} wall{cpu_text}."
        )
        target = next(iter(ok.values()))["target"]
        iqrs = {s: c["round_ratio_p25_p75"] for s, c in ok.items()}
        if all(lo <= 1 <= hi and hi - lo > 2 * (target - 1) for lo, hi in iqrs.values()):
            spans = ", ".join(f"{_r(lo)}–{_r(hi)} ({s})" for s, (lo, hi) in iqrs.items())
            text += (
                f" The per-block IQRs ({spans}) are wider than the {(target - 1) * 100:.0f}% "
                "target at this load: the ratio is within noise of 1."
            )
        parts.append(text)
        extra: dict[str, float] = {}
        for c in ok.values():
            for counts in (c.get("collectives_per_step") or {}).values():
                for op, n in counts.get("shardwise", {}).items():
                    d = n - counts.get("raw", {}).get(op, 0)
                    if d:
                        extra[op] = max(extra.get(op, 0), d)
        own = [p["shardwise_self_s_per_step"] for c in ok.values() for p in c["profile"].values()]
        frames: dict[str, float] = {}
        for c in ok.values():
            for p in c["profile"].values():
                for f in p.get("top", []):
                    func = f["frame"].rsplit("(", 1)[-1].rstrip(")")
                    frames[func] = frames.get(func, 0.0) + f["self_s_per_step"]
        top = ", ".join(f"`{f}`" for f in sorted(frames, key=frames.get, reverse=True)[:3])
        fsdp_dtensor = [
            r["shardwise"].get("fsdp (torch/distributed/fsdp)", 0.0)
            + r["shardwise"].get("DTensor (torch/distributed/tensor)", 0.0)
            for c in ok.values()
            for r in c.get("profile_categories", {}).values()
        ]
        fsdp = max(fsdp_dtensor, default=0.0)
        collectives = ", ".join(f"{op} +{n:g}" for op, n in extra.items()) or "none"
        text = (
            "What shardwise adds to a step (cProfile, function by function against the raw "
            f"step, both ranks): collectives beyond the raw schedule's, per step: {collectives}"
        )
        if "broadcast" in extra:
            text += (
                " (the last stage's loss broadcast to the pipeline ranks: a scalar, waited for "
                "after the optimizer step)"
            )
        text += (
            ", the microbatch losses' mean in float64, and "
            f"{own and _s(min(own))}-{own and _s(max(own))} of its own Python a step ({top}); "
            f"FSDP and DTensor frames take {_s(fsdp)} a step (3-6.5 ms when pp-only stages "
            "were still `fully_shard`-ed, in earlier runs)."
        )
        parts.append(text)
    bubble = (res.get("bubble") or {}).get("schedules", {})
    if bubble:
        rows = list(bubble.values())
        closest = min(rows, key=lambda b: b["measured"] - b["theoretical"])
        excess = [b["measured"] - b["theoretical"] for b in rows if b is not closest]
        waits = [r["peer_wait_s"] for b in rows for r in b["ranks"].values()]
        per_chunk = [
            r["busy_s"] / (2 * b["n_microbatches"] * b["stages_per_rank"])
            for b in rows
            for r in b["ranks"].values()
        ]
        text = (
            f"Bubble: {closest['schedule']} with {closest['n_microbatches']} microbatches "
            f"measures {closest['measured']:.3f} against its theoretical "
            f"{closest['theoretical']:.3f}"
        )
        if excess:
            text += (
                f"; the other rows measure {min(excess):.3f}-{max(excess):.3f} more idle than "
                "theory"
            )
        by_schedule: dict[str, dict[int, dict[str, Any]]] = {}
        for b in rows:
            by_schedule.setdefault(b["schedule"], {})[b["n_microbatches"]] = b
        pairs = {s: ms for s, ms in by_schedule.items() if len(ms) > 1}
        flat = [s for s, ms in pairs.items() if ms[max(ms)]["measured"] >= ms[min(ms)]["measured"]]
        if flat:
            text += f", and it does not fall with m as theory does ({', '.join(flat)})"
        text += (
            ": every chunk pays costs theory leaves out (a gloo send/receive and the "
            f"schedule's Python; peer waits of {_s(min(waits))}-{_s(max(waits))} a step), at "
            f"this size (a {res['model_params'] / 1e6:.1f}M GPT, {_s(min(per_chunk))}-"
            f"{_s(max(per_chunk))} of busy time per forward or backward of a chunk)."
        )
        inter = by_schedule.get("Interleaved1F1B", {}).get(4)
        if inter:
            text += (
                f" Interleaved1F1B at m=4 measures {inter['measured']:.3f} (0.419 in an "
                "earlier run whose stages were `fully_shard`-ed: two FSDP roots per rank)."
            )
        growth = [
            ms[max(ms)]["ranks"][k]["busy_s"] / ms[min(ms)]["ranks"][k]["busy_s"]
            for ms in pairs.values()
            for k in ms[min(ms)]["ranks"]
        ]
        if growth and max(growth) > 1.2:
            load = (res.get("loadavg_at_start") or [0])[0], (res.get("loadavg_at_end") or [0])[0]
            rose = f" as the load rose ({load[0]} → {load[1]})" if load[1] > load[0] else ""
            ms = next(iter(pairs.values()))
            text += (
                f" The m={max(ms)} rows ran later in the run{rose}: their busy time is up to "
                f"{max(growth):.1f}x the m={min(ms)} rows' for the same work, so compare "
                "figures within a row rather than across rows."
            )
        parts.append(text)
    parts.append(
        "Earlier runs of the same command, not in results.json (2026-11-27, by hand; 1-minute "
        "load start → end; 1F1B / GPipe wall ratio): 06:22 (2.0 → 6.6, before the loss "
        "broadcast was waited for after the optimizer step) 1.039 / 1.004; 06:32 (9.4 → 11.6) "
        "1.039 / 1.023; 06:36 (9.3 → 10.7) 1.013 / 1.036, CPU 1.000-1.019; 06:51 (4.9 → 10.0) "
        "1.040 / 1.029, CPU 1.004-1.049."
    )
    return " ".join(parts)
