"""Nothing half-loaded from damaged bytes: every load compares a checkpoint's files with the
checksums recorded when it was saved (full, sharded, local; one process and 2 ranks) and
refuses a mismatch, naming the file, on every rank; ``verify_checksums=False`` turns it off.
A sharded checkpoint missing a file fails with an ordinary ``Exception`` of one line per rank.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.formats import read_checkpoint
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.distributed import run_distributed
from tests.test_checkpoint_safety import tree_digest
from tests.test_fsdp import Block, TinyTransformer

OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2))


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Flip every bit of one byte (by default the one in the middle of the file)."""
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _fsdp(work_dir, fmt, **kwargs):
    strategy = FSDPStrategy(
        work_dir=work_dir,
        state_dict_cfg=fmt,
        model_wrapper=dict(auto_wrap_policy={Block}),
        log_kwargs=dict(log_level="WARNING"),
        **kwargs,
    )
    strategy.prepare(TinyTransformer(dim=64), optim_wrapper=OPTIM)
    return strategy


def _save_all_formats(work_dir):
    for fmt in ("full", "sharded", "local"):
        _fsdp(work_dir, fmt).save_checkpoint(f"{fmt}.ckpt")


def _resume_each(work_dir, damaged, verify):
    """Resume every damaged checkpoint; what each rank got: 'ok' or the error's text."""
    out = {}
    for fmt, name in damaged.items():
        strategy = _fsdp(work_dir, fmt)
        try:
            strategy.resume(name, verify_checksums=verify)
            out[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - the test looks at the message
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A full, a sharded and a local checkpoint of the same FSDP model on 2 ranks."""
    work_dir = tmp_path_factory.mktemp("saved")
    run_distributed(_save_all_formats, 2, str(work_dir))
    return work_dir


def _damaged_copy(saved: Path, tmp_path: Path) -> dict[str, str]:
    """Copies of the three checkpoints with one byte flipped in a file only rank 1 reads
    (sharded: rank 1's shards; local: rank1.pth) or rank 0 reads (full)."""
    shutil.copytree(saved, tmp_path, dirs_exist_ok=True)
    flip_byte(tmp_path / "full.ckpt")
    flip_byte(tmp_path / "sharded.ckpt" / "__1_0.distcp")
    flip_byte(tmp_path / "local.ckpt" / "rank1.pth")
    return {"full": "full.ckpt", "sharded": "sharded.ckpt", "local": "local.ckpt"}


def test_a_flipped_byte_is_refused_on_every_rank_naming_the_file(saved, tmp_path):
    damaged = _damaged_copy(saved, tmp_path)
    before = {name: tree_digest(tmp_path / name) for name in damaged.values()}
    results = run_distributed(_resume_each, 2, str(tmp_path), damaged, True)
    named = {"full.ckpt": "full.ckpt", "sharded.ckpt": "__1_0.distcp", "local.ckpt": "rank1.pth"}
    for rank, result in enumerate(results):
        for name, message in result.items():
            assert message.startswith("CheckpointError"), (rank, name, message)
            assert "differ from the checksums recorded" in message, (rank, message)
            assert named[name] in message and "verify_checksums=False" in message
    assert {name: tree_digest(tmp_path / name) for name in damaged.values()} == before


@pytest.mark.parametrize("index", ["__1.metadata", "layout.json"])
def test_a_flipped_byte_in_the_index_is_refused_on_every_rank_naming_it(saved, tmp_path, index):
    """The index a sharded save writes without a gather (rank 1's metadata fragment, which
    only rank 1 reads on 2 ranks; layout.json, which every rank reads) is checked too."""
    shutil.copytree(saved, tmp_path, dirs_exist_ok=True)
    flip_byte(tmp_path / "sharded.ckpt" / index)
    results = run_distributed(_resume_each, 2, str(tmp_path), {"sharded": "sharded.ckpt"}, True)
    for rank, result in enumerate(results):
        message = result["sharded.ckpt"]
        assert message.startswith("CheckpointError") and index in message, (rank, message)


def test_verification_can_be_turned_off(saved, tmp_path):
    damaged = _damaged_copy(saved, tmp_path)
    results = run_distributed(_resume_each, 2, str(tmp_path), damaged, False)
    for result in results:  # whatever torch makes of the bytes, no checksum was compared
        assert not any("checksums recorded" in message for message in result.values())


@pytest.mark.parametrize(
    "victim", ["__0_0.distcp", "__0.metadata", "__1.metadata", "layout.json", "meta.pt"]
)
def test_one_process_refuses_any_damaged_file_of_a_sharded_checkpoint(saved, tmp_path, victim):
    shutil.copytree(saved / "sharded.ckpt", tmp_path / "s.ckpt")
    flip_byte(tmp_path / "s.ckpt" / victim)
    with pytest.raises(CheckpointError, match=rf"refusing to load .*s\.ckpt.*{victim}"):
        read_checkpoint(tmp_path / "s.ckpt")
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    strategy.prepare(TinyTransformer(dim=64), optim_wrapper=OPTIM)
    before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=victim):
        strategy.resume(tmp_path / "s.ckpt")
    with pytest.raises(CheckpointError, match=victim):
        strategy.load_checkpoint(tmp_path / "s.ckpt")
    after = strategy.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # nothing half-loaded


def test_a_full_checkpoint_with_a_flipped_byte_is_refused_by_a_single_process(tmp_path):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    strategy.prepare(torch.nn.Linear(128, 128), optim_wrapper=OPTIM)
    strategy.save_checkpoint("a.pth")
    flip_byte(tmp_path / "a.pth")
    with pytest.raises(CheckpointError, match=r"a\.pth: XXH3-64 .* differs"):
        strategy.load_checkpoint("a.pth")
    checkpoint = strategy.load_checkpoint("a.pth", verify_checksums=False)  # a data byte
    assert "meta" in checkpoint
    off = SingleDeviceStrategy(
        work_dir=str(tmp_path), verify_checksums=False, log_kwargs=dict(log_level="ERROR")
    )
    off.prepare(torch.nn.Linear(128, 128), optim_wrapper=OPTIM)
    assert "meta" in off.load_checkpoint("a.pth")  # the strategy's default, turned off


def _resume_broken(work_dir, name):
    strategy = _fsdp(work_dir, "sharded")
    try:
        strategy.resume(name, verify_checksums=False)  # DCP itself meets the missing file
    except Exception as exc:  # noqa: BLE001 - a BaseException would escape this
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_shard_file_is_an_ordinary_one_line_error(saved, tmp_path, damage):
    shutil.copytree(saved / "sharded.ckpt", tmp_path / "s.ckpt")
    victim = tmp_path / "s.ckpt" / "__1_0.distcp"
    if damage == "missing":
        victim.unlink()
    else:
        os.truncate(victim, victim.stat().st_size // 2)
    for message in run_distributed(_resume_broken, 2, str(tmp_path), "s.ckpt"):
        # rank 1 its own error; rank 0, which read its own files, names rank 1's
        assert message.startswith("CheckpointError: ") and "DCP could not load" in message
        assert "rank 1:" in message and "Traceback" not in message
        assert len(message.splitlines()) == 1
    # with verification (the default) the manifest says which file is wrong, before DCP reads
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    strategy.prepare(TinyTransformer(dim=64), optim_wrapper=OPTIM)
    expected = "missing" if damage == "missing" else "size is"
    with pytest.raises(CheckpointError, match=rf"__1_0\.distcp: {expected}"):
        strategy.resume(tmp_path / "s.ckpt")
