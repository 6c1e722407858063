"""Planning cost of sharded saves and resumes as a function of ranks, and a model past this
machine (issue 20: "a scaling figure past this machine").

DCP plans every save centrally: each rank makes a local plan (one write item per tensor or
shard), rank 0 gathers all of them (``gather_object``), deduplicates them and builds the global
metadata (one chunk entry per shard: N x T entries for T sharded tensors on N ranks), and
scatters the plans back; after the writes, rank 0 gathers every rank's write results, writes
``.metadata`` and broadcasts it. A resume reads ``.metadata`` on every rank (shardwise's
``read_sharded_meta`` and DCP's load each read it once), plans locally against it, and gathers
and scatters load plans through rank 0. shardwise's commit adds three ``all_gather_object``s.

The state here is a 1B-parameter Llama's layout at tiny bytes, so that I/O does not dominate:
146 parameter tensors (16 layers x 9, the embedding and the final norm), each a DTensor
sharded on dim 0 over all ranks, as FSDP2 holds them, plus AdamW's ``exp_avg``/``exp_avg_sq``
(sharded) and ``step`` (a replicated 0-dim tensor per parameter, as FSDP2's optimizer keeps it):
584 DCP entries, 438 of them sharded. Each phase is timed by wrapping DCP's planner methods and
the object collectives DCP and the commit call (``torch.distributed.gather_object`` & co.), on
every rank: wall time (the collectives' includes waiting for the slowest rank) and the thread's
CPU time (not inflated by oversubscription: 8 ranks on 2 cores wait for the CPU, they do not
burn more of it), and the pickled bytes each object collective moves.

    python bench/planning.py --quick   # 1, 2 and 4 ranks (make bench)
    python bench/planning.py --full    # 1, 2, 4 and 8 ranks, and half the tensors at 4 ranks
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    in_rank_process,
    median,
    out_of_time,
    run_ranks,
    section_main,
)

#: Llama-3.2-1B: 16 layers x (q, k, v, o, gate, up, down, 2 norms) + embedding + final norm
#: (the output projection is tied to the embedding).
LLAMA_1B_PARAMS = 16 * 9 + 2
ENTRIES_PER_PARAM = 4  # the parameter, exp_avg, exp_avg_sq (sharded) and step (replicated)
PREDICT_AT = (1024, 4096)
#: Assumed per-rank cost of one message into or out of rank 0 on a real cluster's gather
#: (gloo's gather and scatter are linear at the root), and the sensitivity range shown.
LATENCY_US = (10.0, 50.0, 200.0)
BANDWIDTH_GBPS = 10.0  # GB/s into rank 0 (a 100 Gb/s NIC)


# ----------------------------------------------------------------------------- one rank
class _Recorder:
    """Every timed call of the current operation, in order: (name, wall s, cpu s, bytes, gc s)
    where gc is the time Python's garbage collector ran inside the call."""

    def __init__(self) -> None:
        import gc

        self.events: list[tuple[str, float, float, int, float]] = []
        self.keep_gathered = False
        self.gathered: Any = None
        self.gc_s = 0.0
        self._gc_start = 0.0

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                self._gc_start = time.thread_time()
            else:
                self.gc_s += time.thread_time() - self._gc_start

        gc.callbacks.append(on_gc)

    def wrap(self, owner: Any, attr: str, name: str, size=None) -> None:
        original = getattr(owner, attr)
        recorder = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            nbytes = size(args, kwargs) if size else 0
            wall, cpu, gc_s = time.perf_counter(), time.thread_time(), recorder.gc_s
            out = original(*args, **kwargs)
            recorder.events.append(
                (
                    name,
                    time.perf_counter() - wall,
                    time.thread_time() - cpu,
                    nbytes,
                    recorder.gc_s - gc_s,
                )
            )
            if name == "gather_object" and recorder.keep_gathered:
                gathered = kwargs.get("object_gather_list")
                if gathered is not None and recorder.gathered is None:
                    recorder.gathered = list(gathered)
            return out

        setattr(owner, attr, timed)


