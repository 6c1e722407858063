"""Uploads to object storage under faults: a 1 GiB file uploaded with shardwise's
``upload_files`` to moto's S3 server through a proxy that answers 1 % of the requests with
503 SlowDown (``tests/s3_server.py``'s FaultProxy, ``rate=0.01``), against the same upload
through the same proxy with no fault, in the same run (contenders alternating, order
rotated each repeat).

The file goes as a multipart upload of 16 MiB parts (``storage.UPLOAD_PART``: 64 parts);
botocore's standard retry mode sends a failed request (a part, the upload's start or its
completion) again alone, within one attempt of shardwise's outer retry. Recorded per upload:
the seconds, the faults injected, the requests sent, the requests the client sent again (and
why: an injected fault, or a timeout of the loaded machine), the multipart uploads started
(1: the file was never restarted), and that the object is whole (its size). moto keeps the object in
this process's memory: it stands for the protocol, not for S3's bandwidth.

    python bench/object_faults.py --full --out object_faults.json
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import median, out_of_time, quiet_shardwise_logs, ratio, section_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.s3_server

RATE = 0.01


def _sizes(quick: bool) -> dict[str, Any]:
    return dict(size=256 << 20, repeats=2) if quick else dict(size=1 << 30, repeats=3)


def _upload(proxy: Any, rule: Any, local: Path, url: str, rate: float) -> dict[str, Any]:
    from shardwise.checkpoint.storage import delete_objects, object_info, upload_files

    rule.rate = rate
    hits, seen = rule.hits, len(proxy.seen)
    notes: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: notes.append(record.getMessage())  # type: ignore[method-assign]
    storage_log = logging.getLogger("shardwise.checkpoint.storage")
    storage_log.addHandler(handler)
    start = time.perf_counter()
    try:
        upload_files([(local, url)])
    finally:
        storage_log.removeHandler(handler)
    seconds = time.perf_counter() - start
    requests, faulted = proxy.seen[seen:], rule.seen[hits:]

    def starts(lines: list[str]) -> int:
        return sum(r.startswith("POST") and r.endswith("?uploads") for r in lines)

    info = object_info(url)
    delete_objects([url])  # moto holds it in memory
    return dict(
        seconds=round(seconds, 3),
        faults=rule.hits - hits,
        requests=len(requests),
        uploads_started=starts(requests) - starts(faulted),  # those the store answered
        retried_requests=sum("a request failed" in note for note in notes),
        notes=sorted({note.split(": a request failed (")[-1].split(":")[0] for note in notes}),
        whole=info is not None and int(info["size"]) == local.stat().st_size,
    )


def run(quick: bool = True) -> dict[str, Any]:
    try:
        from tests.s3_server import FaultProxy, S3Server
    except ImportError as exc:
        return {"status": "not available", "reason": f"moto[server] is needed: {exc}"}
    from shardwise.checkpoint.storage import REQUEST_ATTEMPTS, set_storage_options

    quiet_shardwise_logs()
    cfg = _sizes(quick)
    out: dict[str, Any] = {
        "bytes": cfg["size"],
        "rate": RATE,
        "request_attempts": REQUEST_ATTEMPTS,
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    server = S3Server.start()
    os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
    proxy = FaultProxy(server).start()
    bucket = server.bucket()
    set_storage_options(bucket, dict(endpoint_url=f"http://127.0.0.1:{proxy.port}"))
    rule = proxy.add(status=503, code="SlowDown", times=-1, rate=0.0)
    runs: dict[str, list[dict[str, Any]]] = {"clean": [], "faults": []}
    with tempfile.TemporaryDirectory(prefix="shardwise-bench-faults-") as spool:
        local = Path(spool) / "state.bin"
        with open(local, "wb") as f:
            for _ in range(cfg["size"] >> 24):
                f.write(os.urandom(16 << 20))
        for repeat in range(cfg["repeats"]):
            if out_of_time(2 * max([r["seconds"] for v in runs.values() for r in v] or [60])):
                out["stopped"] = f"time budget: {repeat} repeats of {cfg['repeats']}"
                break
            order = ["clean", "faults"][:: 1 if repeat % 2 == 0 else -1]
            for case in order:
                url = f"{bucket}/{case}-{repeat}.bin"
                runs[case].append(_upload(proxy, rule, local, url, RATE * (case == "faults")))
    proxy.stop()
    server.stop()
    out["runs"] = runs
    out["median_s"] = {case: median([r["seconds"] for r in v]) for case, v in runs.items()}
    out["faults / clean"] = ratio(out["median_s"]["faults"], out["median_s"]["clean"])
    out["all_whole"] = all(
        r["whole"] and r["uploads_started"] == 1 for v in runs.values() for r in v
    )
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


if __name__ == "__main__":
    section_main("object_faults", run)
