"""Section 3 of RESULTS.md: checkpoint throughput, peak memory and load time
(bench/checkpoint_io.py)."""

from __future__ import annotations

from typing import Any

from _report import FULL_LOAD_TARGET, IO_TARGET, Report, _breakdown, _mb, _met, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 3. Checkpointing: throughput, peak memory, load time", "")
    if rep.section_failed("checkpoint_io", res):
        return
    rep.add(
        f"Model: {res['model']} ({res['model_params'] / 1e6:.1f}M parameters) with AdamW state. "
        "Synchronous saves unless the row says async; every save is fsync'd except the "
        "page-cache row; `os.sync()` between contenders, page cache evicted before every load; "
        "times are the best of N (the disk is shared and jumps; medians in results.json). Disk "
        "bandwidth: `os.write` of the same number of bytes + `fsync`, and reading the file "
        "back, in the same run. Async rows: `save_checkpoint(async_save=True)` alternating "
        "with a synchronous save of the same state in the same processes; *blocked* is until "
        "the call returns and the copies it leaves to the background are done "
        "(`wait_for_staging()`, as if the next optimizer step came at once), *committed* until "
        "`wait_for_checkpoint()` returns, nothing else running meanwhile; on 2 ranks each "
        "repeat counts the slower rank. Resharded resume: the sharded row's checkpoint (saved "
        "by FSDP on 2 ranks) resumed by `SingleDeviceStrategy` on 1 rank, its page cache "
        "evicted, against FSDP's resume of the same checkpoint on 2 ranks."
        + (
            f" Taken by `{res['run_from']['command']}` on {res['run_from']['date']} (same "
            f"machine, section wall {res.get('wall_s')} s), merged into this run's results."
            if res.get("run_from")
            else ""
        ),
        "",
    )
    rows: list[list[str]] = []
    full = res.get("full", {})
    if full.get("status") == "ok":
        save, gbps, ratios, load = full["save_s"], full["save_gbps"], full["ratios"], full["load_s"]
        nbytes = full["file_bytes"]["shardwise"]
        rows += [
            [
                f"full save, 1 process ({_mb(nbytes)})",
                f"{_s(save['shardwise'])} = {gbps['shardwise']:.2f} GB/s",
                f"torch.save+fsync {_s(save['torch.save+fsync'])} = "
                f"{gbps['torch.save+fsync']:.2f} GB/s",
                _r(ratios["save vs torch.save+fsync"]),
                f"≤ {IO_TARGET}",
                _met(ratios["save vs torch.save+fsync"], IO_TARGET),
            ],
            [
                "full save vs the disk",
                f"{gbps['shardwise']:.2f} GB/s",
                f"os.write+fsync {gbps['disk']:.2f} GB/s; torch.save to page cache "
                f"{gbps['torch.save (page cache)']:.2f} GB/s",
                _r(ratios["save vs disk write"]),
                "–",
                "–",
            ],
            [
                "full load_checkpoint (weights)",
                _s(load["shardwise load_checkpoint"]),
                f"torch.load+load_state_dict {_s(load['torch.load+load_state_dict (weights)'])}",
                _r(ratios["load_checkpoint vs torch.load+load_state_dict"]),
                f"≤ {FULL_LOAD_TARGET}",
                _met(ratios["load_checkpoint vs torch.load+load_state_dict"], FULL_LOAD_TARGET),
            ],
            [
                "full resume (weights+optimizer+RNG)",
                _s(load["shardwise resume"]),
                "torch.load+2×load_state_dict "
                f"{_s(load['torch.load+load_state_dict (weights+optimizer)'])}; disk read "
                f"{full['disk_read_gbps']:.2f} GB/s ({_s(full['disk_read_s'])})",
                _r(ratios["resume vs torch.load+load_state_dict x2"]),
                f"≤ {FULL_LOAD_TARGET}",
                _met(ratios["resume vs torch.load+load_state_dict x2"], FULL_LOAD_TARGET),
            ],
        ]
        for key, label in (
            ("save vs torch.save+fsync", "save"),
            ("load_checkpoint vs torch.load+load_state_dict", "load_checkpoint"),
            ("resume vs torch.load+load_state_dict x2", "resume"),
        ):
            target = IO_TARGET if label == "save" else FULL_LOAD_TARGET
            if ratios[key] > target:
                runs = full["save_runs_s"] if label == "save" else full["load_runs_s"]
                rep.misses.append(
                    f"Checkpoint, full {key}: {_r(ratios[key])} > {target}. "
                    f"{_breakdown(full['profiles'], label)}. All runs (s): "
                    + "; ".join(f"{k} {[round(x, 3) for x in v]}" for k, v in runs.items())
                    + "."
                )
        rows += _async_rows(rep, full, "full, 1 process")
    else:
        rep.section_failed("checkpoint_io/full", full)
    sharded = res.get("sharded", {})
    if sharded.get("status") == "ok":
        save, load, ratios = sharded["save_s"], sharded["load_s"], sharded["ratios"]
        nbytes = sharded["dir_bytes"]["shardwise"]
        rows += [
            [
                f"sharded save, FSDP 2 ranks ({_mb(nbytes)})",
                f"{_s(save['shardwise'])} = {sharded['save_gbps']['shardwise']:.2f} GB/s",
                f"dcp.save {_s(save['dcp'])} = {sharded['save_gbps']['dcp']:.2f} GB/s",
                _r(ratios["save vs dcp.save"]),
                f"≤ {IO_TARGET}",
                _met(ratios["save vs dcp.save"], IO_TARGET),
            ],
            [
                "sharded resume, FSDP 2 ranks",
                _s(load["shardwise resume"]),
                f"dcp.load+set_state_dict {_s(load['dcp'])}",
                _r(ratios["resume vs dcp.load+set_state_dict"]),
                f"≤ {IO_TARGET}",
                _met(ratios["resume vs dcp.load+set_state_dict"], IO_TARGET),
            ],
        ]
        for key, label in (
            ("save vs dcp.save", "save"),
            ("resume vs dcp.load+set_state_dict", "resume"),
        ):
            if ratios[key] > IO_TARGET:
                runs = sharded["save_runs_s" if label == "save" else "load_runs_s"]
                rep.misses.append(
                    f"Checkpoint, sharded {key}: {_r(ratios[key])} > {IO_TARGET}. "
                    f"{_breakdown(sharded['profiles'], label)}. All runs (s): "
                    + "; ".join(f"{k} {[round(x, 3) for x in v]}" for k, v in runs.items())
                    + "."
                )
        rows += _async_rows(rep, sharded, "sharded, FSDP 2 ranks")
    else:
        rows.append(["sharded save/resume (FSDP)", sharded.get("status", "?"), "", "", "", ""])
    reshard = res.get("reshard", {})
    if reshard.get("status") == "ok":
        rows.append(
            [
                "resharded resume: sharded checkpoint of 2 ranks on 1 rank",
                _s(reshard["resume_1_rank_s"]),
                f"FSDP resume of it on 2 ranks {_s(reshard['resume_2_ranks_s'])}; full resume "
                f"on 1 rank {_s(reshard['full_resume_1_rank_s'])}",
                _r(reshard["ratio"]),
                "–",
                "–",
            ]
        )
    else:
        rows.append(["resharded resume (2 → 1 rank)", reshard.get("status", "?"), "", "", "", ""])
        rep.problems.append(
            f"checkpoint_io/reshard: {reshard.get('status')}: {reshard.get('reason')}"
        )
    rep.table(["figure", "shardwise", "baseline (same run)", "ratio", "target", "met"], rows)

    rep.add(
        "Peak memory: the RSS high-water mark (`VmHWM`, reset via `/proc/self/clear_refs` "
        "just before the call) minus the RSS before it, in fresh processes run with "
        "`MALLOC_MMAP_THRESHOLD_=65536` so that freed blocks leave the RSS. Target: at most "
        f"{IO_TARGET}× torch's figure for the same operation, or within 1% of the model's "
        "size of it.",
        "",
    )
    rows = []
    mem = res.get("memory_full", {})
    if mem.get("status") == "ok":
        peaks, model = mem["peak_extra_bytes"], mem["model_bytes"]
        pairs = [
            ("full save", "save: shardwise", "save: torch.save+fsync"),
            (
                "full load_checkpoint",
                "load weights: shardwise load_checkpoint",
                "load weights: torch.load+load_state_dict",
            ),
            ("full resume", "resume: shardwise resume", "resume: torch.load+load_state_dict x2"),
        ]
        for label, mine, theirs in pairs:
            rows.append(_memory_row(rep, label, peaks[mine], peaks[theirs], theirs, model))
        if "export: shardwise convert to safetensors" in peaks:
            rows.append(_export_row(rep, mem))
        rep.add(
            f"Model (parameters) {_mb(model)}, checkpoint file {_mb(mem['file_bytes'])}. "
            "Where a load's memory goes: "
            + ", ".join(f"{k[6:]} {_mb(v)}" for k, v in peaks.items() if k.startswith("part: "))
            + ".",
            "",
        )
        if "export_s" in mem:
            rep.add(
                "Safetensors export (`convert_checkpoint(src, dst, to='safetensors')`, one warm-up "
                "export first, page cache evicted) of the full checkpoint: "
                f"{_mb(mem['export_bytes'])} written in {_s(mem['export_s']['shardwise'])}"
                + (
                    f" (torch.load+safetensors `save_file` "
                    f"{_s(mem['export_s']['torch.load+save_file'])})"
                    if "torch.load+save_file" in mem["export_s"]
                    else ""
                )
                + "; largest tensor of the model "
                f"{_mb(mem['largest_tensor_bytes'])}. Target: at most the largest tensor, "
                "within 1% of the model's size (convert's streaming claim). Where its memory "
                "goes: "
                + ", ".join(
                    f"{k[13:]} {_mb(v)}" for k, v in peaks.items() if k.startswith("export part: ")
                )
                + ".",
                "",
            )
    else:
        rows.append(["full save/load memory", mem.get("status", "?"), "", "", "", ""])
        rep.problems.append(f"checkpoint_io/memory_full: {mem.get('error') or mem.get('reason')}")
    memf = res.get("memory_fsdp_full", {})
    if memf.get("status") == "ok":
        peaks = memf["peak_extra_bytes"]
        rows.append(
            _memory_row(
                rep,
                "FSDP 2 ranks, full save, rank 0",
                peaks["shardwise"],
                peaks["get_state_dict+torch.save"],
                "get_state_dict(full, cpu_offload)+torch.save",
                memf["model_bytes"],
            )
        )
    else:
        rows.append(["FSDP full save memory", memf.get("status", "?"), "", "", "", ""])
    rep.table(
        [
            "operation",
            "shardwise peak added",
            "baseline peak added",
            "ratio",
            "× model size",
            "met",
        ],
        rows,
    )


