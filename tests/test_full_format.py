"""The full format's writer: the checksum taken while writing is the file's CRC-32."""

import zlib

import pytest
import torch

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
def test_the_checksum_taken_while_writing_is_the_files_crc32(tmp_path, state):
    written = save_full_checkpoint(state, tmp_path / "ckpt.pth")
    assert written.checksum == f"{zlib.crc32((tmp_path / 'ckpt.pth').read_bytes()):08x}"
    loaded = load_full_checkpoint(tmp_path / "ckpt.pth")
    assert loaded.keys() == state.keys()
