"""Checksums per chunk (checkpoint/records.py): each record of a sharded checkpoint's data files
carries its own checksum in the metadata fragment, and a rank that reads some chunks of a file
(here rank 1, which reads of rank 0's file only the plain tensors rank 0 wrote) hashes those
alone; ``shardwise ckpt verify`` still checks every byte. The records are byte for byte what
``torch.save`` writes, so DCP's own readers read them."""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import Shard, distribute_tensor

from shardwise.checkpoint import CheckpointError, planning
from shardwise.checkpoint.dcp_index import load_dcp_metadata
from shardwise.checkpoint.formats import SHARDED
from shardwise.checkpoint.manifest import ReadCheck, write_manifest
from shardwise.checkpoint.records import CHECKSUM, chunk_checksum, record_bytes
from shardwise.checkpoint.sharded import (
    checked_whole,
    load_sharded_checkpoint,
    load_sharded_tensors,
    read_sharded_meta,
    save_sharded_checkpoint,
)
from shardwise.checkpoint.verify import verify_checkpoint
from tests.distributed import run_distributed


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12.0).reshape(3, 4),
        torch.tensor(3.0),
        torch.arange(6, dtype=torch.bfloat16),
        torch.tensor([True, False]),
        torch.arange(5.0).reshape(1, 5).as_strided((1, 5), (7, 1)),  # a stride torch keeps
        torch.arange(10.0)[2:6],  # a view: the whole storage is saved
        torch.ones(2, requires_grad=True),
    ],
)
def test_records_are_what_torch_save_writes_byte_for_byte(tensor):
    previous = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)  # as a sharded save on the main thread
    try:
        for _ in range(2):  # the first of a kind is torch.save's; the next from its template
            other = tensor.detach().clone().requires_grad_(tensor.requires_grad)
            if tensor._base is not None:
                other = tensor._base.clone()[2:6]
            buffer = io.BytesIO()
            torch.save(other, buffer)
            assert record_bytes(other) == buffer.getvalue()
            loaded = torch.load(io.BytesIO(record_bytes(other)), weights_only=True)
            assert torch.equal(loaded, other)
    finally:
        torch.serialization.set_crc32_options(previous)


