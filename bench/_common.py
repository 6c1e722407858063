"""What every bench shares: machine facts, timing, memory high-water marks, rank launching.

Every figure is measured next to its baseline in the same run; :func:`interleaved_steps`
alternates the contenders in short blocks (ABBA order) so that drift of the machine (other
processes, thermal, page cache) falls on both alike.

Ranks are plain processes started here with the environment torchrun gives its workers
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); each runs
``bench/_rank.py``, which calls one function of a bench module and writes its result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for _path in (str(REPO / "src"), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

GB = 1e9
MB = 1e6


# ----------------------------------------------------------------------------- machine
def _cpuinfo_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """The facts a figure is meaningless without: CPU, cores, RAM, software, date, load."""
    import torch

    info: dict[str, Any] = {
        "cpu": _cpuinfo_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gib": round((_meminfo_kb("MemTotal") or 0) / 2**20, 1),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        import lightning

        info["lightning"] = lightning.__version__
    except ImportError:
        info["lightning"] = None
    try:
        out = subprocess.run(
            ["df", "-h", "--output=source,fstype,size", tempfile.gettempdir()],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()
        info["bench_disk"] = " ".join(out[-1].split()) if len(out) > 1 else None
    except (OSError, subprocess.SubprocessError):
        info["bench_disk"] = None
    return info


# ----------------------------------------------------------------------------- timing
def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def summary(xs: Sequence[float]) -> dict[str, float]:
    """Median, interquartile range and count of a list of seconds."""
    xs = sorted(xs)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = xs[0], xs[-1]
    return {"median_s": median(xs), "p25_s": q1, "p75_s": q3, "n": len(xs)}


def interleaved_steps(
    steps: dict[str, Callable[[int], None]],
    *,
    warmup: int,
    rounds: int,
    per_round: int,
    barrier: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Time ``steps[name](i)`` per call, alternating the contenders in blocks of
    ``per_round`` calls, in ABBA order (A B, B A, A B, ...), after ``warmup`` calls each.

    ``barrier`` (a collective) runs before each block so that all ranks enter it together.
    Returns every timed call's seconds, per contender.
    """
    names = list(steps)
    for name in names:
        for i in range(warmup):
            steps[name](i)
    times: dict[str, list[float]] = {name: [] for name in names}
    counter = warmup
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            if barrier is not None:
                barrier()
            fn = steps[name]
            for _ in range(per_round):
                start = time.perf_counter()
                fn(counter)
                times[name].append(time.perf_counter() - start)
                counter += 1
    return times


@contextmanager
def stopwatch():
    """``with stopwatch() as t: ...``; then ``t()`` is the seconds the block took."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b


def profile_call(fn: Callable[[], Any], top: int = 8) -> dict[str, Any]:
    """Run ``fn()`` under cProfile; return its seconds and where they went: the frames with
    the most self time, and the largest sub-calls by cumulative time (wrappers that take
    nearly all of it left out)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(fn)
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats

    def name(key: tuple[str, int, str]) -> str:
        filename, line, func = key
        for marker in ("/site-packages/", "/src/", "/lib/python3"):
            if marker in filename:
                filename = filename.split(marker, 1)[1]
                break
        return f"{filename}:{line}({func})" if line else func

    breakdown: dict[str, float] = {}
    for key, value in stats.items():
        category = _category(*key)
        breakdown[category] = breakdown.get(category, 0.0) + value[2]
    by_self = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    by_cum = sorted(
        (kv for kv in stats.items() if kv[1][3] < 0.95 * total),
        key=lambda kv: kv[1][3],
        reverse=True,
    )[:top]
    own = sorted(
        (kv for kv in stats.items() if "/shardwise/" in kv[0][0] and kv[1][3] < 0.95 * total),
        key=lambda kv: kv[1][3],
        reverse=True,
    )[:top]
    return {
        "profiled_s": total,
        "breakdown_s": dict(sorted(breakdown.items(), key=lambda kv: -kv[1])),
        "shardwise_cumulative": [{"frame": name(k), "s": v[3], "calls": v[1]} for k, v in own],
        "self": [{"frame": name(k), "s": v[2], "calls": v[1]} for k, v in by_self],
        "cumulative": [{"frame": name(k), "s": v[3], "calls": v[1]} for k, v in by_cum],
    }


