"""Planning at 1,024 and 4,096 ranks, measured by running every rank's planning code in one
process (issue 27: "measure at 4,096 ranks, not only fit").

No tensors and no process group: each simulated rank's state is the layout of bench/planning.py
(the 1B Llama under FSDP2 + AdamW: 146 parameters, each a DTensor sharded on dim 0 over all
ranks, its ``exp_avg``/``exp_avg_sq`` likewise, and a replicated 0-dim ``step``: 584 entries,
438 sharded) built from meta-device tensors on a ``DeviceMesh`` made without a backend
(``_init_backend=False, _rank=r``), which DTensor and DCP's planners accept as they would a
real one. Then, with each figure the thread's CPU time:

* **shardwise (planning.py)**, every rank: ``plan_save`` (its write items and metadata
  fragment), the fragment pickled as DCP's writer pickles it (with a write result per chunk,
  records of the real size), rank 0 also ``layout.json``. Nothing is sent or received while
  planning. Resume, for rank 0, rank 1, an ordinary rank (N/2) and the last rank: read
  ``layout.json``, find the fragments whose chunks overlap the rank's shards, read (unpickle)
  those, check coverage and run DCP's ``create_local_plan`` against them; also on N/2 ranks
  (a reshard).
* **DCP's default planner**, the same state: every rank's ``create_local_plan`` and its plan
  pickled (``gather_object``); on rank 0 the N plans unpickled, ``create_global_plan`` (dedup,
  metadata), the N plans pickled back (scatter), the N write results unpickled and
  ``.metadata`` pickled (``finish``) and broadcast, each other rank unpickling it. Resume (the
  sampled ranks): ``.metadata`` unpickled twice (shardwise's ``read_sharded_meta`` and DCP's
  load), ``create_local_plan`` against it and the plan pickled; rank 0's gather of N load
  plans is timed on N copies of rank N/2's pickled plan (every rank's is of that size).

What it leaves out (the same for both): the commit's agreement (section 8 fits its CPU at
0.2 ms per rank: 1 s at 4,096), ``meta.pt``, the data I/O, the network.

    python bench/planning_sim.py --quick   # 128 ranks (make bench)
    python bench/planning_sim.py --full    # 1,024 and 4,096 ranks
"""

from __future__ import annotations

import gc
import io
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import out_of_time, section_main

PARAMS = 16 * 9 + 2  # Llama-3.2-1B's parameter tensors (as bench/planning.py)
ROWS, COLS = 4, 8  # per rank, as bench/planning.py: tiny bytes, the layout is what costs
SAMPLED = ("rank 0", "rank 1", "ordinary rank (N/2)", "last rank")
TARGET_S = 5.0
TARGET_READ_BYTES = 1 << 20


def _names() -> list[str]:
    return [f"layers.{i}.weight" for i in range(PARAMS)]


def _mesh(world: int, rank: int) -> Any:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(world), _init_backend=False, _rank=rank)


def _state(
    world: int, rank: int, mesh: Any = None, device: str = "meta", saved_on: int | None = None
) -> dict[str, Any]:
    """Simulated rank ``rank``'s DCP entries (as sharded.py flattens them): meta tensors for
    a save, tiny CPU tensors for a resume (DCP's load planner materialises meta targets)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    mesh = mesh if mesh is not None else _mesh(world, rank)
    rows = ROWS * (saved_on or world)  # the global shape of the save (resharded: the same)
    shape, stride = torch.Size((rows, COLS)), (COLS, 1)

    def sharded() -> Any:
        local = torch.empty(rows // world, COLS, device=device)
        return DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=shape, stride=stride
        )

    state: dict[str, Any] = {}
    for name in _names():
        state[f"state_dict/{name}"] = sharded()
        state[f"optimizer/state/{name}/exp_avg"] = sharded()
        state[f"optimizer/state/{name}/exp_avg_sq"] = sharded()
        state[f"optimizer/state/{name}/step"] = torch.empty((), device=device)
    return state


def _record_length() -> int:
    """The size of DCP's torch.save record of one (4, 8) float32 shard."""
    import torch

    buffer = io.BytesIO()
    torch.save(torch.zeros(ROWS, COLS), buffer)
    return buffer.tell()