def _pickled(obj: Any) -> int:
    return len(pickle.dumps(obj))


def _instrument() -> _Recorder:
    import torch.distributed as dist
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        DefaultSavePlanner,
    )

    from shardwise.checkpoint import sharded
    from shardwise.checkpoint.safe_dcp import SafeFileSystemReader

    rec = _Recorder()
    for cls, prefix in ((DefaultSavePlanner, "save"), (DefaultLoadPlanner, "load")):
        for method in ("set_up_planner", "create_local_plan", "create_global_plan", "finish_plan"):
            rec.wrap(cls, method, f"{prefix}.{method}")
    rec.wrap(sharded._RecordingWriter, "write_data", "write_data")
    rec.wrap(sharded._RecordingWriter, "finish", "write_metadata")
    rec.wrap(SafeFileSystemReader, "read_metadata", "read_metadata")
    rec.wrap(SafeFileSystemReader, "read_data", "read_data")
    rec.wrap(
        dist,
        "gather_object",
        "gather_object",
        lambda a, k: _pickled(k["obj"] if "obj" in k else a[0]),
    )
    rec.wrap(
        dist,
        "scatter_object_list",
        "scatter_object_list",
        lambda a, k: sum(map(_pickled, k.get("scatter_object_input_list") or [])),
    )
    rec.wrap(
        dist,
        "broadcast_object_list",
        "broadcast_object_list",
        lambda a, k: sum(map(_pickled, k.get("object_list", a[0] if a else []))),
    )
    rec.wrap(
        dist,
        "all_gather_object",
        "all_gather_object",
        lambda a, k: _pickled(k["obj"] if "obj" in k else a[1]),
    )
    return rec


