"""Checkpoints on object storage: saves and resumes to an S3 server against the local disk, the
same bytes, in the same run; and how long an asynchronous save blocks training on each.

The S3 server is moto's server mode (``moto[server]``) on a free port of this machine, in this
driver process, spoken to over HTTP by the ranks' s3fs client (the code path of AWS); the
local disk is the temporary directory's. Contenders alternate within each repeat (their order
rotated), after an untimed warm-up of each:

- ``full`` (one process, ``SingleDeviceStrategy``): ``save_checkpoint`` to ``s3://`` against
  ``save_checkpoint`` to the disk (fsync'd, renamed into place); ``resume`` from each (the
  file's pages evicted from the page cache first); and the floors of the transfer alone: one
  upload of the saved file (``fs.put_file``) and one ranged read of it whole;
- ``sharded`` (2 ranks, ``FSDPStrategy(state_dict_cfg='sharded')``): the same, each rank
  uploading its own objects and reading its own byte ranges; every figure is the slowest
  rank's;
- ``async`` (inside both): ``save_checkpoint(async_save=True)`` to each: the seconds training
  is blocked (until the call returns and the host copies are done) and until the checkpoint
  is committed.

The ratios: ``s3 / disk`` for save, resume, and the async save's blocked time (the target:
as brief on S3 as on the disk, ~1.0). Figures are the median of the repeats (best of N
beside them). moto keeps objects in this process's memory and serves one request per
thread: it stands for the protocol, not for S3's bandwidth; and it copies an object whole to
serve any ranged read of it (``server``: a 1 KiB read of a large object against a small one),
so a resharded or sharded resume, whose ranks read many small records (an FSDP rank reads
rank 0's optimizer step counts, interleaved in rank 0's file), pays that per read here and
not on S3. ``server`` also counts one resume's ranged reads.

    python bench/object_storage.py --quick --out object_storage.json
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    drop_file_cache,
    gpt_fsdp_strategy,
    median,
    out_of_time,
    path_bytes,
    quiet_shardwise_logs,
    ratio,
    run_ranks,
    section_main,
)

LR = 3e-4
TARGETS = {"async blocked s3 / disk": 1.10}
CREDENTIALS = dict(
    AWS_ACCESS_KEY_ID="bench",
    AWS_SECRET_ACCESS_KEY="bench",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_EC2_METADATA_DISABLED="true",
)


def _sizes(quick: bool) -> dict[str, Any]:
    return dict(size="10M", repeats=3) if quick else dict(size="50M", repeats=5)


# ----------------------------------------------------------------------------- helpers
def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _timed(fn) -> float:
    _barrier()
    start = time.perf_counter()
    fn()
    _barrier()
    return time.perf_counter() - start


def _slowest(runs: dict[str, list[float]]) -> dict[str, list[float]]:
    """Every rank's figures, each repeat's the slowest rank's."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return runs
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, runs)
    return {k: [max(rk[k][i] for rk in every) for i in range(len(v))] for k, v in runs.items()}


def _remove(path: str) -> None:
    """Delete a checkpoint on the disk or on the store (rank 0)."""
    from shardwise.checkpoint.storage import delete_objects, is_url, list_objects

    if _rank() != 0:
        return
    if is_url(path):
        objects = list_objects(path)
        names = [f"{path}/{n}" for n in objects] or [path, f"{path}.manifest.json"]
        delete_objects(names)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)
        Path(f"{path}.manifest.json").unlink(missing_ok=True)


def _evict(path: str) -> None:
    from shardwise.checkpoint.storage import is_url

    if not is_url(path) and os.path.exists(path):
        drop_file_cache(path)