def _category(filename: str, line: int, func: str) -> str:
    """Where a profiled frame's own time belongs, for a breakdown that adds up to the total."""
    if "/shardwise/" in filename and "/bench/" not in filename:
        return "shardwise's own code"
    if "torch/distributed/checkpoint" in filename:
        return "DCP (torch.distributed.checkpoint) Python"
    if "c10d" in func or "distributed_c10d" in filename or "wait" in func:
        return "collectives (incl. waiting for the other ranks)"
    if "fsync" in func:
        return "fsync"
    if "_hashlib" in func or "hashlib" in filename:
        return "hashing (hashlib)"
    if "serialization" in filename or "weights_only_unpickler" in filename or "record" in func:
        return "torch.save / torch.load (incl. their file I/O)"
    if "readinto" in func or "'read'" in func or "'write'" in func or func in ("read", "write"):
        return "file read/write"
    if "pickle" in func.lower() or "Pickler" in func or "Unpickler" in func:
        return "pickle"
    return "other (torch, Python)"


# ----------------------------------------------------------------------------- memory
def proc_status_kb(field: str) -> int | None:
    """A field of ``/proc/self/status`` in kB (``VmRSS``, ``VmHWM``), or ``None``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


#: For processes that measure memory: every allocation above 64 KiB gets its own mapping and
#: goes back to the OS when freed, so RSS follows live memory (glibc's default keeps freed
#: blocks, and a later allocation reusing them would not show in the high-water mark).
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark (``VmHWM``) to its current RSS (Linux >= 4.0:
    ``echo 5 > /proc/self/clear_refs``). Returns whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def drop_file_cache(path: str | os.PathLike[str]) -> None:
    """Evict a file's (or a directory's files') pages from the page cache, so that the next
    read comes from the disk (``posix_fadvise(DONTNEED)``; needs no privileges)."""
    path = Path(path)
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def path_bytes(path: str | os.PathLike[str]) -> int:
    path = Path(path)
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def disk_write_seconds(path: str | os.PathLike[str], nbytes: int, chunk: int = 8 << 20) -> float:
    """Seconds to write ``nbytes`` sequentially with ``os.write`` and ``fsync`` them: the
    floor any checkpoint writer of that size is held against."""
    buf = os.urandom(min(chunk, max(nbytes, 1)))
    view = memoryview(buf)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, view[: min(left, len(buf))])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- time budget
#: The driver gives each section a deadline (seconds since the epoch) in this variable; a
#: section skips the cases it has no time left for, and says so, instead of being killed.
DEADLINE_ENV = "SHARDWISE_BENCH_DEADLINE"


def time_left() -> float:
    """Seconds until this section's deadline (infinite when run alone)."""
    value = os.environ.get(DEADLINE_ENV)
    return float("inf") if not value else float(value) - time.time()


def out_of_time(need: float) -> dict[str, Any] | None:
    """A 'skipped' record when fewer than ``need`` seconds are left, else ``None``."""
    left = time_left()
    if left >= need:
        return None
    return {
        "status": "skipped",
        "reason": f"time budget of the run: {max(left, 0):.0f} s left, the case needs ~{need:.0f}",
    }


# ----------------------------------------------------------------------------- launching
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RankError(RuntimeError):
    """A rank of a bench failed or ran out of time; the message holds its stderr."""