# ----------------------------------------------------------------------------- 2 ranks
def _state(world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full = {"w": torch.randn(1024, 16), "v": torch.randn(7)}
    model = {k: distribute_tensor(t, mesh, [Shard(0)]) for k, t in full.items()}
    optim = {
        "state": {"w": {"step": torch.tensor(3.0)}},  # a plain tensor: rank 0 writes it
        "param_groups": [{"lr": 0.1, "params": ["w"]}],
    }
    return {"state_dict": model, "optimizer": optim, "meta": {"iter": 7}}, full, mesh


def _save(path):
    import torch.distributed as dist

    state, full, _ = _state(dist.get_world_size())
    save_sharded_checkpoint(state, path)
    dist.barrier()
    if dist.get_rank() == 0:
        write_manifest(path)
    return full


class _Placement:
    """A strategy's side of a read (formats.Placement): every tensor as this rank's shard."""

    def __init__(self, mesh):
        import torch.distributed as dist

        self.mesh, self.rank, self.world_size = mesh, dist.get_rank(), dist.get_world_size()

    def tensor_for(self, path, shape, dtype):
        if len(shape):
            return distribute_tensor(torch.zeros(shape, dtype=dtype), self.mesh, [Shard(0)])
        return torch.zeros(shape, dtype=dtype)

    def on_rank0(self, fn):
        from shardwise.checkpoint.agreement import on_rank0

        return on_rank0(fn)

    def on_every_rank(self, fn):
        from shardwise.checkpoint.agreement import on_every_rank

        return on_every_rank(fn)


def _load_each(copies):
    """Each rank loads each copy alone (its own check, no agreement: what it hashes, what it
    refuses), then every rank together as a strategy does (agreed)."""
    import torch.distributed as dist

    _, full, mesh = _state(dist.get_world_size())
    placement = _Placement(mesh)
    alone, agreed = {}, {}
    for copy in copies:
        check = ReadCheck(copy, checked_whole(sorted(p.name for p in Path(copy).iterdir()), copy))
        try:
            skeleton, specs = read_sharded_meta(copy)
            loaded = load_sharded_tensors(
                copy, skeleton, specs, placement.tensor_for, no_dist=True, check=check
            )
            check.result()
            mine = full["w"].chunk(2)[placement.rank]
            alone[copy] = (
                "loaded",
                check.hashed,
                torch.equal(loaded["state_dict"]["w"].to_local(), mine),
            )
        except CheckpointError as exc:
            alone[copy] = ("refused", str(exc))
        try:
            SHARDED.read_onto(Path(copy), placement, verify=True)
            agreed[copy] = "loaded"
        except CheckpointError as exc:
            agreed[copy] = str(exc)
    return alone, agreed


def _fragment(path: Path, rank: int):
    with open(path / planning.fragment_name(rank), "rb") as f:
        return load_dcp_metadata(f)


def _chunk(path: Path, rank: int, fqn: str):
    """The storage entry (file, offset, length, checksum) of ``fqn``'s chunk in ``rank``'s file."""
    for index, info in _fragment(path, rank).storage_data.items():
        if index.fqn == fqn:
            return info
    raise KeyError(fqn)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _copy(saved: Path, root: Path, name: str) -> Path:
    return Path(shutil.copytree(saved, root / name / "ckpt"))


def _strip_chunk_checksums(path: Path, world: int) -> None:
    """Make ``path`` a checkpoint as saved before chunks had checksums (fragments without
    them, a manifest of the whole files)."""
    for rank in range(world):
        fragment = _fragment(path, rank)
        for info in fragment.storage_data.values():
            info.__dict__.pop(CHECKSUM, None)
        (path / planning.fragment_name(rank)).write_bytes(pickle.dumps(fragment))
    write_manifest(path)


@pytest.mark.slow
def test_a_rank_reading_part_of_a_file_hashes_only_its_chunks(tmp_path):
    saved = tmp_path / "saved"
    full = run_distributed(_save, 2, str(saved), init_pg=True)[0]
    for rank in range(2):  # every record's checksum is in the fragment
        assert all(chunk_checksum(i) for i in _fragment(saved, rank).storage_data.values())
    w0 = _chunk(saved, 0, "state_dict/w")  # rank 0's shard of w: rank 1 does not read it
    step = _chunk(saved, 0, "optimizer/state/w/step")  # a plain tensor: every rank reads it
    assert w0.relative_path == step.relative_path == "__0_0.distcp"

    copies = {"intact": _copy(saved, tmp_path, "intact")}
    copies["w0"] = _copy(saved, tmp_path, "w0")
    _flip(copies["w0"] / "__0_0.distcp", w0.offset + w0.length // 2)
    copies["step"] = _copy(saved, tmp_path, "step")
    _flip(copies["step"] / "__0_0.distcp", step.offset + step.length // 2)
    copies["fragment1"] = _copy(saved, tmp_path, "fragment1")
    _flip(copies["fragment1"] / "__1.metadata", 40)
    copies["old"] = _copy(saved, tmp_path, "old")  # per-file checksums only
    _strip_chunk_checksums(copies["old"], 2)
    copies["old w1"] = _copy(copies["old"], tmp_path, "old w1")
    w1 = _chunk(saved, 1, "state_dict/w")
    _flip(copies["old w1"] / "__1_0.distcp", w1.offset + w1.length // 2)

    alone, agreed = zip(
        *run_distributed(_load_each, 2, [str(c) for c in copies.values()], init_pg=True)
    )
    result = {name: [alone[r][str(copy)] for r in range(2)] for name, copy in copies.items()}
    together = {name: [agreed[r][str(copy)] for r in range(2)] for name, copy in copies.items()}

    # intact: rank 1 hashed the small files, both fragments, its own file's chunks and, of
    # rank 0's file, the one chunk it reads (step), not rank 0's shards
    sizes = {p.name: p.stat().st_size for p in saved.iterdir()}
    own = sum(i.length for i in _fragment(saved, 1).storage_data.values())
    small = sizes["meta.pt"] + sizes["layout.json"] + sizes["__0.metadata"] + sizes["__1.metadata"]
    assert result["intact"][1] == ("loaded", small + own + step.length, True)
    assert step.length < sizes["__0_0.distcp"] // 10
    assert result["intact"][0][0] == "loaded" and result["intact"][0][2]
    assert together["intact"] == ["loaded", "loaded"]

    # a flipped byte in rank 0's shard of w: rank 0 refuses, rank 1 (which does not read it)
    # loads; the strategy's agreed load refuses on both; verify finds it
    assert result["w0"][0][0] == "refused" and result["w0"][1][:1] == ("loaded",)
    message = result["w0"][0][1]
    assert "__0_0.distcp" in message and "state_dict/w" in message
    assert len(message.splitlines()) == 1
    for message in together["w0"]:
        assert "__0_0.distcp" in message and len(message.splitlines()) == 1
    report = verify_checkpoint(copies["w0"])
    assert [p.file for p in report.problems] == ["__0_0.distcp"]

    # a flipped byte in the chunk both read: both refuse
    for outcome in result["step"]:
        assert outcome[0] == "refused" and "__0_0.distcp" in outcome[1]
        assert "optimizer/state/w/step" in outcome[1]

    # a flipped byte in rank 1's fragment: rank 1 refuses naming it before trusting it;
    # rank 0 does not read it
    assert result["fragment1"][0][0] == "loaded"
    assert result["fragment1"][1][0] == "refused" and "__1.metadata" in result["fragment1"][1][1]
    assert all("__1.metadata" in m for m in together["fragment1"])

    # a checkpoint saved before chunks had checksums loads, its data files checked whole
    assert [r[0] for r in result["old"]] == ["loaded", "loaded"]
    assert result["old"][1][1] >= sizes["__1_0.distcp"]
    assert result["old w1"][1][0] == "refused" and "__1_0.distcp" in result["old w1"][1][1]
    assert all("__1_0.distcp" in m for m in together["old w1"])

    whole = load_sharded_checkpoint(copies["intact"])
    assert torch.equal(whole["state_dict"]["w"], full["w"])


def test_records_skip_torchs_crc32_on_any_thread():
    # torch's switch stays on (a snapshot written in the background, beside the training
    # thread's own saves): the records of plain tensors are still those of a save without it
    tensors = [torch.arange(21.0, dtype=torch.float64).reshape(7, 3) + i for i in range(2)]
    assert torch.serialization.get_crc32_options()
    records = [record_bytes(t) for t in tensors]  # the first of its kind, then its template
    previous = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        for tensor, record in zip(tensors, records, strict=True):
            buffer = io.BytesIO()
            torch.save(tensor, buffer)
            assert record == buffer.getvalue()
    finally:
        torch.serialization.set_crc32_options(previous)
    assert torch.equal(torch.load(io.BytesIO(records[1]), weights_only=True), tensors[1])


def _index(path: Path) -> dict:
    """Rank 0's stored chunks: where each is and its checksum."""
    with open(path / "__0.metadata", "rb") as f:
        stored = load_dcp_metadata(f).storage_data
    return {k: (v.offset, v.length, chunk_checksum(v)) for k, v in stored.items()}


def test_a_file_written_again_holds_what_a_fresh_write_holds(tmp_path, monkeypatch):
    # a memory snapshot's slot (rewrite=True): a save of the same layout writes only the
    # tensors' bytes over the last one's; its data file, each record's checksum and the file's
    # checksum are those of a fresh write, and whatever else happened to it is written whole
    from shardwise.checkpoint import records

    def state(seed: int, rows: int = 3) -> dict:
        g = torch.Generator().manual_seed(seed)
        return {
            "state_dict": {
                "w": torch.randn(rows, 5, generator=g),
                "h": torch.randn(4, generator=g).to(torch.bfloat16),
            },
            "optimizer": {"state": {"w": {"step": torch.tensor(float(seed))}}},
            "meta": {"seed": seed},
        }

    templated = []
    real_record = records._record
    monkeypatch.setattr(
        records, "_record", lambda t, put: (templated.append(1), real_record(t, put))
    )
    slot = tmp_path / "slot"
    data = slot / "__0_0.distcp"
    cases = [(1, 3, None), (2, 3, None), (3, 4, None), (4, 4, None), (5, 4, "flip")]
    for seed, rows, meddle in [(0, 3, None), *cases]:
        if meddle == "flip":  # another writer's bytes, the size kept: not trusted
            raw = bytearray(data.read_bytes())
            raw[-20] ^= 0xFF
            data.write_bytes(bytes(raw))
        templated.clear()
        written = save_sharded_checkpoint(state(seed, rows), slot, rewrite=True)
        rewritten = not templated
        fresh = tmp_path / f"fresh{seed}"
        expected = save_sharded_checkpoint(state(seed, rows), fresh)
        for name in ("__0_0.distcp", "layout.json", "meta.pt"):
            assert (slot / name).read_bytes() == (fresh / name).read_bytes(), name
        digests = {Path(w.path).name: w.checksum for w in written}
        assert (
            digests["__0_0.distcp"]
            == {Path(w.path).name: w.checksum for w in expected}["__0_0.distcp"]
        )
        assert _index(slot) == _index(fresh)
        loaded = load_sharded_checkpoint(slot)
        assert torch.equal(loaded["state_dict"]["w"], state(seed, rows)["state_dict"]["w"])
        # written over where the layout is the last write's (seeds 1, 2, 4), whole where a
        # tensor's shape changed (3) or another process wrote the file (5)
        assert rewritten == (seed in (1, 2, 4)), seed