def _rounds(strategy, places: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """Save to and resume from each place, alternating; then asynchronous saves to each."""
    runs: dict[str, list[float]] = {}
    for root in places.values():  # untimed warm-up: the first save of each place
        path = f"{root}/warmup.pth"
        strategy.save_checkpoint(path)
        strategy.save_checkpoint(f"{root}/warmup_async.pth", async_save=True)
        strategy.wait_for_checkpoint()
        strategy.resume(path)
        _barrier()
        _remove(path)
        _remove(f"{root}/warmup_async.pth")
    for r in range(repeats):
        order = list(places) if r % 2 == 0 else list(places)[::-1]
        for place in order:
            path = f"{places[place]}/sync_{r}.pth"
            runs.setdefault(f"save {place}", []).append(
                _timed(lambda: strategy.save_checkpoint(path))  # noqa: B023
            )
            _barrier()
            _evict(path)
            runs.setdefault(f"resume {place}", []).append(
                _timed(lambda: strategy.resume(path))  # noqa: B023
            )
            _barrier()
            _remove(path)
        for place in order:
            path = f"{places[place]}/async_{r}.pth"
            _barrier()
            start = time.perf_counter()
            strategy.save_checkpoint(path, async_save=True)
            strategy.wait_for_staging()  # as if the next optimizer step came at once
            runs.setdefault(f"async blocked {place}", []).append(time.perf_counter() - start)
            strategy.wait_for_checkpoint()
            runs.setdefault(f"async committed {place}", []).append(time.perf_counter() - start)
            _barrier()
            _remove(path)
    return _slowest(runs)


def _floors(local: str, url: str) -> dict[str, float]:
    """One upload of the checkpoint's files and one ranged read of them whole: the transfer
    alone (this rank's files)."""
    from shardwise.checkpoint.storage import read_ranges, upload_files

    files = [p for p in Path(local).rglob("*") if p.is_file()] if os.path.isdir(local) else []
    pairs = [(p, f"{url}/{p.relative_to(local).as_posix()}") for p in files] or [(Path(local), url)]
    start = time.perf_counter()
    upload_files(pairs)
    upload = time.perf_counter() - start
    pieces = [
        (u, first, min(p.stat().st_size, first + (16 << 20)))
        for p, u in pairs
        for first in range(0, p.stat().st_size, 16 << 20)
    ]
    start = time.perf_counter()
    read_ranges(pieces)
    return {"raw upload": upload, "raw ranged read": time.perf_counter() - start}


# ----------------------------------------------------------------------------- cases
def full_case(work_dir: str, bucket: str, size: str, repeats: int) -> dict[str, Any]:
    """One process: SingleDeviceStrategy saving to and resuming from the disk and S3."""
    from _models import build_gpt, loss_of, make_batches

    from shardwise.strategies import SingleDeviceStrategy

    quiet_shardwise_logs()
    strategy = SingleDeviceStrategy(work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=0)))
    model, wrapper = strategy.prepare(
        build_gpt(size), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )
    wrapper.update_params(loss_of(model, make_batches(1, 2, size)[0]))
    places = {"disk": f"{work_dir}/ckpt", "s3": f"{bucket}/full"}
    runs = _rounds(strategy, places, repeats)
    probe = f"{work_dir}/ckpt/probe.pth"
    strategy.save_checkpoint(probe)
    nbytes = path_bytes(probe)
    floors = _floors(probe, f"{bucket}/raw/probe.pth")
    return {"bytes": nbytes, "runs_s": runs, "floors_s": floors}


def sharded_case(work_dir: str, bucket: str, size: str, repeats: int) -> dict[str, Any]:
    """2 ranks: FSDPStrategy (sharded) saving to and resuming from the disk and S3; and what
    a resume from S3 asks of the server: its ranged reads, and what one costs there."""
    import torch.distributed as torch_dist
    from _models import build_gpt, loss_of, make_batches

    from shardwise.checkpoint import remote_read

    strategy = gpt_fsdp_strategy(work_dir, state_dict_cfg="sharded")
    model, wrapper = strategy.prepare(
        build_gpt(size), optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR))
    )
    wrapper.update_params(loss_of(model, make_batches(1, 2, size)[0]))
    places = {"disk": f"{work_dir}/ckpt", "s3": f"{bucket}/sharded"}
    runs = _rounds(strategy, places, repeats)
    probe = f"{work_dir}/ckpt/probe.pth"
    strategy.save_checkpoint(probe)
    nbytes = path_bytes(probe) if _rank() == 0 else 0
    url = f"{bucket}/sharded/probe.pth"
    strategy.save_checkpoint(url)
    reads: list[tuple[str, int, int]] = []
    ranged = remote_read.read_ranges

    def counted(requests):
        reads.extend(requests)
        return ranged(requests)

    remote_read.read_ranges = counted  # counts each rank's ranged reads of one resume
    strategy.resume(url)
    remote_read.read_ranges = ranged
    counts: list[Any] = [None, None]
    torch_dist.all_gather_object(counts, (len(reads), sum(e - s for _, s, e in reads)))
    server: dict[str, Any] = {"ranged reads of one resume, per rank (reads, bytes)": counts}
    server.update(_range_cost(f"{url}/__0_0.distcp", f"{url}/layout.json"))
    return {"bytes": nbytes, "runs_s": runs, "server": server}


