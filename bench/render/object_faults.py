"""Section 16 of RESULTS.md: a 1 GiB upload to object storage with 1 % of its requests failing,
against the same upload without faults (bench/object_faults.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _bytes, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 16. Uploads to object storage under faults: 1 % of requests failing", "")
    if rep.section_failed("object_faults", res):
        return
    med = res["median_s"]
    rep.add(
        f"`python bench/run_all.py{' --full' * (res.get('mode') == 'full')} --only "
        f"object_faults --merge` (bench/object_faults.py; load {res['loadavg_before'][0]} -> "
        f"{res['loadavg_after'][0]}): one file of {_bytes(res['bytes'])} uploaded by "
        "`upload_files` (16 MiB parts) to moto's S3 server through a proxy that answers "
        f"{res['rate']:.0%} of requests with 503 SlowDown, against the same upload with no "
        "fault; each failed request is sent again alone (botocore's standard mode, "
        f"{res['request_attempts']} attempts a request). Median of {len(res['runs']['clean'])} "
        f"each: **{_s(med['faults'])}** with faults, {_s(med['clean'])} without "
        f"(**{_r(res['faults / clean'])}x**).",
        "",
    )
    rows = [
        [
            case,
            str(i + 1),
            _s(r["seconds"]),
            f"{res['bytes'] / r['seconds'] / 1e6:,.0f} MB/s",
            str(r["faults"]),
            str(r["requests"]),
            f"{r['retried_requests']} ({', '.join(sorted({n.split(':')[0] for n in r['notes']}))})"
            if r.get("retried_requests")
            else "0",
            str(r["uploads_started"]),
            "yes" if r["whole"] else "**no**",
        ]
        for case in ("clean", "faults")
        for i, r in enumerate(res["runs"][case])
    ]
    rep.table(
        [
            "case",
            "repeat",
            "seconds",
            "rate",
            "faults injected",
            "requests",
            "sent again (why)",
            "uploads started",
            "whole",
        ],
        rows,
    )
    if res.get("stopped"):
        rep.add(f"Stopped early: {res['stopped']}.", "")
    if not res["all_whole"]:
        rep.misses.append(
            "object storage under faults: an upload was restarted or its object is not whole"
        )