def _async_rows(rep: Report, case: dict[str, Any], label: str) -> list[list[str]]:
    """The async save of one case against its synchronous save of the same state."""
    if "async_s" not in case:
        return []
    best, ratios = case["async_s"], case["async_ratios"]
    blocked = ratios["blocked vs sync save"]
    if blocked is not None and blocked >= 1:
        rep.misses.append(
            f"Checkpoint, async save ({label}): training blocked {_s(best['async blocked'])}, "
            f"not less than the synchronous save's {_s(best['sync'])}. All runs (s): "
            + "; ".join(f"{k} {[round(x, 3) for x in v]}" for k, v in case["async_runs_s"].items())
            + "."
        )
    return [
        [
            f"async save, {label}: training blocked",
            _s(best["async blocked"]),
            f"synchronous save {_s(best['sync'])}",
            _r(blocked),
            "< 1",
            "–" if blocked is None else ("yes" if blocked < 1 else "**no**"),
        ],
        [
            f"async save, {label}: until committed",
            _s(best["async committed"]),
            f"synchronous save {_s(best['sync'])}",
            _r(ratios["committed vs sync save"]),
            "–",
            "–",
        ],
    ]


def _export_row(rep: Report, mem: dict[str, Any]) -> list[str]:
    """Peak memory of the safetensors export against the largest tensor and the model."""
    peaks, model, largest = mem["peak_extra_bytes"], mem["model_bytes"], mem["largest_tensor_bytes"]
    mine = peaks["export: shardwise convert to safetensors"]
    raw = peaks.get("export: torch.load+safetensors save_file")
    ok = mine is not None and mine <= largest + 0.01 * model
    if mine is not None and not ok:
        parts = {k[13:]: v for k, v in peaks.items() if k.startswith("export part: ")}
        hashing = next((v for k, v in parts.items() if k.startswith("file_checksum")), None)
        reason = (
            f"measured in the same process, hashing the exported file for its manifest "
            f"(`file_checksum`, which reads it back through a 1 MiB buffer) alone adds "
            f"{_mb(hashing)}: the peak is that fixed buffer, not the tensors (it does not grow "
            "with the model)"
            if hashing is not None and hashing >= 0.9 * mine
            else "measured parts: "
            + (", ".join(f"{k} {_mb(v)}" for k, v in parts.items()) or "none")
        )
        rep.misses.append(
            f"Memory, safetensors export: adds {_mb(mine)} at its peak against the largest "
            f"tensor's {_mb(largest)} (+1% of the model: {_mb(0.01 * model)}); that is "
            f"{mine / model:.3f}× the model ({_mb(model)}; torch.load+save_file adds "
            f"{_mb(raw)}). Reason: {reason}."
        )
    return [
        "safetensors export of the full checkpoint (convert)",
        _mb(mine),
        f"largest tensor {_mb(largest)}; torch.load+safetensors save_file {_mb(raw)}",
        _r(None if mine is None else mine / largest) + " × largest tensor",
        _r(None if mine is None else mine / model),
        "yes" if ok else "**no**",
    ]


def _memory_row(
    rep: Report, label: str, mine: int | None, theirs: int | None, base: str, model: int
) -> list[str]:
    value = None if mine is None or not theirs else mine / theirs
    ok = (
        mine is not None
        and theirs is not None
        and (mine <= IO_TARGET * theirs or mine - theirs <= 0.01 * model)
    )
    if mine is not None and not ok:
        rep.misses.append(
            f"Memory, {label}: shardwise adds {_mb(mine)} at its peak against {_mb(theirs)} "
            f"for {base} (model {_mb(model)})."
        )
    return [
        label,
        _mb(mine),
        f"{_mb(theirs)} ({base})",
        _r(value),
        _r(None if mine is None else mine / model),
        "yes" if ok else "**no**",
    ]
