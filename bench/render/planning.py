"""Section 8 of RESULTS.md: planning cost against ranks (bench/planning.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _bytes, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 8. Planning cost against ranks, and past this machine (bench/planning.py)", "")
    if rep.section_failed("planning", res):
        return
    cases = res["cases"]
    ns = sorted(cases, key=int)
    src = res.get("from_run")
    rep.add(
        f"State: the layout of a 1B-parameter Llama under FSDP2 with AdamW at tiny bytes: "
        f"{res['params']} parameter tensors (16 layers × 9, embedding, final norm), each a "
        f"DTensor sharded on dim 0 over all ranks, plus `exp_avg`/`exp_avg_sq` (sharded) and "
        f"`step` (a replicated 0-dim tensor): {res['entries']} DCP entries, "
        f"{res['sharded_entries']} of them sharded, so `.metadata` holds N × "
        f"{res['sharded_entries']} chunk entries on N ranks. Each rank saves through "
        "shardwise's commit protocol (`CheckpointCommit` around `save_sharded_checkpoint"
        "(central_plan=True)`: DCP's planning through rank 0, what shardwise did before each "
        "rank planned alone, section 8.1) "
        "without and with DCP's plan caching (`plan_cache=`, as the Checkpointer passes it: "
        "`DefaultSavePlanner(enable_plan_caching=True)`), alternating, then resumes "
        "(`read_sharded_meta` + `load_sharded_tensors` into DTensors of the same layout). "
        "Every phase is timed on every rank by wrapping DCP's planner methods and the object "
        "collectives (`gather_object`, `scatter_object_list`, `broadcast_object_list`, "
        "`all_gather_object`): wall time and the thread's CPU time, and the pickled bytes "
        f"each moves; medians of {res['repeats']} repeats after one unrecorded save and load; "
        f"files on {res['storage']}. *Rank-0 CPU*: rank 0's CPU in the coordinator's phases "
        "(save: unpickling the gathered plans, global plan and dedup, pickling the scattered "
        "plans, gathering the write results, writing `.metadata`, broadcasting it; load: "
        "gathering and scattering the load plans); *local CPU*: the slowest rank's own "
        "planning (save: `create_local_plan`, `finish_plan`; load: reading `.metadata` twice, "
        "once in shardwise's `read_sharded_meta` and once in DCP's load, and "
        "`create_local_plan`). *Wall*: rank 0's planning phases (I/O left out), which on this "
        f"{res['cpu_count']}-core machine include waiting for the CPU: "
        + ", ".join(f"{n} ranks" for n in ns if int(n) > (res["cpu_count"] or 2))
        + " are oversubscribed, so CPU time is the figure the fit trusts."
        + (
            f" Taken by `{src['command']}` on {src['date']} ({src['machine']}, section wall "
            f"{src['wall_s']} s), merged into this run's results; `make bench` runs "
            f"{src['quick_worlds']} ranks."
            if src
            else ""
        ),
        "",
    )
    rows = []
    for n in ns:
        c = cases[n]
        sv, ca, ld = c["save_nocache"], c["save_cache"], c["load"]
        rows.append(
            [
                n,
                f"{_s(sv['local_cpu_s'])} ({_s(sv['local_cpu_max_s'])})",
                _s(sv["root_cpu_s"]),
                _s(sv["planning_s"]),
                _s(ca["root_cpu_s"]),
                _s(ca["planning_s"]),
                f"{_s(sv['commit_cpu_s'])} / {_s(sv['commit_wall_s'])}",
                f"{_s(ld['local_cpu_s'])} ({_s(ld['local_cpu_max_s'])})",
                _s(ld["root_cpu_s"]),
                _s(ld["planning_s"]),
                _bytes(sv["plan_bytes_per_rank"][0]),
                _bytes(sum(sv["plan_bytes_per_rank"])),
                _bytes(c["gathered_plans"].get("unpickled_bytes", 0)),
                _bytes(c["metadata_bytes"]),
            ]
        )
    rep.table(
        [
            "ranks",
            "save: local CPU (slowest)",
            "save: rank-0 CPU",
            "save: wall",
            "cached: rank-0 CPU",
            "cached: wall",
            "commit CPU / wall",
            "load: local CPU (slowest)",
            "load: rank-0 CPU",
            "load: wall",
            "plan / rank (pickled)",
            "plans to rank 0",
            "rank 0 holds (unpickled)",
            ".metadata",
        ],
        rows,
    )
    big = cases[ns[-1]]
    phase_rows = []
    for label, key in (("save", "save_nocache"), ("cached save", "save_cache"), ("load", "load")):
        for name, v in sorted(big[key]["phases_rank0"].items(), key=lambda kv: -kv[1]["cpu"]):
            phase_rows.append(
                [
                    label,
                    name,
                    _s(v["cpu"]),
                    _s(v.get("gc", 0.0)),
                    _s(v["wall"]),
                    _bytes(v["bytes"]) if v["bytes"] else "",
                ]
            )
    rep.add(f"Rank 0's phases at {ns[-1]} ranks (medians; bytes: what this rank sends):", "")
    rep.table(["operation", "phase", "CPU", "of it GC", "wall", "bytes"], phase_rows)
    mdl = res.get("model")
    if not mdl:
        return
    fits = mdl["fits"]

    def _t(x: float) -> str:  # a fit's terms and residuals may be negative
        return "-" + _s(-x) if x < 0 else _s(x)

    names = {
        "save_root_cpu": ("save: rank-0 CPU", _t),
        "save_root_cpu_no_gc": ("save: rank-0 CPU less Python's GC", _t),
        "save_local_cpu": ("save: local CPU", _t),
        "save_plan_wall": ("save: wall (oversubscribed)", _t),
        "cached_root_cpu": ("cached save: rank-0 CPU", _t),
        "cached_local_cpu": ("cached save: local CPU", _t),
        "commit_cpu": ("commit: CPU", _t),
        "load_root_cpu": ("load: rank-0 CPU", _t),
        "load_local_cpu": ("load: local CPU", _t),
        "load_local_cpu_no_gc": ("load: local CPU less Python's GC", _t),
        "load_plan_wall": ("load: wall (oversubscribed)", _t),
        "plan_bytes_gathered": ("save plans gathered to rank 0", _bytes),
        "gathered_plans_memory": ("rank 0's memory for them", _bytes),
        "metadata_bytes": (".metadata (broadcast by rank 0, read by every rank)", _bytes),
    }
    fit_rows = []
    for key, (label, fmt) in names.items():
        f = fits[key]
        fit_rows.append(
            [
                label,
                fmt(f["a"]),
                fmt(f["b"]),
                ", ".join(
                    fmt(r) if abs(r) >= 1e-4 or fmt is _bytes else "0" for r in f["residuals"]
                ),
                fmt(f["predicted"]["1024"]),
                fmt(f["predicted"]["4096"]),
            ]
        )
    rep.add(
        f"Fit y = a + b·N by least squares over N = {', '.join(map(str, mdl['ranks']))} "
        "(residuals in the same order), and what it predicts:",
        "",
    )
    rep.table(["quantity", "a", "b (per rank)", "residuals", "N = 1,024", "N = 4,096"], fit_rows)
    half = res.get("half_tensors_4_ranks")
    if half and "4" in cases:
        full4 = cases["4"]
        rep.add(
            f"Per-rank cost against the number of tensors: at 4 ranks with half the tensors "
            f"({half['entries']} entries), save rank-0 CPU {_s(half['save_nocache']['root_cpu_s'])}"
            f" against {_s(full4['save_nocache']['root_cpu_s'])}, load local CPU "
            f"{_s(half['load']['local_cpu_s'])} against {_s(full4['load']['local_cpu_s'])}"
            f", .metadata {_bytes(half['metadata_bytes'])} against "
            f"{_bytes(full4['metadata_bytes'])}: the b terms scale with T (b ≈ c·T).",
            "",
        )
    lats = res["assumed_latency_us"]
    pred = mdl["predicted"]
    steps = mdl["linear_steps"]
    rep.add(
        "Prediction on a real cluster: the fitted CPU, plus the network the loopback "
        "measurement leaves out: each collective whose latency grows with N on gloo (a gather "
        "or scatter at the root, a ring all-gather; `gather_object` is an all-gather of sizes "
        f"and a gather) costs N × an assumed per-rank latency (save {steps['save']} such steps, "
        f"commit {steps['commit']}, load {steps['load']}; broadcasts are trees, left out), and "
        f"the bytes through rank 0 cross a {res['assumed_bandwidth_gbps']:.0f} GB/s link. "
        "Latencies shown: " + ", ".join(f"{x:g} µs" for x in lats) + " per rank.",
        "",
    )
    prow = []
    for n in ("1024", "4096"):
        for op in ("save", "cached save", "commit", "load"):
            p = pred[n][op]
            prow.append(
                [
                    f"{int(n):,}",
                    op,
                    _s(p["cpu_s"]),
                    _bytes(p["bytes_via_rank0"]),
                    *(_s(p["total_s"][str(x)]) for x in lats),
                ]
            )
    rep.table(
        [
            "ranks",
            "operation",
            "CPU (fit)",
            "bytes via rank 0",
            *(f"total at {x:g} µs" for x in lats),
        ],
        prow,
    )
    p4 = pred["4096"]

    def at4k(name: str) -> float:
        return fits[name]["predicted"]["4096"]

    mid = str(lats[1])
    rep.add(
        "**What keeps it bounded.** "
        f"(1) *Plan caching* (on by default in shardwise's saves, one cache per strategy and "
        "kind of save): a repeat save of the same layout sends a "
        f"{_bytes(big['save_cache']['plan_bytes_per_rank'][0])} empty plan instead of the "
        "full one (the gather and the scatter still run, N small messages each) and skips "
        "the global plan; at 4,096 ranks it takes the save from "
        f"{_s(p4['save']['total_s'][mid])} to {_s(p4['cached save']['total_s'][mid])} "
        f"(at {lats[1]:g} µs), and rank 0 no longer holds "
        f"{_bytes(p4['gathered_plans_memory'])} of unpickled plans. It does not remove the "
        "gather of write results and the broadcast of `.metadata` "
        f"({_bytes(p4['metadata_bytes'])} at 4,096 ranks, N × T chunk entries), which every "
        "save still does; nor anything of a resume, which DCP does not cache. "
        "(2) *Fewer, larger tensors*: the b terms are proportional to the number of sharded "
        "entries T (the half-tensor run above, in --full), so flattening a block's parameters "
        "into one tensor (FSDP1's flat parameters, or a per-block save) divides the plans, "
        "`.metadata` and every rank's `.metadata` reads by the tensors per block (9 for a "
        f"Llama layer): at 4,096 ranks about {_s(p4['save']['total_s'][mid] / 9)} per save "
        f"and {_s(p4['load']['total_s'][mid] / 9)} per resume instead of "
        f"{_s(p4['save']['total_s'][mid])} and {_s(p4['load']['total_s'][mid])}. "
        "(3) *Asynchronous saves* (`async_save=True`): shardwise runs DCP's save (planning, "
        "writes) and the commit in a background thread on its own gloo group, so none of the "
        "save figures above blocks training (sections 3 and 3.1 measure what an asynchronous "
        "save still blocks: the copy to host memory); a resume stays on the critical path, "
        "once per restart, and nothing caches it. The network term (N × steps × per-rank "
        "latency) is small beside rank 0's CPU at these sizes; only a hierarchical gather "
        "(per-node leaders), which DCP does not do, would bound it. "
        "(4) *Python's garbage collector paused during planning*: unpickling the gathered "
        "plans (rank 0) and `.metadata` (every rank, twice per resume) allocates enough "
        "objects to start full collections, each scanning the whole heap (the *of it GC* "
        "column); at 4,096 ranks without them about "
        f"{_s(at4k('save_root_cpu_no_gc') + at4k('save_local_cpu'))}"
        " of CPU per save and "
        f"{_s(at4k('load_root_cpu') + at4k('load_local_cpu_no_gc'))}"
        " per resume (the *less Python's GC* rows) instead of "
        f"{_s(p4['save']['cpu_s'])} and {_s(p4['load']['cpu_s'])}. Reading `.metadata` once "
        "per resume instead of twice (shardwise reads it, then DCP again) saves one of its two "
        "O(N × T) reads per rank.",
        "",
    )
    two = cases.get("2", {}).get("save_cache", {}).get("phases_rank0", {})
    loop2 = two.get("gather plans", {}).get("wall", 0.0) / 2
    rep.add(
        "What the model leaves out: a real network's per-rank latency is assumed, not "
        "measured (a cached save's gather of 124-byte plans over loopback costs "
        + "; ".join(
            f"{_s(cases[n]['save_cache']['phases_rank0']['gather plans']['wall'] / int(n))} "
            f"per rank at {n}"
            for n in ns
            if int(n) > 1 and "gather plans" in cases[n]["save_cache"]["phases_rank0"]
        )
        + " ranks, wall, which includes waiting for the slowest rank and, past 2 ranks, for "
        "the oversubscribed CPUs: an upper bound"
        + (
            f"; at {_s(loop2)} per rank the latency term alone would be {steps['save']} × "
            f"4,096 × {_s(loop2)} = {_s(steps['save'] * 4096 * loop2)} per save"
            if loop2
            else ""
        )
        + "); NCCL's object "
        "collectives go through GPU memory; the fit is linear over at most 8 ranks, so a "
        "super-linear term (Python's garbage collector over rank 0's growing heap, the "
        "per-tensor chunk search of a load's local plan) would show only beyond it; stragglers "
        "and the file system's metadata operations (N files created per save) are not modelled. "
        "The local save plan is O(tensors per rank) and should not grow with N; its measured "
        "creep on 2 oversubscribed cores, extrapolated, overstates it. *Commit wall* includes "
        "waiting for the slowest rank's writes (its CPU is the commit's own cost).",
        "",
    )
