"""Bit rot anywhere in a checkpoint is one line naming the damaged file.

A byte is flipped at evenly spread offsets (the first and last bytes included, and in a
``torch.save`` archive its directory and end record) of every file of each format — a full
``.pth`` and its sidecar manifest; a sharded directory's ``.distcp`` data, ``.metadata``,
``meta.pt`` and manifest; a local checkpoint's rank files and manifest — and of
``last_checkpoint``. ``shardwise ckpt verify`` must fail naming the file, ``shardwise ckpt
inspect`` must either answer (the bytes it reads are intact) or fail naming the file, and a
load (``load_checkpoint``, ``resume``; on the 2 ranks that saved a local checkpoint) must raise
a one-line ``CheckpointError`` naming the file; never a traceback or another exception.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import CheckpointError, find_last_checkpoint
from shardwise.checkpoint.inspect import inspect_checkpoint
from shardwise.checkpoint.verify import verify_checkpoint
from shardwise.cli import main
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.distributed import run_distributed
from tests.toy import ToyNet, train_steps

OPTIM = dict(optimizer=dict(type="AdamW", lr=0.01))
QUIET = dict(log_level="ERROR")
#: evenly spread fractions of a file's length; with the first and the last byte
SPREAD = 12


def offsets(path: Path) -> list[int]:
    """The byte offsets flipped in the file at ``path``: evenly spread, and in a zip archive
    (``torch.save``'s format) three in its directory and two in its end record."""
    size = path.stat().st_size
    chosen = {round(i * (size - 1) / (SPREAD - 1)) for i in range(SPREAD)} | {0, size - 1}
    if path.read_bytes()[:2] == b"PK":
        with zipfile.ZipFile(path) as archive:
            directory = archive.start_dir
        end = size - 22  # the end-of-directory record (no comment)
        chosen |= {directory + (end - directory) * i // 4 for i in (1, 2, 3)} | {end, end + 16}
    return sorted(chosen)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _fsdp(work_dir: str, fmt: str) -> FSDPStrategy:
    strategy = FSDPStrategy(
        work_dir=work_dir,
        state_dict_cfg=fmt,
        env_kwargs=dict(randomness=dict(seed=0)),
        log_kwargs=QUIET,
    )
    model, wrapper = strategy.prepare(ToyNet(width=16), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(1), rank=strategy.rank)
    for buffer in model.buffers():  # BatchNorm statistics differ per rank without SyncBN
        torch.distributed.broadcast(buffer, src=0)
    return strategy


def _save_fsdp(work_dir: str) -> None:
    for fmt in ("sharded", "local"):
        _fsdp(work_dir, fmt).save_checkpoint(f"{fmt}.ckpt")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A full checkpoint (SingleDeviceStrategy), and a sharded and a local one (FSDP, 2 ranks)."""
    root = tmp_path_factory.mktemp("bit_rot")
    strategy = SingleDeviceStrategy(work_dir=str(root / "full"), log_kwargs=QUIET)
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    train_steps(model, wrapper, [], range(1))
    strategy.save_checkpoint("iter_1.pth", extra_ckpt=dict(meta=dict(iter=1)))
    run_distributed(_save_fsdp, 2, str(root / "fsdp"), timeout=180)
    return {
        "full": root / "full" / "iter_1.pth",
        "sharded": root / "fsdp" / "sharded.ckpt",
        "local": root / "fsdp" / "local.ckpt",
    }


def _files(checkpoint: Path) -> list[Path]:
    """Every file of a checkpoint: a directory's files, or the file and its sidecar."""
    if checkpoint.is_dir():
        return sorted(p for p in checkpoint.iterdir() if p.is_file())
    return [checkpoint, checkpoint.with_name(checkpoint.name + ".manifest.json")]


def _damaged_copies(checkpoint: Path, into: Path) -> list[tuple[Path, str, int]]:
    """One copy of ``checkpoint`` per (file, offset), that byte flipped; with the name of the
    damaged file and the offset."""
    copies = []
    for file in _files(checkpoint):
        for offset in offsets(file):
            folder = into / f"{file.name}@{offset}"
            folder.mkdir(parents=True)
            if checkpoint.is_dir():
                copy = Path(shutil.copytree(checkpoint, folder / checkpoint.name))
                flip(copy / file.name, offset)
            else:
                for part in _files(checkpoint):
                    shutil.copy(part, folder / part.name)
                copy = folder / checkpoint.name
                flip(folder / file.name, offset)
            copies.append((copy, file.name, offset))
    return copies


def _one_line_naming(message: str, name: str, where: str) -> None:
    assert "Traceback" not in message, f"{where}: a traceback\n{message}"
    lines = [line for line in message.splitlines() if name in line]
    assert lines, f"{where}: no line names {name}:\n{message}"


def _check_cli(copy: Path, name: str, where: str, capsys) -> None:
    """verify fails naming the file; inspect answers or fails naming it; neither raises."""
    code = main(["ckpt", "verify", "--no-progress", str(copy)])
    out, err = capsys.readouterr()
    assert code == 1, f"{where}: verify passed\n{out}{err}"
    _one_line_naming(err, name, f"{where}: verify")
    code = main(["ckpt", "inspect", str(copy)])
    out, err = capsys.readouterr()
    assert code in (0, 1), f"{where}: inspect exited {code}\n{err}"
    if code:
        assert len(err.strip().splitlines()) == 1, f"{where}: inspect\n{err}"
        _one_line_naming(err, name, f"{where}: inspect")


def _load_error(load, path: Path) -> str:
    """The message of the ``CheckpointError`` ``load(path)`` raises ('' if it loads)."""
    try:
        load(path)
    except CheckpointError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_a_flipped_byte_anywhere_is_one_line_naming_the_file(saved, fmt, tmp_path, capsys):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=QUIET)
    strategy.prepare(ToyNet(width=16 if fmt == "sharded" else 8), optim_wrapper=OPTIM)
    copies = _damaged_copies(saved[fmt], tmp_path / "copies")
    assert len(copies) >= 2 * SPREAD
    for copy, name, offset in copies:
        where = f"{fmt}: {name} byte {offset}"
        _check_cli(copy, name, where, capsys)
        for load in (strategy.load_checkpoint, strategy.resume):
            message = _load_error(load, copy)
            assert message, f"{where}: {load.__name__} loaded damaged bytes"
            assert len(message.splitlines()) == 1, f"{where}: {load.__name__}\n{message}"
            _one_line_naming(message, name, f"{where}: {load.__name__}")


def _resume_local(work_dir: str, copies: list[str]) -> dict[str, str]:
    """Each rank resumes each damaged copy; what it raised (a CheckpointError's message, or
    the type and message of anything else)."""
    strategy = _fsdp(work_dir, "local")
    out = {}
    for copy in copies:
        try:
            strategy.resume(copy)
            out[copy] = "loaded"
        except CheckpointError as exc:
            out[copy] = str(exc)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            out[copy] = f"not a CheckpointError: {type(exc).__name__}: {exc}"
    return out


def test_a_flipped_byte_anywhere_in_a_local_checkpoint_is_one_line_naming_the_file(
    saved, tmp_path, capsys
):
    copies = _damaged_copies(saved["local"], tmp_path / "copies")
    names = {str(copy): (name, offset) for copy, name, offset in copies}
    assert {name for name, _ in names.values()} >= {"rank0.pth", "rank1.pth", "manifest.json"}
    for copy, name, offset in copies:
        _check_cli(copy, name, f"local: {name} byte {offset}", capsys)
    results = run_distributed(_resume_local, 2, str(tmp_path), list(names), timeout=300)
    for rank, result in enumerate(results):
        for copy, message in result.items():
            name, offset = names[copy]
            where = f"local: rank {rank} resuming with {name} byte {offset} flipped"
            assert message != "loaded" and not message.startswith("not a CheckpointError"), (
                f"{where}: {message}"
            )
            assert len(message.splitlines()) == 1, f"{where}\n{message}"
            _one_line_naming(message, name, where)


def test_a_flipped_byte_in_last_checkpoint_falls_back_to_the_newest_committed(saved, tmp_path):
    work_dir = tmp_path / "run"
    shutil.copytree(saved["full"].parent, work_dir)
    record = work_dir / "last_checkpoint"
    good = find_last_checkpoint(work_dir)
    assert good is not None and Path(good).name == "iter_1.pth"
    original = record.read_bytes()
    for offset in offsets(record):
        record.write_bytes(original)
        flip(record, offset)
        found = find_last_checkpoint(work_dir)
        assert found is not None and Path(found).name == "iter_1.pth", (offset, found)


def test_a_sharded_index_whose_pickle_a_flipped_byte_left_readable_is_named(saved, tmp_path):
    """A flipped byte in DCP's index (``.metadata``) may leave a pickle that loads into the
    wrong objects (a memo reference pointing elsewhere): named as damaged, not an
    AttributeError later."""
    source = saved["sharded"]
    index = next(p.name for p in sorted(source.iterdir()) if p.name.endswith(".metadata"))
    original = (source / index).read_bytes()
    copy = Path(shutil.copytree(source, tmp_path / "s.ckpt"))
    for offset in range(len(original) // 4, 3 * len(original) // 4, 29):
        (copy / index).write_bytes(original)
        flip(copy / index, offset)
        report = verify_checkpoint(copy)
        assert any(p.file == index for p in report.problems), (offset, report.problems)
        try:
            inspect_checkpoint(copy)
        except CheckpointError as exc:
            assert index in str(exc) and len(str(exc).splitlines()) == 1, (offset, exc)