def _state(params: int, rank: int, world: int, mesh: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor, Shard

    rows, cols = 4, 8  # per rank: tiny bytes, the layout is what costs

    def sharded() -> Any:
        local = torch.randn(rows, cols)
        return DTensor.from_local(
            local,
            mesh,
            [Shard(0)],
            run_check=False,
            shape=torch.Size((rows * world, cols)),
            stride=(cols, 1),
        )

    names = [f"layers.{i}.weight" for i in range(params)]
    model = {n: sharded() for n in names}
    optim = {
        n: {"step": torch.tensor(1.0), "exp_avg": sharded(), "exp_avg_sq": sharded()} for n in names
    }
    groups = [{"lr": 1e-3, "params": names}]
    return {"state_dict": model, "optimizer": {"state": optim, "param_groups": groups}}


def _phases(events: list[tuple[str, float, float, int, float]], labels: dict[str, list[str]]):
    """{label: {wall, cpu, bytes, gc}}; the n-th call of a function gets ``labels[name][n]``."""
    seen: dict[str, int] = {}
    out: dict[str, dict[str, float]] = {}
    for name, wall, cpu, nbytes, gc_s in events:
        i = seen.get(name, 0)
        seen[name] = i + 1
        names = labels.get(name, [])
        label = names[i] if i < len(names) else f"{name}#{i + 1}"
        slot = out.setdefault(label, {"wall": 0.0, "cpu": 0.0, "bytes": 0, "gc": 0.0})
        slot["wall"] += wall
        slot["cpu"] += cpu
        slot["bytes"] += nbytes
        slot["gc"] += gc_s
    return out


SAVE_LABELS = {
    "save.set_up_planner": ["local plan"],
    "save.create_local_plan": ["local plan"],
    "gather_object": ["gather plans", "gather write results"],
    "save.create_global_plan": ["global plan (rank 0)"],
    "scatter_object_list": ["scatter plans"],
    "save.finish_plan": ["finish plan"],
    "write_data": ["write data (I/O)"],
    "write_metadata": ["write .metadata (rank 0)"],
    "broadcast_object_list": ["broadcast metadata"],
    "all_gather_object": ["commit: begin", "commit: outcomes", "commit: committed"],
}
LOAD_LABELS = {
    "read_metadata": ["read .metadata (shardwise)", "read .metadata (DCP)"],
    "load.set_up_planner": ["local plan"],
    "load.create_local_plan": ["local plan"],
    "gather_object": ["gather plans"],
    "load.create_global_plan": ["global plan (rank 0)"],
    "scatter_object_list": ["scatter plans"],
    "load.finish_plan": ["finish plan"],
    "read_data": ["read data (I/O)"],
    "all_gather_object": ["agree read"],
}


def rank_run(params: int, repeats: int, workdir: str) -> dict[str, Any]:
    """One rank: ``repeats`` saves without plan caching and with it (alternating, the first
    cached save fills the cache), each through shardwise's commit protocol, then ``repeats``
    resumes of the last one; every phase's wall/CPU time and bytes."""
    import torch
    import torch.distributed as dist
    from _common import quiet_shardwise_logs
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from shardwise.checkpoint.commit import CheckpointCommit
    from shardwise.checkpoint.sharded import (
        load_sharded_tensors,
        read_sharded_meta,
        save_sharded_checkpoint,
    )

    quiet_shardwise_logs()
    info = in_rank_process()
    rank, world = info["rank"], info["world_size"]
    if world == 1:  # one rank in a process group too, so that N=1 runs the same collectives
        dist.init_process_group("gloo", init_method=f"file://{workdir}/pg", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    state = _state(params, rank, world, mesh)
    rec = _instrument()
    root = Path(workdir)

    def _like(shape: torch.Size, dtype: torch.dtype) -> Any:
        """The tensor a stored tensor loads into: this rank's shard, as FSDP2 holds it."""
        if len(shape) == 0:
            return torch.empty(shape, dtype=dtype)
        local = torch.empty((shape[0] // world, *shape[1:]), dtype=dtype)
        return DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=shape, stride=(shape[1], 1)
        )

    results: dict[str, list[dict[str, Any]]] = {"nocache": [], "cache_cold": [], "cache": []}
    last = None
    # one save and one load first, unrecorded: imports, first-call costs
    warm = root / "warmup"
    with CheckpointCommit(warm, is_dir=True) as staging:
        save_sharded_checkpoint(state, staging, plan_cache=None, central_plan=True)
    load_sharded_tensors(warm, *read_sharded_meta(warm), lambda p, s, d: _like(s, d))
    for i in range(repeats + 1):
        order = ("nocache", "cache") if i % 2 == 0 else ("cache", "nocache")
        for mode in order:
            if mode == "nocache" and i == repeats:
                continue
            dist.barrier()
            path = root / f"ckpt_{mode}_{i}"
            rec.events.clear()
            rec.keep_gathered = rank == 0 and mode == "nocache" and i == 0
            start = time.perf_counter()
            commit = CheckpointCommit(path, is_dir=True)
            with commit as staging:
                t0 = time.perf_counter()
                written = save_sharded_checkpoint(
                    state,
                    staging,
                    plan_cache=None if mode == "nocache" else "bench",
                    central_plan=True,  # DCP's planning through rank 0 (section 8)
                )
                dcp_wall = time.perf_counter() - t0
                commit.record(*written)
            total = time.perf_counter() - start
            rec.keep_gathered = False
            ph = _phases(rec.events, SAVE_LABELS)
            key = "cache_cold" if mode == "cache" and i == 0 else mode
            results[key].append({"total": total, "save_call": dcp_wall, "phases": ph})
            last = path
    metadata_bytes = (last / ".metadata").stat().st_size

    loads = []
    for _ in range(repeats):
        dist.barrier()
        rec.events.clear()
        start = time.perf_counter()
        skeleton, specs = read_sharded_meta(last)
        load_sharded_tensors(last, skeleton, specs, lambda p, s, d: _like(s, d))
        total = time.perf_counter() - start
        loads.append({"total": total, "phases": _phases(rec.events, LOAD_LABELS)})

    gathered = {}
    if rank == 0 and rec.gathered is not None:
        import tracemalloc

        blob = pickle.dumps(rec.gathered)
        tracemalloc.start()
        plans = pickle.loads(blob)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del plans
        gathered = {"pickled_bytes": len(blob), "unpickled_bytes": held}
    return {
        "rank": rank,
        "world_size": world,
        "entries": params * ENTRIES_PER_PARAM,
        "saves": results,
        "loads": loads,
        "metadata_bytes": metadata_bytes,
        "gathered_plans": gathered,
    }


# ----------------------------------------------------------------------------- driver
def _median_phases(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    labels = {label for r in runs for label in r["phases"]}
    out = {}
    for label in labels:
        vals = [r["phases"][label] for r in runs if label in r["phases"]]
        out[label] = {k: median([v[k] for v in vals]) for k in ("wall", "cpu", "bytes", "gc")}
    return out


#: Phases run by rank 0 alone or at the root of a collective (coordination), and by every
#: rank on its own (local); the rest is I/O or the commit's collectives.
SAVE_ROOT = (
    "gather plans",
    "global plan (rank 0)",
    "scatter plans",
    "gather write results",
    "write .metadata (rank 0)",
    "broadcast metadata",
)
SAVE_LOCAL = ("local plan", "finish plan")
LOAD_ROOT = ("gather plans", "global plan (rank 0)", "scatter plans")
LOAD_LOCAL = ("read .metadata (shardwise)", "read .metadata (DCP)", "local plan")
SAVE_PLANNING = SAVE_ROOT + SAVE_LOCAL
LOAD_PLANNING = LOAD_ROOT + LOAD_LOCAL + ("finish plan", "agree read")
#: Steps of each operation whose latency grows linearly with N on gloo (a gather or scatter at
#: the root, or a ring all-gather; ``gather_object`` is an all-gather of sizes and a gather):
#: save: 2 gather_object (plans, write results) x 2 + 1 scatter = 5; commit: 3
#: all_gather_object x 2 = 6; load: 1 gather_object x 2 + 1 scatter + the final all_gather x 2
#: = 5. Broadcasts are trees (log N), left out.
LINEAR_STEPS = {"save": 5, "commit": 6, "load": 5}


def _cpu(phases: dict[str, dict[str, float]], names: tuple[str, ...], key: str = "cpu") -> float:
    return sum(phases[n][key] for n in names if n in phases)


def _local(ranks: list[dict[str, Any]], runs_of: Any, names: tuple[str, ...]) -> dict[str, float]:
    """Each rank's median CPU in its own planning phases: the median rank's, the slowest's."""
    per_rank = sorted(median([_cpu(r["phases"], names) for r in runs_of(rk)]) for rk in ranks)
    gc_s = [median([_cpu(r["phases"], names, "gc") for r in runs_of(rk)]) for rk in ranks]
    return {
        "local_cpu_s": median(per_rank),
        "local_cpu_max_s": per_rank[-1],
        "local_gc_s": median(gc_s),
    }


def _summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of operation: rank 0's median phases, the CPU time of rank 0's coordination
    and of the slowest rank's local planning, and the planning wall time (the operation less
    its I/O, on rank 0)."""
    r0 = ranks[0]
    out: dict[str, Any] = {
        "world_size": r0["world_size"],
        "entries": r0["entries"],
        "metadata_bytes": r0["metadata_bytes"],
        "gathered_plans": r0["gathered_plans"],
    }
    for kind in ("nocache", "cache_cold", "cache"):
        runs = r0["saves"][kind]
        phases = _median_phases(runs)
        io = phases.get("write data (I/O)", {}).get("wall", 0.0)
        save_call = median([r["save_call"] for r in runs])
        commit = {k: v for k, v in phases.items() if k.startswith("commit")}
        out[f"save_{kind}"] = {
            "phases_rank0": phases,
            "save_call_s": save_call,
            "write_io_s": io,
            "total_s": median([r["total"] for r in runs]),
            # the timed phases but the writes (the rest of the call is shardwise's split of
            # the state and this bench's own byte counting)
            "planning_s": sum(v["wall"] for k, v in phases.items() if k in SAVE_PLANNING),
            "root_cpu_s": _cpu(phases, SAVE_ROOT),
            "root_gc_s": _cpu(phases, SAVE_ROOT, "gc"),
            **_local(ranks, lambda rk, kind=kind: rk["saves"][kind], SAVE_LOCAL),
            "commit_wall_s": sum(v["wall"] for v in commit.values()),
            "commit_cpu_s": sum(v["cpu"] for v in commit.values()),
            "commit_bytes_per_rank": sum(v["bytes"] for v in commit.values()),
            "plan_bytes_per_rank": [
                median([r["phases"]["gather plans"]["bytes"] for r in rk["saves"][kind]])
                for rk in ranks
            ],
            "n": len(runs),
        }
    phases = _median_phases(r0["loads"])
    io = phases.get("read data (I/O)", {}).get("wall", 0.0)
    total = median([r["total"] for r in r0["loads"]])
    out["load"] = {
        "phases_rank0": phases,
        "total_s": total,
        "read_io_s": io,
        "planning_s": sum(v["wall"] for k, v in phases.items() if k in LOAD_PLANNING),
        "root_cpu_s": _cpu(phases, LOAD_ROOT),
        "root_gc_s": _cpu(phases, LOAD_ROOT, "gc"),
        **_local(ranks, lambda rk: rk["loads"], LOAD_LOCAL),
        "plan_bytes_per_rank": median([r["phases"]["gather plans"]["bytes"] for r in r0["loads"]]),
        "n": len(r0["loads"]),
    }
    return out


def _fit(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Least squares y = a + b x, with the residuals."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    res = [y - (a + b * x) for x, y in zip(xs, ys)]
    return {"a": a, "b": b, "residuals": res}


#: The quantities fitted against N (seconds, or bytes), and where they are read from.
FITTED = {
    "save_root_cpu": lambda c: c["save_nocache"]["root_cpu_s"],
    "save_root_cpu_no_gc": lambda c: (
        c["save_nocache"]["root_cpu_s"] - c["save_nocache"]["root_gc_s"]
    ),
    "save_local_cpu": lambda c: c["save_nocache"]["local_cpu_s"],
    "save_plan_wall": lambda c: c["save_nocache"]["planning_s"],
    "cached_root_cpu": lambda c: c["save_cache"]["root_cpu_s"],
    "cached_local_cpu": lambda c: c["save_cache"]["local_cpu_s"],
    "cached_plan_wall": lambda c: c["save_cache"]["planning_s"],
    "commit_cpu": lambda c: c["save_nocache"]["commit_cpu_s"],
    "commit_wall": lambda c: c["save_nocache"]["commit_wall_s"],
    "load_root_cpu": lambda c: c["load"]["root_cpu_s"],
    "load_local_cpu": lambda c: c["load"]["local_cpu_s"],
    "load_local_cpu_no_gc": lambda c: c["load"]["local_cpu_s"] - c["load"]["local_gc_s"],
    "load_plan_wall": lambda c: c["load"]["planning_s"],
    "plan_bytes_gathered": lambda c: sum(c["save_nocache"]["plan_bytes_per_rank"]),
    "load_plan_bytes_gathered": lambda c: c["load"]["plan_bytes_per_rank"] * c["world_size"],
    "gathered_plans_memory": lambda c: c["gathered_plans"].get("unpickled_bytes", 0),
    "metadata_bytes": lambda c: c["metadata_bytes"],
}


def model(cases: dict[str, Any]) -> dict[str, Any]:
    """Fit y = a + b N to each quantity over the measured world sizes (the same tensors), and
    predict at PREDICT_AT: CPU (fitted) plus, for a real cluster, LINEAR_STEPS x N x the
    assumed per-rank latency and the bytes through rank 0 at the assumed bandwidth."""
    ns = sorted(int(n) for n in cases)
    fits = {}
    for name, get in FITTED.items():
        ys = [float(get(cases[str(n)])) for n in ns]
        fit = _fit([float(n) for n in ns], ys)
        fit["measured"] = ys
        fit["predicted"] = {str(p): fit["a"] + fit["b"] * p for p in PREDICT_AT}
        fits[name] = fit
    pred: dict[str, Any] = {}
    for n in PREDICT_AT:
        f = {k: v["a"] + v["b"] * n for k, v in fits.items()}
        # bytes through rank 0 in a save: the plans in and out, and .metadata out
        save_bytes = 2 * f["plan_bytes_gathered"] + f["metadata_bytes"]
        cached_bytes = f["metadata_bytes"]
        cpu = {
            "save": f["save_root_cpu"] + f["save_local_cpu"],
            "cached save": f["cached_root_cpu"] + f["cached_local_cpu"],
            "commit": f["commit_cpu"],
            "load": f["load_root_cpu"] + f["load_local_cpu"],
        }
        steps = {"save": 5, "cached save": 5, "commit": 6, "load": 5}
        nbytes = {"save": save_bytes, "cached save": cached_bytes, "commit": 0.0}
        nbytes["load"] = 2 * f["load_plan_bytes_gathered"]  # the plans in and out
        pred[str(n)] = {
            op: {
                "cpu_s": cpu[op],
                "bytes_via_rank0": nbytes[op],
                "total_s": {
                    str(lat): cpu[op]
                    + steps[op] * n * lat * 1e-6
                    + nbytes[op] / (BANDWIDTH_GBPS * 1e9)
                    for lat in LATENCY_US
                },
            }
            for op in cpu
        }
        pred[str(n)]["metadata_bytes"] = f["metadata_bytes"]
        pred[str(n)]["plan_bytes_gathered"] = f["plan_bytes_gathered"]
        pred[str(n)]["gathered_plans_memory"] = f["gathered_plans_memory"]
    return {"ranks": ns, "fits": fits, "predicted": pred, "linear_steps": LINEAR_STEPS}


def run(quick: bool) -> dict[str, Any]:
    params = LLAMA_1B_PARAMS
    worlds = [1, 2, 4] if quick else [1, 2, 4, 8]
    repeats = 3 if quick else 5
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    cases: dict[str, Any] = {}
    skipped: dict[str, Any] = {}
    for world in worlds:
        need = 6 + 2.5 * world
        if (skip := out_of_time(need)) is not None:
            skipped[str(world)] = skip
            continue
        with tempfile.TemporaryDirectory(prefix="shardwise-planning-", dir=shm) as tmp:
            ranks = run_ranks(
                "planning:rank_run",
                world,
                dict(params=params, repeats=repeats, workdir=tmp),
                timeout=240,
            )
        cases[str(world)] = _summarise(ranks)
    extra = {}
    if not quick:  # the same world at half the tensors: does the per-rank cost scale with T?
        with tempfile.TemporaryDirectory(prefix="shardwise-planning-", dir=shm) as tmp:
            ranks = run_ranks(
                "planning:rank_run",
                4,
                dict(params=params // 2, repeats=repeats, workdir=tmp),
                timeout=240,
            )
        extra["half_tensors_4_ranks"] = _summarise(ranks)
    out = {
        "params": params,
        "entries": params * ENTRIES_PER_PARAM,
        "sharded_entries": params * 3,
        "repeats": repeats,
        "worlds": worlds,
        "cases": cases,
        "skipped": skipped,
        "storage": shm or tempfile.gettempdir(),
        "cpu_count": os.cpu_count(),
        "assumed_latency_us": list(LATENCY_US),
        "assumed_bandwidth_gbps": BANDWIDTH_GBPS,
        **extra,
    }
    if len(cases) >= 2:
        out["model"] = model(cases)
    return out


if __name__ == "__main__":
    section_main("planning", run)
