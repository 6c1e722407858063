"""Sharded saves planned by each rank alone (checkpoint/planning.py): the same chunks as DCP's
central planner, written without a gather, read back from only the fragments a rank needs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from shardwise.checkpoint import CheckpointError, planning
from shardwise.checkpoint.sharded import (
    load_sharded_checkpoint,
    read_sharded_checkpoint,
    save_sharded_checkpoint,
)
from shardwise.cli import main

from .distributed import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


# ----------------------------------------------------------------------------- simulated ranks
def _mesh(shape, rank):
    """A mesh of ``prod(shape)`` ranks seen from ``rank``, without a process group."""
    n = 1
    for s in shape:
        n *= s
    return DeviceMesh("cpu", torch.arange(n).reshape(shape), _init_backend=False, _rank=rank)


def _state(mesh_shape, placements, rank):
    """A small optimizer-like state of meta DTensors (uneven shapes) and a plain tensor."""
    mesh = _mesh(mesh_shape, rank)
    state = {}
    for name, shape in {"a": (10, 6), "b": (7,), "c": (3, 5), "d": (1, 9)}.items():
        placed = [
            p if not isinstance(p, Shard) or p.dim < len(shape) else Shard(0) for p in placements
        ]
        sizes, _ = planning._chunk(
            shape,
            tuple(mesh.shape),
            tuple(mesh.get_coordinate()),
            tuple(tuple(planning._placement_code(p)) for p in placed),
        )
        local = torch.empty(sizes, device="meta")
        state[name] = DTensor.from_local(
            local,
            mesh,
            placed,
            run_check=False,
            shape=torch.Size(shape),
            stride=torch.empty(shape, device="meta").stride(),
        )
    state["step"] = torch.empty((), device="meta")
    return state


def _entries(plans):
    """Every chunk planned, but the empty shards of uneven sharding (DCP keeps one of them,
    shardwise none: they hold nothing to read)."""
    return sorted(
        (i.index.fqn, tuple(i.tensor_data.chunk.offsets), tuple(i.tensor_data.chunk.sizes))
        for plan in plans
        for i in plan.items
        if i.tensor_data.chunk.sizes.numel() or not i.tensor_data.size.numel()
    )


@pytest.mark.parametrize(
    "mesh_shape, placements",
    [
        ((4,), [Shard(0)]),  # FSDP
        ((3,), [Shard(0)]),  # uneven: a rank with an empty shard
        ((2, 2), [Replicate(), Shard(0)]),  # HSDP
        ((2, 2), [Shard(0), Shard(1)]),  # FSDP x TP
        ((2, 3), [Shard(1), Replicate()]),
    ],
)
def test_every_rank_alone_plans_the_chunks_dcps_central_planner_keeps(mesh_shape, placements):
    world = 1
    for s in mesh_shape:
        world *= s
    ours, theirs, fragments = [], [], []
    for rank in range(world):
        state = _state(mesh_shape, placements, rank)
        plan, fragment = planning.plan_save(state, rank)
        ours.append(plan)
        fragments.append(fragment)
        dcp_planner = DefaultSavePlanner()
        dcp_planner.set_up_planner(state, is_coordinator=rank == 0)
        theirs.append(dcp_planner.create_local_plan())
    global_plans, global_md = DefaultSavePlanner().create_global_plan(theirs)
    # one writer per distinct chunk, the chunks DCP keeps after its dedup, and nothing more
    assert _entries(ours) == _entries(global_plans)
    assert len(set(_entries(ours))) == len(_entries(ours))
    merged = planning.merge_fragments(fragments)
    for key, entry in global_md.state_dict_metadata.items():
        got = merged.state_dict_metadata[key]
        assert got.size == entry.size and got.properties.dtype == entry.properties.dtype
        assert sorted(tuple(c.offsets) for c in got.chunks) == sorted(
            tuple(c.offsets) for c in entry.chunks if c.sizes.numel()
        )


def test_the_layout_names_the_writers_of_the_chunks_a_rank_reads():
    saved = {r: _state((4,), [Shard(0)], r) for r in range(4)}
    layout = planning.describe(saved[0], 4)
    layout = planning.SaveLayout.from_json(layout.to_json())
    # the same mesh: its own fragment, and rank 0's (the plain tensor)
    for rank in range(4):
        wanted = planning.wanted_chunks(saved[rank])
        assert planning.fragments_for(layout, wanted) == sorted({0, rank})
    # 4 -> 2 ranks: a's 10 rows in chunks of 3 (0-2, 3-5, 6-8, 9) read in halves (0-4, 5-9)
    for rank, writers in ((0, [0, 1]), (1, [0, 1, 2, 3])):
        wanted = planning.wanted_chunks(_state((2,), [Shard(0)], rank))
        assert planning.fragments_for(layout, wanted) == writers
    # one device: every writer
    whole = {k: torch.empty(v.shape, device="meta") for k, v in saved[0].items()}
    assert planning.fragments_for(layout, planning.wanted_chunks(whole)) == [0, 1, 2, 3]


def test_a_damaged_layout_is_refused_naming_the_file():
    with pytest.raises(CheckpointError, match="layout.json"):
        planning.SaveLayout.from_json('{"version": 1, "world_size": 2}')
    with pytest.raises(CheckpointError, match="not a torch dtype"):
        planning.SaveLayout.from_json(
            '{"version":1,"world_size":1,"meshes":[],"tensors":{"x":[[2],"nope",null,[]]}}'
        )


def test_coverage_is_checked_before_reading():
    fragments = [planning.plan_save(_state((4,), [Shard(0)], r), r)[1] for r in range(4)]
    partial = planning.merge_fragments(fragments[:3])
    planning.check_coverage(planning.merge_fragments(fragments), {"a": [((0, 0), (10, 6))]}, "x")
    with pytest.raises(CheckpointError, match="cover 9 of the 10"):
        planning.check_coverage(partial, {"a": [((0, 0), (10, 1))]}, "ckpt")


# ----------------------------------------------------------------------------- real ranks
def _dtensor_state(world, rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full = {"w": torch.randn(10, 6), "v": torch.randn(7), "m": torch.randn(3, 5)}
    model = {k: distribute_tensor(t, mesh, [Shard(0)]) for k, t in full.items()}
    exp_avg = distribute_tensor(full["w"] * 2, mesh, [Shard(0)])
    optim = {
        "state": {"w": {"step": torch.tensor(3.0), "exp_avg": exp_avg}},
        "param_groups": [{"lr": 0.1, "params": ["w"]}],
    }
    return {"state_dict": model, "optimizer": optim, "meta": {"iter": 7}}, full, mesh


def _save_then_resume(path):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    state, full, mesh = _dtensor_state(world, rank)
    calls = []
    collectives = (
        "gather_object",
        "scatter_object_list",
        "broadcast_object_list",
        "all_gather_object",
        "all_reduce",
        "barrier",
        "gather",
        "scatter",
    )
    originals = {name: getattr(dist, name) for name in collectives}

    def counting(name):
        def call(*a, **k):
            calls.append((name, a[0].numel() if name == "all_reduce" else None))
            return originals[name](*a, **k)

        return call

    for name in collectives:
        setattr(dist, name, counting(name))
    try:
        written = save_sharded_checkpoint(state, path, central_plan=False)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    dist.barrier()
    opened = []
    read = planning.read_fragments

    def recording(p, ranks):
        ranks = list(ranks)
        opened.extend(ranks)
        return read(p, ranks)

    planning.read_fragments = recording
    try:

        def factory(p, shape, dtype):
            if len(shape):  # every sharded tensor as a shard again
                return distribute_tensor(torch.zeros(shape, dtype=dtype), mesh, [Shard(0)])
            return torch.zeros(shape, dtype=dtype)

        loaded = read_sharded_checkpoint(path, factory)
    finally:
        planning.read_fragments = read
    return {
        "collectives during the save": calls,
        "written": sorted(w.path.name for w in written),
        "fragments read": opened,
        "model": {k: v.full_tensor() for k, v in loaded["state_dict"].items()},
        "optim": loaded["optimizer"]["state"]["w"]["exp_avg"],
        "step": loaded["optimizer"]["state"]["w"]["step"],
        "meta": loaded["meta"],
        "full": full,
    }


def test_a_save_on_two_ranks_exchanges_3_integers_and_each_rank_reads_its_fragments(
    tmp_path, capsys
):
    path = tmp_path / "ckpt"
    results = run_distributed(_save_then_resume, 2, str(path), init_pg=True)
    for rank, result in enumerate(results):
        # one all-reduce of 3 integers (every rank holds the same entries), nothing else
        assert result["collectives during the save"] == [("all_reduce", 3)]
        assert f"__{rank}.metadata" in result["written"]
        assert f"__{rank}_0.distcp" in result["written"]
        assert ("layout.json" in result["written"]) == (rank == 0)
        assert result["fragments read"] == sorted({0, rank})
        for key, tensor in result["full"].items():
            assert torch.equal(result["model"][key], tensor)
        assert result["meta"] == {"iter": 7} and float(result["step"]) == 3.0
    names = sorted(p.name for p in path.iterdir())
    assert ".metadata" not in names
    # one process, no process group: every fragment merged in memory
    whole = load_sharded_checkpoint(path)
    for key, tensor in results[0]["full"].items():
        assert torch.equal(whole["state_dict"][key], tensor)
    assert torch.equal(whole["optimizer"]["state"]["w"]["exp_avg"], results[0]["full"]["w"] * 2)
    # torch's own tools, after the on-demand index (`shardwise ckpt index`)
    assert main(["ckpt", "index", str(path)]) == 0
    assert "wrote" in capsys.readouterr().out
    dcp_to_torch_save(path, tmp_path / "plain.pt")
    plain = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert torch.equal(plain["state_dict/w"], results[0]["full"]["w"])
    assert torch.equal(plain["optimizer/state/w/exp_avg"], results[0]["full"]["w"] * 2)
    again = {"state_dict/v": torch.zeros(7)}
    dcp.load(again, checkpoint_id=str(path), no_dist=True)
    assert torch.equal(again["state_dict/v"], results[0]["full"]["v"])


def _save_different_entries(path):
    """Rank 1 holds an entry rank 0 does not (as a pipeline stage holds its own layers)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    state, full, _ = _dtensor_state(dist.get_world_size(), rank)
    state["state_dict"][f"only_on_{rank}"] = torch.full((3,), float(rank))
    save_sharded_checkpoint(state, path)
    return full


