"""Section 13 of RESULTS.md: checkpoints on object storage against the disk
(bench/object_storage.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 13. Checkpoints on object storage: an S3 server against the disk", "")
    if rep.section_failed("object_storage", res):
        return
    rep.add(
        f"`python bench/run_all.py{' --full' * (res.get('mode') == 'full')} --only "
        "object_storage --merge` (bench/"
        f"object_storage.py; load {res['loadavg_before'][0]} -> {res['loadavg_after'][0]}): "
        f"a {res['model']} GPT ({res['model_params'] / 1e6:.1f}M parameters) saved and "
        "resumed to moto's S3 server on this machine (over HTTP, the s3fs client) and to the "
        "local disk, the same bytes in the same run, contenders alternating; `full` on one "
        "process, `sharded` on 2 FSDP ranks (the slowest rank's time). moto keeps objects in "
        "memory and serves them from one Python process: it stands for the protocol, not for "
        "S3's bandwidth, and it copies an object whole for every ranged read.",
        "",
    )
    rows = []
    for case in ("full", "sharded"):
        c = res.get(case, {})
        if c.get("status") != "ok":
            rows.append([case, c.get("status", "-"), "", "", "", ""])
            continue
        med, r = c["median_s"], c["ratios"]
        rows.append(
            [
                case,
                f"{c['bytes'] / 1e6:.0f} MB",
                f"{_s(med['save s3'])} / {_s(med['save disk'])} ({_r(r['save s3 / disk'])})",
                f"{_s(med['resume s3'])} / {_s(med['resume disk'])} ({_r(r['resume s3 / disk'])})",
                f"{_s(med['async blocked s3'])} / {_s(med['async blocked disk'])} "
                f"(**{_r(r['async blocked s3 / disk'])}**)",
                ", ".join(
                    f"{k.split(' / ')[1]} {_r(r[k])}" for k in r if k.endswith(("upload", "read"))
                )
                or "-",
            ]
        )
    rep.table(
        [
            "case",
            "bytes",
            "save s3 / disk",
            "resume s3 / disk",
            "async blocked s3 / disk",
            "s3 against the bare transfer",
        ],
        rows,
    )
    target = res["targets"]["async blocked s3 / disk"]
    for case in ("full", "sharded"):
        c = res.get(case, {})
        if c.get("status") == "ok" and c["ratios"]["async blocked s3 / disk"] > target:
            rep.misses.append(
                f"object storage ({case}): the async save blocks "
                f"{_r(c['ratios']['async blocked s3 / disk'])}x as long on S3 as on disk "
                f"(target {target})"
            )
