"""`shardwise ckpt inspect|convert|verify`: what a user relies on when looking into,
converting and checking checkpoints on one CPU process."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.convert import convert_checkpoint
from shardwise.checkpoint.formats import open_checkpoint
from shardwise.checkpoint.inspect import format_inspection, inspect_checkpoint
from shardwise.checkpoint.manifest import (
    manifest_path,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from shardwise.checkpoint.sharded import save_sharded_checkpoint
from shardwise.checkpoint.verify import verify_checkpoint
from shardwise.cli import main
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.distributed import REPO, run_distributed
from tests.test_fsdp import full_weights
from tests.test_tensor_parallel import PLAN, TPTransformer, run_steps
from tests.toy import ToyNet, final_weights, train_steps

OPTIM = dict(optimizer=dict(type="AdamW", lr=0.01))
SCHEDULER = dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=4)


def _prepared(work_dir, **kwargs):
    strategy = SingleDeviceStrategy(
        work_dir=str(work_dir), env_kwargs=dict(randomness=dict(seed=0)), **kwargs
    )
    model, wrapper, schedulers = strategy.prepare(
        ToyNet(), optim_wrapper=OPTIM, param_scheduler=SCHEDULER
    )
    return strategy, model, wrapper, schedulers


@pytest.fixture
def full_ckpt(tmp_path) -> Path:
    """A full checkpoint saved by SingleDeviceStrategy after two steps (epoch 1, iter 2)."""
    strategy, model, wrapper, schedulers = _prepared(tmp_path / "run")
    train_steps(model, wrapper, schedulers, range(2))
    strategy.save_checkpoint("epoch_1.pth", extra_ckpt=dict(meta=dict(epoch=1, iter=2)))
    return tmp_path / "run" / "epoch_1.pth"


def _fsdp_save(work_dir: str) -> dict[str, torch.Tensor]:
    """Two FSDP ranks train and save in the sharded and the local format."""
    for fmt in ("sharded", "local"):
        strategy = FSDPStrategy(
            work_dir=work_dir, state_dict_cfg=fmt, env_kwargs=dict(randomness=dict(seed=0))
        )
        model, wrapper, schedulers = strategy.prepare(
            ToyNet(width=16), optim_wrapper=OPTIM, param_scheduler=SCHEDULER
        )
        train_steps(model, wrapper, schedulers, range(2), rank=strategy.rank)
        for buffer in model.buffers():  # BatchNorm statistics differ per rank without SyncBN
            torch.distributed.broadcast(buffer, src=0)
        strategy.save_checkpoint(f"{fmt}.ckpt", extra_ckpt=dict(meta=dict(iter=2)))
        if fmt == "sharded":  # in the background DCP's records keep torch's CRC-32s
            strategy.save_checkpoint("sharded_async.ckpt", async_save=True)
            strategy.wait_for_checkpoint()
    return full_weights(model)


@pytest.fixture(scope="module")
def fsdp_ckpts(tmp_path_factory):
    """Sharded and local checkpoints written by FSDPStrategy on 2 ranks, and the weights."""
    work_dir = tmp_path_factory.mktemp("fsdp")
    weights = run_distributed(_fsdp_save, 2, str(work_dir), timeout=180)[0]
    return work_dir, weights


@pytest.fixture
def sharded_copy(fsdp_ckpts, tmp_path) -> Path:
    """A copy of the two-rank sharded checkpoint that a test may damage."""
    return Path(shutil.copytree(fsdp_ckpts[0] / "sharded.ckpt", tmp_path / "sharded.ckpt"))


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["ckpt", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Read with the safetensors package (an optional extra: skip where it is missing)."""
    return pytest.importorskip("safetensors.torch").load_file(path)


def _tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


# ----------------------------------------------------------------------------- inspect
def test_inspect_tensors_prints_format_meta_and_every_tensor_of_a_full_checkpoint(
    full_ckpt, capsys
):
    code, out, _ = _run(capsys, "inspect", full_ckpt, "--tensors")
    assert code == 0
    assert "format      full (one torch.save file" in out
    assert "SingleDeviceStrategy, 1 rank(s), shardwise" in out
    assert "position    epoch 1, iter 2" in out
    assert "also holds  param_schedulers" in out
    assert "tensors     27 " in out and "state_dict 9" in out and "optimizer 18" in out
    assert "net.0.weight               float32   [8, 4]" in out
    assert "net.1.num_batches_tracked  int64     []" in out
    assert "state/net.0.weight/exp_avg" in out