def test_ranks_holding_different_entries_save_through_dcps_central_planner(tmp_path):
    path = tmp_path / "ckpt"
    full = run_distributed(_save_different_entries, 2, str(path), init_pg=True)[0]
    names = {p.name for p in path.iterdir()}
    assert ".metadata" in names and "layout.json" not in names
    stored = {"state_dict/only_on_0": torch.zeros(3), "state_dict/only_on_1": torch.zeros(3)}
    dcp.load(stored, checkpoint_id=str(path), no_dist=True)
    assert stored["state_dict/only_on_1"].tolist() == [1.0, 1.0, 1.0]  # nothing lost
    assert torch.equal(load_sharded_checkpoint(path)["state_dict"]["w"], full["w"])


def _save_hsdp(path):
    """4 ranks, a (replicate 2, shard 2) mesh as HSDP holds its parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    full = {"w": torch.randn(10, 6), "v": torch.randn(5)}
    state = {
        "state_dict": {
            k: distribute_tensor(t, mesh, [Replicate(), Shard(0)]) for k, t in full.items()
        },
        "meta": {"iter": 1},
    }
    written = save_sharded_checkpoint(state, path)
    return dist.get_rank(), sorted(w.path.name for w in written), full


def _resume_fsdp(path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    loaded = read_sharded_checkpoint(
        path, lambda p, shape, dtype: distribute_tensor(torch.zeros(shape), mesh, [Shard(0)])
    )
    return {k: v.full_tensor() for k, v in loaded["state_dict"].items()}


@pytest.mark.slow
def test_an_hsdp_save_is_written_by_one_replica_and_reshards_onto_fsdp(tmp_path):
    path = tmp_path / "ckpt"
    saved = run_distributed(_save_hsdp, 4, str(path), init_pg=True)
    data = {rank: [n for n in names if n.endswith(".distcp")] for rank, names, _ in saved}
    # the replicate group at coordinate 0 (ranks 0 and 1) writes; its replica writes nothing
    assert data == {0: ["__0_0.distcp"], 1: ["__1_0.distcp"], 2: [], 3: []}
    full = saved[0][2]
    for resumed in run_distributed(_resume_fsdp, 2, str(path), init_pg=True):
        assert all(torch.equal(resumed[k], full[k]) for k in full)
    whole = load_sharded_checkpoint(path)["state_dict"]
    assert all(torch.equal(whole[k], full[k]) for k in full)