class _Clock:
    """Thread CPU time of a block, accumulated under a name."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str):
        clock = self

        class _Block:
            def __enter__(self) -> None:
                self.start = time.thread_time()

            def __exit__(self, *exc: Any) -> None:
                clock.cpu[name] = clock.cpu.get(name, 0.0) + time.thread_time() - self.start

        return _Block()


def _with_storage(items: list[Any], rank: int, length: int) -> dict[Any, Any]:
    """The write results DCP's writer returns for ``items`` (one record each)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return {
        item.index: _StorageInfo(f"__{rank}_0.distcp", i * length, length)
        for i, item in enumerate(items)
    }


# ----------------------------------------------------------------------------- one world
def simulate(world: int, samples: dict[str, int], workdir: Path) -> dict[str, Any]:
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        DefaultSavePlanner,
    )
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.storage import WriteResult

    from shardwise.checkpoint import planning
    from shardwise.checkpoint.dcp_index import load_dcp_metadata

    length = _record_length()
    sampled_ranks = set(samples.values())
    ours: dict[int, dict[str, float]] = {}
    theirs: dict[int, dict[str, float]] = {}
    ours_fragments: dict[int, bytes] = {}  # pickled fragments the sampled resumes read
    dcp_plans: list[bytes] = []
    dcp_results: list[bytes] = []
    layout_json = b""
    fragment_bytes: list[int] = []
    build_s = 0.0
    gc.collect()
    for rank in range(world):
        t0 = time.perf_counter()
        state = _state(world, rank)
        build_s += time.perf_counter() - t0
        clock = _Clock()
        # --- shardwise: plan alone, pickle the fragment as FileSystemWriter.finish does
        with clock("plan"):
            plan, fragment = planning.plan_save(state, rank)
        fragment.storage_data = _with_storage(plan.items, rank, length)
        with clock("fragment"):
            blob = pickle.dumps(fragment)
        fragment_bytes.append(len(blob))
        if rank == 0:
            with clock("layout"):
                layout_json = planning.describe(state, world).to_json().encode()
        ours[rank] = {"cpu": sum(clock.cpu.values()), "sent": 0, "received": 0, **clock.cpu}
        ours_fragments[rank] = blob  # kept until the resume knows which ones it needs
        # --- DCP's default planner: local plan, pickled for the gather
        clock = _Clock()
        with clock("local plan"):
            planner = DefaultSavePlanner()
            planner.set_up_planner(state, is_coordinator=rank == 0)
            local = planner.create_local_plan()
        with clock("pickle plan"):
            dcp_plans.append(pickle.dumps(local))
        theirs[rank] = {"local": sum(clock.cpu.values()), "sent": len(dcp_plans[-1])}
        del state, plan, fragment, planner, local
    # which fragments the sampled resumes read (the others are dropped)
    layout = planning.SaveLayout.from_json(layout_json.decode())
    resume_cases = dict(samples)
    half = max(world // 2, 1)
    needs: dict[str, list[int]] = {}
    for label, rank in resume_cases.items():
        needs[label] = planning.fragments_for(layout, planning.wanted_chunks(_state(world, rank)))
    reshard_label = f"rank 1 of {half} (resharded)"
    needs[reshard_label] = planning.fragments_for(
        layout, planning.wanted_chunks(_state(half, min(1, half - 1), saved_on=world))
    )
    keep = {r for ranks in needs.values() for r in ranks}
    directory = workdir / f"ckpt{world}"
    directory.mkdir()
    (directory / planning.LAYOUT_FILE).write_bytes(layout_json)
    for r in keep:
        (directory / planning.fragment_name(r)).write_bytes(ours_fragments[r])
    ours_fragments.clear()
    gc.collect()

    # --- DCP: rank 0's coordinator phases on the N gathered plans
    r0 = _Clock()
    with r0("unpickle plans"):
        plans = [pickle.loads(b) for b in dcp_plans]
    gathered_bytes = sum(map(len, dcp_plans))
    del dcp_plans
    with r0("global plan"):
        global_plans, metadata = DefaultSavePlanner().create_global_plan(plans)
    del plans
    with r0("pickle scatter"):
        scattered = [pickle.dumps(p) for p in global_plans]
    scatter_bytes = sum(map(len, scattered))
    plan_bytes_to_rank = {r: len(scattered[r]) for r in sampled_ranks}
    del scattered
    # every rank's write results (one record per write item), gathered and unpickled at rank 0
    for rank, p in enumerate(global_plans):
        results = [
            WriteResult(index=i.index, size_in_bytes=length, storage_data=s)
            for i, s in zip(p.items, _with_storage(p.items, rank, length).values())
        ]
        dcp_results.append(pickle.dumps(results))
    del global_plans
    results_bytes = sum(map(len, dcp_results))
    with r0("unpickle write results"):
        all_results = [pickle.loads(b) for b in dcp_results]
    del dcp_results
    with r0("write .metadata"):
        writer = FileSystemWriter(str(directory), sync_files=False)
        writer.set_up_storage_writer(True)
        writer.finish(metadata, all_results)
    del all_results
    metadata_file = directory / ".metadata"
    metadata_bytes = metadata_file.stat().st_size
    with r0("broadcast .metadata (pickle)"):
        broadcast = pickle.dumps(metadata)
    del metadata
    gc.collect()
    every = _Clock()
    with every("unpickle broadcast .metadata"):
        received = pickle.loads(broadcast)
    del received, broadcast
    gc.collect()

    # --- resumes
    resumes: dict[str, Any] = {}
    for label in (*resume_cases, reshard_label):
        rank = resume_cases.get(label, min(1, half - 1))
        resumed_world = world if label in resume_cases else half
        targets = _state(resumed_world, rank, device="cpu", saved_on=world)
        gc.collect()
        mine = _Clock()
        with mine("layout"):
            lay = planning.read_layout(directory)
        with mine("find fragments"):
            wanted = planning.wanted_chunks(targets)
            ranks = planning.fragments_for(lay, wanted)
        with mine("read fragments"):
            md = planning.read_fragments(directory, ranks)
        with mine("coverage"):
            planning.check_coverage(md, wanted, str(directory))
        with mine("local plan"):
            lp = DefaultLoadPlanner()
            lp.set_up_planner(targets, md, is_coordinator=rank == 0)
            lp.create_local_plan()
        read = len(layout_json) + sum(
            (directory / planning.fragment_name(r)).stat().st_size for r in ranks
        )
        entry: dict[str, Any] = {
            "rank": rank,
            "world": resumed_world,
            "fragments": len(ranks),
            "shardwise": {"cpu": sum(mine.cpu.values()), "read": read, **mine.cpu},
        }
        del md, lp
        gc.collect()
        if label in ("rank 0", "ordinary rank (N/2)"):  # DCP: every rank alike
            dcp = _Clock()
            with dcp(".metadata x2"):
                for _ in range(2):  # shardwise's read_sharded_meta, then DCP's load
                    with open(metadata_file, "rb") as f:
                        full_md = load_dcp_metadata(f)
            with dcp("local plan"):
                lp = DefaultLoadPlanner()
                lp.set_up_planner(targets, full_md, is_coordinator=rank == 0)
                load_plan = lp.create_local_plan()
            with dcp("pickle plan"):
                pickled_load_plan = pickle.dumps(load_plan)
            entry["dcp"] = {
                "cpu": sum(dcp.cpu.values()),
                "read": 2 * metadata_bytes,
                "sent": len(pickled_load_plan),
                **dcp.cpu,
            }
            if label == "ordinary rank (N/2)":
                resumes["_ordinary_load_plan"] = pickled_load_plan
            del full_md, lp, load_plan
            gc.collect()
        resumes[label] = entry
    # rank 0's gather and scatter of N load plans (N copies of an ordinary rank's)
    load_plan = resumes.pop("_ordinary_load_plan")
    gathered = [load_plan] * world
    r0_load = _Clock()
    with r0_load("unpickle load plans"):
        plans = [pickle.loads(b) for b in gathered]
    with r0_load("global plan"):
        plans = DefaultLoadPlanner().create_global_plan(plans)
    with r0_load("pickle scatter"):
        scattered_load = [pickle.dumps(p) for p in plans]
    del plans
    load_gather_bytes = len(load_plan) * world
    load_scatter_bytes = sum(map(len, scattered_load))
    del scattered_load, gathered
    gc.collect()

    def ours_row(rank: int) -> dict[str, Any]:
        return {k: v for k, v in ours[rank].items()}

    ordinary = samples["ordinary rank (N/2)"]
    return {
        "world": world,
        "entries": PARAMS * 4,
        "build_states_s": build_s,
        "record_bytes": length,
        "save": {
            "shardwise": {
                "rank 0": {**ours_row(0), "layout_bytes": len(layout_json)},
                "ordinary rank": ours_row(ordinary),
                "slowest rank cpu": max(v["cpu"] for v in ours.values()),
                "fragment_bytes": {
                    "rank 0": fragment_bytes[0],
                    "ordinary": fragment_bytes[ordinary],
                    "max": max(fragment_bytes),
                    "total": sum(fragment_bytes),
                },
            },
            "dcp": {
                "rank 0": {
                    "local": theirs[0]["local"],
                    "coordinator": r0.cpu,
                    "cpu": theirs[0]["local"] + sum(r0.cpu.values()),
                    # the scattered plans, and .metadata at least once (a tree broadcast)
                    "sent": scatter_bytes + metadata_bytes,
                    "received": gathered_bytes + results_bytes,
                },
                "ordinary rank": {
                    "local": theirs[ordinary]["local"],
                    "cpu": theirs[ordinary]["local"] + every.cpu["unpickle broadcast .metadata"],
                    "sent": theirs[ordinary]["sent"] + results_bytes // world,
                    "received": plan_bytes_to_rank[ordinary] + metadata_bytes,
                    **every.cpu,
                },
                "metadata_bytes": metadata_bytes,
                "gathered_plan_bytes": gathered_bytes,
                "write_results_bytes": results_bytes,
            },
        },
        "resume": resumes,
        "resume_dcp_rank0": {
            "cpu": sum(r0_load.cpu.values()),
            **r0_load.cpu,
            "received": load_gather_bytes,
            "sent": load_scatter_bytes,
        },
        "fragments_needed": needs,
    }


def _manifest_bytes(world: int, fragment: int, record: int) -> int:
    """The size of the commit's ``manifest.json`` of such a checkpoint (manifest.py's own
    serialisation): a data file and a fragment per rank, ``layout.json``, ``meta.pt``. Every
    resuming rank reads it, to share the checksum work (``verification_share``)."""
    from shardwise.checkpoint.manifest import ALGORITHM, _dump

    files = {"layout.json": {"size": 40_000, ALGORITHM: "0" * 16}}
    files["meta.pt"] = {"size": 60_000, ALGORITHM: "0" * 16}
    for rank in range(world):
        size = (3 + (rank == 0)) * PARAMS * record  # rank 0 also writes the steps
        files[f"__{rank}_0.distcp"] = {"size": size, ALGORITHM: "0" * 16}
        files[f"__{rank}.metadata"] = {"size": fragment, ALGORITHM: "0" * 16}
    manifest = {
        "manifest_version": 1,
        "algorithm": ALGORITHM,
        "created": "2026-11-27 00:00:00",
        "files": files,
    }
    return len(_dump(manifest).encode())


def _samples(world: int) -> dict[str, int]:
    return dict(zip(SAMPLED, (0, min(1, world - 1), world // 2, world - 1)))


def run(quick: bool) -> dict[str, Any]:
    worlds = [128] if quick else [1024, 4096]
    out: dict[str, Any] = {
        "params": PARAMS,
        "entries": PARAMS * 4,
        "sharded_entries": PARAMS * 3,
        "worlds": worlds,
        "cases": {},
        "skipped": {},
        "targets": {
            "save_rank0_s": TARGET_S,
            "resume_s": TARGET_S,
            "read_bytes": TARGET_READ_BYTES,
        },
    }
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    for world in worlds:
        need = 0.06 * world + 5
        if (skip := out_of_time(need)) is not None:
            out["skipped"][str(world)] = skip
            continue
        with tempfile.TemporaryDirectory(prefix="shardwise-planning-sim-", dir=shm) as tmp:
            case = simulate(world, _samples(world), Path(tmp))
        frag = case["save"]["shardwise"]["fragment_bytes"]["ordinary"]
        case["manifest_bytes"] = _manifest_bytes(world, frag, case["record_bytes"])
        out["cases"][str(world)] = case
    return out


if __name__ == "__main__":
    section_main("planning_sim", run)