def run_ranks(
    target: str,
    world_size: int,
    kwargs: dict[str, Any] | None = None,
    *,
    timeout: float = 600.0,
    threads: int = 1,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``module:function(**kwargs)`` on ``world_size`` fresh processes (one per rank,
    ``threads`` intra-op threads each, ``env`` added to their environment); return each
    rank's JSON result, rank by rank.

    A single rank gets no ``RANK``/``WORLD_SIZE`` (a plain one-process run).
    """
    timeout = max(1.0, min(timeout, time_left()))
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="shardwise-bench-ranks-"))
    procs = []
    for rank in range(world_size):
        rank_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        rank_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(BENCH)])
        rank_env.update(env or {})
        if world_size > 1:
            rank_env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size),
                GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        cmd = [
            sys.executable,
            str(BENCH / "_rank.py"),
            target,
            json.dumps(kwargs or {}),
            str(workdir / f"rank{rank}.json"),
            str(threads),
        ]
        err = open(workdir / f"rank{rank}.err", "w+")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, env=rank_env, stdout=err, stderr=err, cwd=REPO)
        procs.append((proc, err))
    deadline = time.monotonic() + timeout
    failed: list[str] = []
    try:
        pending = list(range(world_size))
        while pending:
            for rank in list(pending):
                code = procs[rank][0].poll()
                if code is None:
                    continue
                pending.remove(rank)
                if code != 0:
                    failed.append(_tail(procs[rank][1], f"rank {rank} exited with {code}"))
            if failed:
                time.sleep(3.0)  # the other ranks may report their own error
                break
            if time.monotonic() > deadline:
                failed.append(
                    f"ranks {pending} still running after {timeout:.0f} s (stopped: the time "
                    "limit of this case or of the run's budget)"
                )
                break
            time.sleep(0.05)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, err) in enumerate(procs):
        if (
            proc.returncode not in (0, None)
            and failed
            and not any(f.startswith(f"rank {rank} ") for f in failed)
        ):
            failed.append(_tail(err, f"rank {rank} exited with {proc.returncode}"))
        err.close()
    try:
        if failed:
            raise RankError(f"{target} on {world_size} rank(s) failed:\n" + "\n".join(failed))
        return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(world_size)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _tail(err_file, head: str, chars: int = 4000) -> str:
    err_file.flush()
    err_file.seek(0)
    text = err_file.read()
    return f"--- {head} ---\n{text[-chars:]}"


def in_rank_process() -> dict[str, int]:
    """``rank`` and ``world_size`` of this process (1 rank when launched alone)."""
    return {
        "rank": int(os.environ.get("RANK", 0)),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
    }


def init_gloo() -> None:
    """The default process group over gloo for a rank :func:`run_ranks` started."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")


def dcp_save(model, optimizer, path: str | os.PathLike[str]) -> None:
    """Raw PyTorch's sharded save: DCP of ``get_state_dict(model, optimizer)``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))


def dcp_load(model, optimizer, path: str | os.PathLike[str]) -> None:
    """Raw PyTorch's sharded load: DCP into ``get_state_dict``'s dicts, then set them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def fully_shard_blocks(model, block_cls, mesh=None, **kwargs: Any) -> None:
    """``fully_shard`` every ``block_cls`` submodule, then the root (torchtitan's recipe), on
    ``mesh`` (default: all ranks); ``kwargs`` go to ``fully_shard`` (e.g. ``mp_policy``)."""
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, block_cls):
            fully_shard(module, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)


def gpt_fsdp_strategy(work_dir: str, **kwargs: Any):
    """shardwise's ``FSDPStrategy`` for a bench rank: the GPT's blocks sharded, seed 0, quiet
    logs, the process group up (gloo on several ranks). ``kwargs`` go to ``FSDPStrategy``;
    ``model_wrapper`` entries are added to the block policy."""
    from _models import block_class

    quiet_shardwise_logs()
    init_gloo()
    FSDPStrategy, why = fsdp_strategy_class()
    if FSDPStrategy is None:
        raise RuntimeError(f"FSDPStrategy is not available: {why}")
    wrapper = {"auto_wrap_policy": {block_class()}, **kwargs.pop("model_wrapper", {})}
    return FSDPStrategy(
        work_dir=work_dir,
        env_kwargs=dict(randomness=dict(seed=0)),
        model_wrapper=wrapper,
        **kwargs,
    )


def fsdp_strategy_class():
    """``shardwise.strategies.FSDPStrategy``, or ``None`` with the reason it cannot import."""
    try:
        from shardwise.strategies import FSDPStrategy
    except Exception as exc:  # noqa: BLE001 - any failure means: not available
        return None, f"{type(exc).__name__}: {exc}"
    return FSDPStrategy, None


def quiet_shardwise_logs() -> None:
    """Keep the strategies' INFO lines out of the benches' output (warnings stay)."""
    import logging

    logging.getLogger("shardwise").setLevel(logging.WARNING)


# ----------------------------------------------------------------------------- section CLI
def section_main(name: str, run: Callable[[bool], dict[str, Any]]) -> None:
    """``python bench/<section>.py [--quick|--full] [--out FILE]``: run, print JSON."""
    parser = argparse.ArgumentParser(description=f"shardwise bench: {name}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the `make bench` sizes (default)")
    mode.add_argument("--full", action="store_true", help="the large sizes (1B parameters)")
    parser.add_argument("--out", help="also write the JSON result here")
    args = parser.parse_args()
    start = time.perf_counter()
    try:
        result = run(not args.full)
        result.setdefault("status", "ok")
    except Exception:  # noqa: BLE001 - a section's failure is its result
        result = {"status": "error", "error": traceback.format_exc()}
    result["section"] = name
    result["mode"] = "full" if args.full else "quick"
    result["wall_s"] = round(time.perf_counter() - start, 1)
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
