"""Sharded (DCP) checkpoints are read without executing anything stored in them."""

import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.safe_dcp import SafeFileSystemReader

# DCP re-raises a reader's error inside its own CheckpointException, message included.
REFUSED = (CheckpointError, CheckpointException)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _save(path, state):
    dcp.save(state, checkpoint_id=str(path), no_dist=True)


def test_a_dcp_checkpoint_loads_through_the_safe_reader(tmp_path):
    state = {"w": torch.randn(3, 4), "nested": {"b": torch.arange(5, dtype=torch.bfloat16)}}
    _save(tmp_path / "ckpt", state)
    loaded = {"w": torch.zeros(3, 4), "nested": {"b": torch.zeros(5, dtype=torch.bfloat16)}}
    dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(
        loaded["nested"]["b"], state["nested"]["b"]
    )


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_metadata_file_that_would_run_code_is_refused(tmp_path):
    _save(tmp_path / "ckpt", {"w": torch.zeros(2)})
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(REFUSED, match="posix.system is not one of the classes"):
        dcp.load(
            {"w": torch.zeros(2)},
            storage_reader=SafeFileSystemReader(tmp_path / "ckpt"),
            no_dist=True,
        )
    assert not (tmp_path / "pwned").exists()


def test_pickled_objects_indexed_by_dcp_are_refused(tmp_path):
    _save(tmp_path / "ckpt", {"w": torch.zeros(2), "extra": {"note": "a python object"}})
    with pytest.raises(REFUSED, match=r"indexes pickled objects under \['extra.note'\]"):
        dcp.load(
            {"w": torch.zeros(2)},
            storage_reader=SafeFileSystemReader(tmp_path / "ckpt"),
            no_dist=True,
        )


@pytest.mark.parametrize(
    "shape, offsets, lengths, run",
    [
        ((6, 4), (2, 0), (3, 4), (8, 12)),  # rows: FSDP's dim-0 shard
        ((6, 4), (0, 0), (6, 4), (0, 24)),  # the whole tensor
        ((1, 6, 4), (0, 3, 0), (1, 2, 4), (12, 8)),  # leading dims of size 1
        ((6, 4), (0, 1), (6, 2), None),  # columns: strided, read whole and narrowed
        ((2, 6, 4), (0, 2, 0), (2, 2, 4), None),  # a slab of each of two blocks
    ],
)
def test_only_a_contiguous_slice_is_read_by_its_byte_range(shape, offsets, lengths, run):
    from shardwise.checkpoint.safe_dcp import _contiguous_run

    stored = torch.empty(shape, device="meta")
    assert _contiguous_run(stored, offsets, lengths) == run


def _zip_parses(monkeypatch) -> list[int]:
    """Count the zip directories parsed (every ``torch._C.PyTorchFileReader`` made)."""
    real, parses = torch._C.PyTorchFileReader, []

    def counted(*args):
        parses.append(1)
        return real(*args)

    monkeypatch.setattr(torch._C, "PyTorchFileReader", counted)
    return parses


def test_records_written_from_one_template_are_read_without_parsing_each(tmp_path, monkeypatch):
    from shardwise.checkpoint.sharded import load_sharded_checkpoint, save_sharded_checkpoint

    weights = {f"w{i}": torch.randn(8, 4) for i in range(20)}  # one kind: one frame
    save_sharded_checkpoint({"state_dict": weights}, tmp_path / "ckpt")
    parses = _zip_parses(monkeypatch)
    loaded = load_sharded_checkpoint(tmp_path / "ckpt")["state_dict"]
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    assert len(parses) <= 4  # meta.pt, the byte order, the first record and its torch.load


def test_records_whose_frames_differ_are_each_read_right(tmp_path):
    """DCP's own writer keeps torch's CRC-32 in each record's headers: no two records of one
    kind share their frame, and each is parsed."""
    weights = {f"w{i}": torch.randn(8, 4) for i in range(20)}
    _save(tmp_path / "ckpt", weights)
    loaded = {k: torch.zeros(8, 4) for k in weights}
    dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