def test_inspect_summarises_totals_by_state_and_dtype_and_the_largest_tensors(full_ckpt, capsys):
    code, out, _ = _run(capsys, "inspect", full_ckpt)
    state = torch.load(full_ckpt, weights_only=True)
    tensors = [
        (section, name, t)
        for section, tree in (
            ("state_dict", state["state_dict"]),
            ("optimizer", state["optimizer"]),
        )
        for name, t in _flat(tree)
    ]
    assert code == 0 and len(tensors) == 27
    assert "format      full (one torch.save file" in out and "position    epoch 1, iter 2" in out
    assert "SingleDeviceStrategy, 1 rank(s)" in out
    expected: dict[tuple[str, str], list[int]] = {}
    for section, _, t in tensors:
        row = expected.setdefault((section, str(t.dtype).removeprefix("torch.")), [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + t.numel(), row[2] + t.nbytes
    for (section, dtype), (count, numel, nbytes) in expected.items():
        assert re.search(rf"\n  {section} +{dtype} +{count} +{numel:,} +{nbytes} B\n", out), out
    assert "the 10 largest of 27 tensors (--tensors lists every one):" in out
    listed = out.split("the 10 largest of 27 tensors")[1].splitlines()[1:]
    assert len(listed) == 10
    biggest = sorted((t.nbytes for _, _, t in tensors), reverse=True)[:10]
    assert [int(line.split()[-2]) for line in listed] == biggest  # "<n> B", largest first
    assert "net.1.num_batches_tracked" not in out  # the full list only with --tensors


def test_inspect_json_holds_every_tensor_and_the_totals(full_ckpt, capsys):
    code, out, _ = _run(capsys, "inspect", full_ckpt, "--json")
    summary = json.loads(out)
    assert code == 0 and len(summary["tensors"]) == summary["tensor_count"] == 27
    assert all(t["numel"] == math.prod(t["shape"]) for t in summary["tensors"])
    totals = {(t["section"], t["dtype"]): t for t in summary["totals"]}
    for (section, dtype), total in totals.items():
        mine = [t for t in summary["tensors"] if (t["section"], t["dtype"]) == (section, dtype)]
        assert total["count"] == len(mine)
        assert total["numel"] == sum(t["numel"] for t in mine)
        assert total["nbytes"] == sum(t["nbytes"] for t in mine)
    assert sum(t["count"] for t in summary["totals"]) == 27


def _flat(tree, prefix=""):
    """(path, tensor) of every tensor in a nested dict/list."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}/{k}" if prefix else str(k))
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}/{i}" if prefix else str(i))


def test_inspect_json_lists_shapes_dtypes_and_sizes(full_ckpt, capsys):
    code, out, _ = _run(capsys, "inspect", full_ckpt, "--json")
    summary = json.loads(out)
    state = torch.load(full_ckpt, weights_only=True)
    assert code == 0 and summary["format"] == "full" and summary["world_size"] == 1
    assert summary["strategy"] == "SingleDeviceStrategy"
    assert summary["position"] == {"epoch": 1, "iter": 2}
    model = {t["name"]: t for t in summary["tensors"] if t["section"] == "state_dict"}
    assert {k: (v["shape"], v["dtype"]) for k, v in model.items()} == {
        k: (list(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in state["state_dict"].items()
    }
    assert summary["tensor_bytes"] == sum(t["nbytes"] for t in summary["tensors"])
    assert summary["meta"]["rng_states"] == "<1 rank(s)>"
    assert summary["manifest"] is manifest_path(full_ckpt).is_file()


def test_inspect_reads_no_tensor_data_of_a_full_checkpoint(full_ckpt, monkeypatch):
    load = torch.load

    def load_on_meta_only(*args, **kwargs):
        assert kwargs.get("map_location") == "meta", "inspect loaded tensor data"
        return load(*args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("inspect read tensor data")

    monkeypatch.setattr(torch, "load", load_on_meta_only)
    monkeypatch.setattr("shardwise.checkpoint.full.read_bytes", refuse)
    monkeypatch.setattr("shardwise.checkpoint.formats.read_bytes", refuse)
    assert inspect_checkpoint(full_ckpt)["tensor_count"] == 27


def test_inspect_a_two_rank_sharded_checkpoint_shows_global_shapes(fsdp_ckpts, capsys):
    work_dir, weights = fsdp_ckpts
    code, out, _ = _run(capsys, "inspect", work_dir / "sharded.ckpt", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["format"] == "sharded"
    assert summary["world_size"] == 2 and summary["strategy"] == "FSDPStrategy"
    assert summary["position"] == {"iter": 2}
    assert {f["name"] for f in summary["files"]} == {
        "__0.metadata",
        "__1.metadata",
        "layout.json",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    }
    model = {t["name"]: t["shape"] for t in summary["tensors"] if t["section"] == "state_dict"}
    assert model == {k: list(v.shape) for k, v in weights.items()}
    code, text, _ = _run(capsys, "inspect", work_dir / "sharded.ckpt")
    assert "format      sharded (DCP directory, 6 files" in text
    assert "FSDPStrategy, 2 rank(s)" in text and "net.0.weight" in text


def test_inspect_a_local_checkpoint_lists_its_rank_files(fsdp_ckpts, capsys):
    work_dir, _ = fsdp_ckpts
    code, out, _ = _run(capsys, "inspect", work_dir / "local.ckpt")
    assert code == 0
    assert "format      local (directory of 2 rank files" in out
    assert "rank0.pth" in out and "rank1.pth" in out
    assert "shapes below are rank 0's shards" in out


def _model_entries(summary) -> dict[str, dict]:
    return {t["name"]: t for t in summary["tensors"] if t["section"] == "state_dict"}


def _tp_save(path: str) -> dict[str, str]:
    """Two ranks, tensor parallel on both (dp_shard=1, tp=2), save a sharded checkpoint;
    returns every parameter's placements as the run saw them."""
    strategy = FSDPStrategy(
        work_dir=str(Path(path).parent),
        parallelism=dict(tp=2),
        tp_plan=PLAN,
        env_kwargs=dict(randomness=dict(seed=0)),
    )
    model, wrapper = strategy.prepare(TPTransformer(), optim_wrapper=OPTIM)
    run_steps(strategy, model, wrapper, 1)  # the optimizer holds state
    strategy.save_checkpoint(path)
    return {name: [repr(p) for p in param.placements] for name, param in model.named_parameters()}


def test_inspect_shows_the_mesh_and_placements_a_tensor_parallel_checkpoint_was_saved_from(
    tmp_path, capsys
):
    path = tmp_path / "tp.ckpt"
    seen = run_distributed(_tp_save, 2, str(path), timeout=180)[0]
    summary = inspect_checkpoint(path)
    assert summary["mesh"] == {"dp_shard": 1, "tp": 2}
    model = _model_entries(summary)
    q, ln_f = model["blocks.0.q.weight"]["placements"], model["ln_f.weight"]["placements"]
    assert q["mesh"] == ["dp_shard", "tp"] and q["placements"][1] == "Shard(dim=0)"
    assert ln_f == dict(mesh=["dp_shard"], placements=["Shard(dim=0)"])  # not split by TP
    assert q["placements"] == seen["blocks.0.q.weight"]
    assert all("placements" in t for t in model.values())  # every model tensor is a parameter
    optimizer = [t for t in summary["tensors"] if t["section"] == "optimizer"]
    assert optimizer and not any("placements" in t for t in optimizer)
    assert summary["meta"]["placements"] == f"<{len(model)} parameter(s)>"
    text = format_inspection(summary, tensors=True)
    assert "\nmesh        dp_shard=1, tp=2\n" in text
    layout = re.escape("dp_shard×tp: " + ", ".join(q["placements"]))
    assert re.search(rf"\n  blocks\.0\.q\.weight +float32 +\[16, 16\]  {layout}\n", text)
    assert re.search(r"\n  ln_f\.weight +float32 +\[16\] +dp_shard: Shard\(dim=0\)\n", text)
    code, out, _ = _run(capsys, "inspect", path, "--json")
    assert code == 0 and json.loads(out) == summary


def test_inspect_shows_the_mesh_of_a_plain_fsdp_checkpoint_and_none_for_one_device(
    fsdp_ckpts, full_ckpt
):
    work_dir, _ = fsdp_ckpts
    for name in ("sharded.ckpt", "local.ckpt"):
        summary = inspect_checkpoint(work_dir / name)
        assert summary["mesh"] == {"dp_shard": 2}
        placements = _model_entries(summary)["net.0.weight"]["placements"]
        assert placements == dict(mesh=["dp_shard"], placements=["Shard(dim=0)"])
        assert "net.0.weight" in format_inspection(summary, tensors=True)
    single = inspect_checkpoint(full_ckpt)
    assert single["mesh"] is None and "placements" not in single["meta"]
    assert not any("placements" in t for t in single["tensors"])
    assert "mesh " not in format_inspection(single)


# ----------------------------------------------------------------------------- convert
def test_convert_full_to_sharded_and_back_keeps_every_tensor_and_entry(full_ckpt, tmp_path, capsys):
    sharded, back = tmp_path / "sharded", tmp_path / "back.pth"
    assert _run(capsys, "convert", full_ckpt, sharded, "--to", "sharded")[0] == 0
    code, out, _ = _run(capsys, "convert", sharded, back, "--to", "full")
    assert code == 0 and f"wrote {back}" in out
    original = torch.load(full_ckpt, weights_only=True)
    converted = torch.load(back, weights_only=True)  # a plain torch.load still works
    for key in ("state_dict", "optimizer", "param_schedulers"):
        assert _tensors_equal(original[key], converted[key]), key
    meta = converted["meta"]
    assert meta["format"] == "full" and meta["converted_from"]["format"] == "sharded"
    assert meta["epoch"] == 1 and meta["iter"] == 2 and meta["seed"] == original["meta"]["seed"]


def test_a_converted_checkpoint_loads_and_resumes_in_single_device_strategy(full_ckpt, tmp_path):
    saved = torch.load(full_ckpt, weights_only=True)["state_dict"]
    for to in ("full", "sharded"):
        dst = convert_checkpoint(full_ckpt, tmp_path / f"converted_{to}", to=to)
        strategy, model, _, _ = _prepared(tmp_path / f"load_{to}")
        strategy.load_checkpoint(dst)
        assert _tensors_equal(final_weights(strategy), saved)
        strategy, _, wrapper, schedulers = _prepared(tmp_path / f"resume_{to}")
        meta = strategy.resume(dst)["meta"]
        assert meta["iter"] == 2 and schedulers[0].last_step == 2
        assert wrapper.optimizer.state_dict()["state"][0]["step"] == 2


def test_convert_a_two_rank_sharded_checkpoint_to_full(fsdp_ckpts, tmp_path):
    work_dir, weights = fsdp_ckpts
    dst = convert_checkpoint(work_dir / "sharded.ckpt", tmp_path / "full.pth", to="full")
    converted = torch.load(dst, weights_only=True)
    assert _tensors_equal(converted["state_dict"], weights)
    assert converted["meta"]["world_size"] == 2 and len(converted["meta"]["rng_states"]) == 2


@pytest.mark.parametrize("to", ["full", "safetensors"])
def test_converting_a_sharded_checkpoint_reads_its_index_once(
    to, fsdp_ckpts, tmp_path, monkeypatch
):
    """Its metadata fragments were read again for every tensor: 14 s for a 62 MB checkpoint."""
    from shardwise.checkpoint import planning

    reads, read_fragments = [], planning.read_fragments
    monkeypatch.setattr(
        planning, "read_fragments", lambda *a: reads.append(a) or read_fragments(*a)
    )
    convert_checkpoint(fsdp_ckpts[0] / "sharded.ckpt", tmp_path / f"out.{to}", to=to)
    assert len(reads) == 1


def test_exporting_a_sharded_checkpoint_tensor_by_tensor_parses_each_record_kind_once(
    tmp_path, monkeypatch
):
    """Each tensor is read on its own (the export's memory: the largest tensor), by one
    reader that keeps what it learned of the records' layout from one tensor to the next."""
    weights = {f"w{i}": torch.randn(8, 4) for i in range(20)}  # one kind of record
    save_sharded_checkpoint({"state_dict": weights}, tmp_path / "sharded")
    real, parses = torch._C.PyTorchFileReader, []
    monkeypatch.setattr(torch._C, "PyTorchFileReader", lambda *a: parses.append(1) or real(*a))
    convert_checkpoint(tmp_path / "sharded", tmp_path / "out.safetensors", to="safetensors")
    assert len(parses) <= 4  # meta.pt, the byte order, the first record and its torch.load
    exported = _load_safetensors(tmp_path / "out.safetensors")
    assert _tensors_equal(exported, weights)


def test_reading_a_sharded_checkpoint_whole_reports_each_tensor_once(fsdp_ckpts):
    opened = open_checkpoint(fsdp_ckpts[0] / "sharded.ckpt")
    reported = []
    loaded = opened.load(on_tensor=reported.append)
    assert sorted(info.key for info in reported) == sorted(info.key for info in opened.tensors())
    assert _tensors_equal(loaded["state_dict"], fsdp_ckpts[1])


@pytest.mark.parametrize("source", ["full", "sharded"])
def test_safetensors_export_loads_with_safetensors_and_equals_the_weights(
    source, full_ckpt, fsdp_ckpts, tmp_path, capsys
):
    if source == "full":
        src, weights = full_ckpt, torch.load(full_ckpt, weights_only=True)["state_dict"]
    else:
        src, weights = fsdp_ckpts[0] / "sharded.ckpt", fsdp_ckpts[1]
    dst = tmp_path / "model.safetensors"
    code, _, err = _run(capsys, "convert", src, dst, "--to", "safetensors")
    assert code == 0 and "holds the model weights only" in err
    assert _tensors_equal(_load_safetensors(dst), dict(weights))
    with open(dst, "rb") as f:  # the header is padded so that the data is 8-byte aligned
        assert int.from_bytes(f.read(8), "little") % 8 == 0
    with pytest.importorskip("safetensors").safe_open(dst, framework="pt") as f:
        metadata = f.metadata()
    assert metadata["format"] == "pt" and metadata["source_format"] == source
    summary = inspect_checkpoint(dst)
    assert summary["format"] == "safetensors" and summary["tensor_count"] == len(weights)


def test_dtype_bf16_casts_floating_model_tensors_only(full_ckpt, tmp_path, capsys):
    assert _run(capsys, "convert", full_ckpt, tmp_path / "bf16.pth", "--to", "full",
                "--dtype", "bf16")[0] == 0  # fmt: skip
    original = torch.load(full_ckpt, weights_only=True)
    converted = torch.load(tmp_path / "bf16.pth", weights_only=True)
    for key, value in converted["state_dict"].items():
        expected = original["state_dict"][key]
        if expected.is_floating_point():
            assert value.dtype == torch.bfloat16 and torch.equal(value, expected.bfloat16())
        else:
            assert value.dtype == expected.dtype and torch.equal(value, expected)
    assert converted["state_dict"]["net.1.num_batches_tracked"].dtype == torch.int64
    assert _tensors_equal(converted["optimizer"], original["optimizer"])  # keeps its precision
    assert converted["meta"]["converted_from"]["dtype"] == "bfloat16"
    st_file = tmp_path / "bf16.safetensors"
    convert_checkpoint(full_ckpt, st_file, to="safetensors", dtype="fp16")
    loaded = _load_safetensors(st_file)
    assert loaded["net.0.weight"].dtype == torch.float16
    assert loaded["net.1.num_batches_tracked"].dtype == torch.int64


def test_model_only_drops_the_optimizer_schedulers_and_extras(full_ckpt, tmp_path, capsys):
    for to in ("full", "sharded"):
        dst = tmp_path / f"model_only_{to}"
        assert _run(capsys, "convert", full_ckpt, dst, "--to", to, "--model-only")[0] == 0
        summary = inspect_checkpoint(dst)
        assert summary["sections"].keys() == {"state_dict"} and summary["other_keys"] == []
        assert summary["meta"]["converted_from"]["model_only"] is True
    converted = torch.load(tmp_path / "model_only_full", weights_only=True)
    assert set(converted) == {"state_dict", "meta"}


def test_convert_writes_a_manifest_that_verify_checks(full_ckpt, tmp_path, capsys):
    for to, dst in [("full", "a.pth"), ("sharded", "b"), ("safetensors", "c.safetensors")]:
        convert_checkpoint(full_ckpt, tmp_path / dst, to=to)
        assert manifest_path(tmp_path / dst).is_file()
        code, out, _ = _run(capsys, "verify", tmp_path / dst)
        assert code == 0 and f"checked against {manifest_path(tmp_path / dst).name}" in out
    assert (tmp_path / "b" / "manifest.json").is_file()
    assert (tmp_path / "a.pth.manifest.json").is_file()


def test_a_failed_conversion_leaves_nothing_under_the_destination(full_ckpt, tmp_path, monkeypatch):
    def write_half_then_fail(state, path):
        Path(path).write_bytes(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr("shardwise.checkpoint.formats.save_full_checkpoint", write_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        convert_checkpoint(full_ckpt, tmp_path / "out.pth", to="full")
    assert os.listdir(tmp_path) == [full_ckpt.parent.name]  # no out.pth, no staging leftovers


def test_overwrite_replaces_the_destination_and_its_manifest(full_ckpt, tmp_path):
    dst = convert_checkpoint(full_ckpt, tmp_path / "out.pth", to="full")
    convert_checkpoint(full_ckpt, dst, to="full", dtype="bf16", overwrite=True)
    assert torch.load(dst, weights_only=True)["state_dict"]["net.0.weight"].dtype == torch.bfloat16
    assert verify_checkpoint(dst).ok
    assert sorted(os.listdir(tmp_path)) == ["out.pth", "out.pth.manifest.json", "run"]


_MEMORY_PROBE = textwrap.dedent(
    """
    import sys
    from shardwise.checkpoint.convert import convert_checkpoint

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    src, dst = sys.argv[1], sys.argv[2]
    try:  # reset the peak to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = status("VmRSS:")
    convert_checkpoint(src, dst, to="safetensors")
    print(status("VmHWM:") - before)
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("source", ["full", "sharded"])
def test_safetensors_export_peak_memory_stays_near_the_largest_tensor(source, tmp_path):
    tensor_bytes, count = 8 << 20, 20  # 20 tensors of 8 MiB: a 160 MiB model
    weights = {f"layer{i}.weight": torch.full((2048, 1024), float(i)) for i in range(count)}
    state = {"state_dict": weights, "meta": {"world_size": 1}}
    src = tmp_path / "src"
    if source == "full":
        torch.save(state, src)
    else:
        src.mkdir()
        save_sharded_checkpoint(state, src)
    del weights, state
    dst = tmp_path / "model.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, str(src), str(dst)],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    growth = int(proc.stdout.split()[-1])
    assert growth < 4 * tensor_bytes <= count * tensor_bytes / 5, f"peak grew {growth >> 20} MiB"
    assert dst.stat().st_size > count * tensor_bytes


# ----------------------------------------------------------------------------- verify
def test_verify_passes_on_a_good_checkpoint_with_or_without_a_manifest(full_ckpt, capsys):
    manifest_path(full_ckpt).unlink(missing_ok=True)
    code, out, _ = _run(capsys, "verify", full_ckpt)
    assert code == 0 and "OK" in out and "structure only" in out
    assert "no manifest" in out and "only structural checks ran" in out
    write_manifest(full_ckpt)
    code, out, _ = _run(capsys, "verify", full_ckpt)
    assert code == 0 and "checked against epoch_1.pth.manifest.json" in out


def test_verify_write_manifest_records_checksums_for_later_verifies(full_ckpt, capsys):
    manifest_path(full_ckpt).unlink(missing_ok=True)
    code, out, _ = _run(capsys, "verify", full_ckpt, "--write-manifest")
    assert code == 0 and f"recorded {manifest_path(full_ckpt)}" in out
    assert verify_manifest(full_ckpt) == []


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _tensor_data_offset(path: Path) -> int:
    meta = torch.load(path, map_location="meta", weights_only=True)
    return meta["state_dict"]["net.0.weight"].untyped_storage()._checkpoint_offset + 1


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "crc-only"])
def test_verify_fails_naming_a_full_file_with_one_flipped_byte(manifest, full_ckpt, capsys):
    if manifest:
        write_manifest(full_ckpt)
    else:
        manifest_path(full_ckpt).unlink(missing_ok=True)
    _flip_byte(full_ckpt, _tensor_data_offset(full_ckpt))
    code, _, err = _run(capsys, "verify", full_ckpt)
    assert code == 1 and f"FAILED {full_ckpt}:" in err
    assert ("XXH3-64" if manifest else "record 'data/") in err


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "crc-only"])
def test_verify_fails_naming_a_sharded_data_file_with_one_flipped_byte(
    manifest, fsdp_ckpts, tmp_path, capsys
):
    # without a manifest only the records' own CRC-32s can tell: a background save keeps them
    name = "sharded.ckpt" if manifest else "sharded_async.ckpt"
    sharded_copy = Path(shutil.copytree(fsdp_ckpts[0] / name, tmp_path / name))
    if manifest:
        write_manifest(sharded_copy)
    else:
        manifest_path(sharded_copy).unlink(missing_ok=True)
    shard = sharded_copy / "__1_0.distcp"
    _flip_byte(shard, shard.stat().st_size // 2)
    code, _, err = _run(capsys, "verify", sharded_copy)
    assert code == 1 and f"FAILED {shard}:" in err
    assert "__0_0.distcp" not in err


def test_a_sharded_save_without_its_manifest_is_checked_chunk_by_chunk(sharded_copy, capsys):
    # each record's checksum is in its rank's metadata fragment (checkpoint/records.py)
    records = [name for name in os.listdir(sharded_copy) if name.endswith(".distcp")]
    assert records and read_manifest(sharded_copy) is not None  # the whole files' checksums
    assert _run(capsys, "verify", sharded_copy)[0] == 0
    manifest_path(sharded_copy).unlink()
    code, out, _ = _run(capsys, "verify", sharded_copy)
    assert code == 0 and "carry no CRC-32" not in out
    shard = sharded_copy / "__1_0.distcp"
    _flip_byte(shard, shard.stat().st_size // 2)
    code, _, err = _run(capsys, "verify", sharded_copy)
    assert code == 1 and f"FAILED {shard}:" in err and "checksum" in err


@pytest.mark.parametrize(
    "deleted", ["__0_0.distcp", "meta.pt", "__0.metadata", "__1.metadata", "layout.json"]
)
def test_verify_fails_naming_a_deleted_sharded_file(deleted, sharded_copy, capsys):
    assert _run(capsys, "verify", sharded_copy)[0] == 0
    (sharded_copy / deleted).unlink()
    code, _, err = _run(capsys, "verify", sharded_copy)
    assert code == 1 and f"FAILED {sharded_copy / deleted}: missing" in err


def test_verify_fails_naming_a_file_the_manifest_lists_but_is_gone(sharded_copy, capsys):
    write_manifest(sharded_copy)
    (sharded_copy / "meta.pt").unlink()
    code, _, err = _run(capsys, "verify", sharded_copy)
    assert code == 1
    assert f"FAILED {sharded_copy / 'meta.pt'}: missing (the manifest lists it)" in err


def test_verify_fails_when_a_local_checkpoint_misses_a_rank_file(fsdp_ckpts, tmp_path, capsys):
    local = Path(shutil.copytree(fsdp_ckpts[0] / "local.ckpt", tmp_path / "local.ckpt"))
    assert _run(capsys, "verify", local)[0] == 0
    (local / "rank1.pth").unlink()
    code, _, err = _run(capsys, "verify", local)
    assert code == 1 and f"FAILED {local / 'rank1.pth'}: missing: meta records world_size 2" in err


def test_verify_manifest_reports_a_changed_size(tmp_path, full_ckpt):
    write_manifest(full_ckpt)
    assert verify_manifest(full_ckpt) == []
    with open(full_ckpt, "ab") as f:
        f.write(b"\0")
    (problem,) = verify_manifest(full_ckpt)
    assert problem.file == "epoch_1.pth" and "the manifest recorded" in problem.reason


# ----------------------------------------------------------------------------- console
BAR_TEXT = re.compile(r"\d+%\||[kMG]?B/s|\?B/s|it/s")


def _cli(*argv: Any, **streams: Any) -> subprocess.CompletedProcess:
    """The real ``shardwise ckpt`` command in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "shardwise.cli", "ckpt", *map(str, argv)],
        cwd=REPO,
        timeout=120,
        **streams,
    )


@pytest.mark.parametrize(
    "command",
    [
        "convert full",
        "convert safetensors",
        "verify",
        "verify --write-manifest",
        "inspect",
        "index",
    ],
)
def test_no_command_prints_a_bar_into_a_pipe(command, sharded_copy, tmp_path):
    """A bar redraws itself with carriage returns: in a pipe or a log file every redraw
    stays, hundreds of them on one line."""
    name, *rest = command.split()
    argv = {
        "convert": [sharded_copy, tmp_path / "out", "--to", *rest],
        "verify": [sharded_copy, *rest],
        "inspect": [sharded_copy],
        "index": [sharded_copy],
    }[name]
    proc = _cli(name, *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "\r" not in out + err
    assert not BAR_TEXT.search(out + err), out + err


def test_verify_draws_its_bar_when_stderr_is_a_terminal(full_ckpt):
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardwise.cli", "ckpt", "verify", str(full_ckpt)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:  # read while it runs: what is left when the child closes it is lost
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    out, _ = proc.communicate(timeout=120)
    terminal = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0 and out.decode().startswith("OK ")
    assert "\r" in terminal and "verify epoch_1.pth" in terminal  # drawn, then cleared


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("command", ["inspect", "verify", "convert", "index"])
def test_a_path_that_does_not_exist_is_named_with_exit_status_2(command, tmp_path, capsys):
    missing = tmp_path / "nope.pth"
    extra = [tmp_path / "out", "--to", "full"] if command == "convert" else []
    code, _, err = _run(capsys, command, missing, *extra)
    assert code == 2 and f"{str(missing)!r} does not exist" in err


@pytest.mark.parametrize(
    ("option", "value", "choices"),
    [("--to", "onnx", ("full", "sharded", "safetensors")), ("--dtype", "int8", ("bf16", "fp32"))],
)
def test_an_unknown_option_value_is_named_with_the_choices(
    option, value, choices, full_ckpt, tmp_path, capsys
):
    argv = ["convert", full_ckpt, tmp_path / "out", "--to", "full", option, value]
    with pytest.raises(SystemExit) as exit_info:
        _run(capsys, *argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"invalid choice: '{value}'" in err
    assert all(choice in err for choice in choices)


def test_the_api_names_an_unknown_format_or_dtype(full_ckpt, tmp_path):
    with pytest.raises(ValueError, match=r"to='onnx' .* use one of full, sharded, safetensors"):
        convert_checkpoint(full_ckpt, tmp_path / "out", to="onnx")
    with pytest.raises(ValueError, match=r"dtype='int8' is not a dtype name .* \['bf16'"):
        convert_checkpoint(full_ckpt, tmp_path / "out", to="full", dtype="int8")
    assert not (tmp_path / "out").exists()


def test_an_existing_destination_is_refused_unless_overwrite(full_ckpt, tmp_path, capsys):
    dst = tmp_path / "taken.pth"
    dst.write_bytes(b"keep me")
    code, _, err = _run(capsys, "convert", full_ckpt, dst, "--to", "full")
    assert code == 2 and f"{str(dst)!r} already exists" in err and "--overwrite" in err
    assert dst.read_bytes() == b"keep me"
    code, _, err = _run(capsys, "convert", full_ckpt, dst, "--to", "full", "--overwrite")
    assert code == 2 and "not a committed shardwise checkpoint" in err
    assert dst.read_bytes() == b"keep me"  # --overwrite replaces checkpoints, nothing else
    dst.unlink()
    assert _run(capsys, "convert", full_ckpt, dst, "--to", "full")[0] == 0
    assert _run(capsys, "convert", full_ckpt, dst, "--to", "sharded", "--overwrite")[0] == 0
    assert dst.is_dir() and verify_checkpoint(dst).ok


def test_converting_onto_or_into_the_source_is_refused(full_ckpt, fsdp_ckpts, tmp_path):
    with pytest.raises(ValueError, match="is the source checkpoint"):
        convert_checkpoint(full_ckpt, full_ckpt, to="full", overwrite=True)
    sharded = fsdp_ckpts[0] / "sharded.ckpt"
    with pytest.raises(ValueError, match="inside the source checkpoint"):
        convert_checkpoint(sharded, sharded / "full.pth", to="full")


def test_a_truncated_checkpoint_is_named_with_exit_status_1(full_ckpt, tmp_path, capsys):
    cut = tmp_path / "cut.pth"
    cut.write_bytes(full_ckpt.read_bytes()[:1000])
    for argv in (["inspect", cut], ["convert", cut, tmp_path / "out", "--to", "full"]):
        code, _, err = _run(capsys, *argv)
        assert code == 1 and str(cut) in err and "truncated" in err
    code, _, err = _run(capsys, "verify", cut)
    assert code == 1 and f"FAILED {cut}: not a readable torch.save archive" in err
    assert not (tmp_path / "out").exists()


def test_a_local_checkpoint_is_not_converted_and_the_way_out_is_given(fsdp_ckpts, tmp_path):
    with pytest.raises(CheckpointError, match="state_dict_cfg='sharded' or 'full'"):
        convert_checkpoint(fsdp_ckpts[0] / "local.ckpt", tmp_path / "out", to="full")


def test_a_directory_that_is_no_checkpoint_is_named(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = _run(capsys, "inspect", tmp_path)
    assert code == 1 and "is a directory but not a checkpoint" in err


@pytest.mark.parametrize("algorithm", ["sha256", "crc32"])
def test_a_manifest_recorded_by_an_earlier_version_still_verifies(tmp_path, algorithm):
    import hashlib
    import zlib

    from shardwise.checkpoint.manifest import verify_manifest

    path = tmp_path / "old.pth"
    torch.save({"state_dict": {"w": torch.arange(10.0)}}, path)
    data = path.read_bytes()
    digest = (
        hashlib.sha256(data).hexdigest() if algorithm == "sha256" else f"{zlib.crc32(data):08x}"
    )
    entry = {"size": len(data), algorithm: digest}
    manifest = {"manifest_version": 1, "algorithm": algorithm, "files": {"old.pth": entry}}
    (tmp_path / "old.pth.manifest.json").write_text(json.dumps(manifest))
    assert verify_manifest(path) == []
    changed = bytearray(data)
    changed[-30] ^= 1
    path.write_bytes(bytes(changed))
    label = {"sha256": "SHA-256", "crc32": "CRC-32"}[algorithm]
    assert label in str(verify_manifest(path)[0])