def _range_cost(large: str, small: str) -> dict[str, float]:
    """Seconds of one 1 KiB ranged read of a large object and of a small one (the median of
    9): what the server spends per request on the object's size."""
    from shardwise.checkpoint.storage import object_info, read_ranges

    out = {}
    for url in (large, small):
        size = int(object_info(url)["size"])
        times = []
        for _ in range(9):
            start = time.perf_counter()
            read_ranges([(url, 0, min(size, 1024))])
            times.append(time.perf_counter() - start)
        out[f"1 KiB ranged read of a {size / 1e6:.2f} MB object, s"] = median(times)
    return out


# ----------------------------------------------------------------------------- driver
class _Server:
    """moto's S3 server on a free port of this process, and a bucket on it."""

    def __init__(self) -> None:
        import logging
        import socket
        import uuid

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        ).create_bucket(Bucket=self.bucket)
        self.env = {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}


def _derive(result: dict[str, Any]) -> dict[str, Any]:
    runs = result["runs_s"]
    med = {k: median(v) for k, v in runs.items()}
    out = {
        "bytes": result["bytes"],
        "median_s": med,
        "best_s": {k: min(v) for k, v in runs.items()},
        "ratios": {
            "save s3 / disk": ratio(med["save s3"], med["save disk"]),
            "resume s3 / disk": ratio(med["resume s3"], med["resume disk"]),
            "async blocked s3 / disk": ratio(med["async blocked s3"], med["async blocked disk"]),
            "async blocked / sync save, s3": ratio(med["async blocked s3"], med["save s3"]),
        },
    }
    if "server" in result:
        out["server"] = result["server"]
    if "floors_s" in result:
        out["floors_s"] = result["floors_s"]
        out["ratios"]["save s3 / raw upload"] = ratio(
            med["save s3"], result["floors_s"]["raw upload"]
        )
        out["ratios"]["resume s3 / raw ranged read"] = ratio(
            med["resume s3"], result["floors_s"]["raw ranged read"]
        )
    return out


def run(quick: bool = True) -> dict[str, Any]:
    from _models import count_params

    cfg = _sizes(quick)
    out: dict[str, Any] = {
        "model": cfg["size"],
        "model_params": count_params(cfg["size"]),
        "targets": TARGETS,
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        server = _Server()
    except ImportError as exc:
        return {"status": "not available", "reason": f"moto[server] is needed: {exc}"}
    bucket = f"s3://{server.bucket}"
    for case, world_size in (("full", 1), ("sharded", 2)):
        skipped = out_of_time(60)
        if skipped:
            out[case] = skipped
            continue
        work_dir = tempfile.mkdtemp(prefix="shardwise-bench-s3-")
        try:
            results = run_ranks(
                f"object_storage:{case}_case",
                world_size,
                dict(work_dir=work_dir, bucket=bucket, **cfg),
                timeout=900,
                env=server.env,
            )
            out[case] = {"status": "ok", **_derive(results[0])}
        except Exception as exc:  # noqa: BLE001 - one case's failure is its result
            out[case] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    server.server.stop()
    return out


if __name__ == "__main__":
    section_main("object_storage", run)
