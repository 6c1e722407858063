"""The full format's writer: the checksum taken while writing is the file's XXH3; the kernel
is asked to write the file out as it grows."""

import pytest
import torch
import xxhash

from shardwise.checkpoint.full import load_full_checkpoint, save_full_checkpoint

BIG = torch.arange(3_000_000, dtype=torch.float32)


@pytest.mark.parametrize(
    "state",
    [
        {"state_dict": {"w": torch.randn(1024, 1024), "b": torch.randn(7)}},
        {"many": [torch.full((3,), float(i)) for i in range(500)], "note": ["x" * 100] * 30_000},
        {"views": [BIG[1:], BIG[::2], BIG.view(3, -1)[1]], "empty": torch.empty(0)},
        {"mixed": torch.randn(300, 300).to(torch.bfloat16), "int": torch.arange(9), "none": None},
    ],
    ids=["large tensors", "small tensors and a large pickle", "views and empty", "dtypes"],
)
def test_the_checksum_taken_while_writing_is_the_files_xxh3(tmp_path, state):
    written = save_full_checkpoint(state, tmp_path / "ckpt.pth")
    assert written.checksum == xxhash.xxh3_64((tmp_path / "ckpt.pth").read_bytes()).hexdigest()
    loaded = load_full_checkpoint(tmp_path / "ckpt.pth")
    assert loaded.keys() == state.keys()


def test_the_writer_has_the_kernel_start_writing_every_so_many_bytes(tmp_path, monkeypatch):
    from shardwise.checkpoint import full

    if full._START_WRITEBACK is None:
        pytest.skip("sync_file_range is Linux's")
    ranges = []
    original = full._START_WRITEBACK

    def record(fd, offset, length, flags):
        ranges.append((offset, length))
        return original(fd, offset, length, flags)

    monkeypatch.setattr(full, "_START_WRITEBACK", record)
    monkeypatch.setattr(full, "WRITEBACK_BYTES", 1 << 20)
    state = {"w": [torch.randn(1 << 18) for _ in range(16)]}  # 16 tensors of 1 MiB
    written = full.save_full_checkpoint(state, tmp_path / "ckpt.pth")
    size = (tmp_path / "ckpt.pth").stat().st_size
    assert len(ranges) >= 8 and all(length >= 1 << 20 for _, length in ranges)
    assert [offset for offset, _ in ranges] == [0] + [o + n for o, n in ranges[:-1]]  # in order
    assert ranges[-1][0] + ranges[-1][1] <= size
    assert written.checksum == xxhash.xxh3_64((tmp_path / "ckpt.pth").read_bytes()).hexdigest()
    loaded = load_full_checkpoint(tmp_path / "ckpt.pth")["w"]
    assert all(torch.equal(a, b) for a, b in zip(loaded, state["w"], strict=True))
