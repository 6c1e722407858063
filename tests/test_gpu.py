"""The CUDA path: strategies, precision, compile, checkpoints and the GPT example on one GPU.

Every case is marked ``gpu`` (``make gpu-check`` runs them with ``pytest -m gpu``). Without
CUDA they skip, unless ``SHARDWISE_GPU_CHECK_ON_CPU=1``: then they run on the CPU (gloo, the
CPU device, smaller sizes) as a dry run of the same code, so that they cannot rot where CI has
no GPU. What the dry run does differently, case by case:

- the 1-rank groups are gloo instead of NCCL;
- ``AmpOptimWrapper`` fp16 runs with the CPU's ``GradScaler`` (CPU autocast has fp16);
- ``torch.compile`` uses ``backend='eager'`` (inductor on the GPU;
  ``SHARDWISE_GPU_CHECK_COMPILE_BACKEND`` overrides either);
- host buffers of an asynchronous save are not pinned (pinning needs CUDA), and "the other
  device" of a checkpoint's move is the CPU on both sides;
- the random state checked bit for bit is the CPU generator's (CUDA's as well on the GPU);
- the GPT example trains ``SHARDWISE_GPU_CHECK_GPT_ITERS`` iterations (50 on the GPU, 10 on the
  CPU) of a smaller model.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from shardwise.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from tests.distributed import REPO, free_port
from tests.test_fsdp import Block, TinyTransformer, full_weights, lm_batch, lm_loss
from tests.toy import ToyNet, toy_batch

CUDA = torch.cuda.is_available()
ON_CPU = os.environ.get("SHARDWISE_GPU_CHECK_ON_CPU") == "1"
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")
BACKEND = "nccl" if CUDA else "gloo"
COMPILE_BACKEND = os.environ.get(
    "SHARDWISE_GPU_CHECK_COMPILE_BACKEND", "inductor" if CUDA else "eager"
)
GPT_ITERS = int(os.environ.get("SHARDWISE_GPU_CHECK_GPT_ITERS", "50" if CUDA else "10"))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not CUDA and not ON_CPU,
        reason="needs a CUDA device (SHARDWISE_GPU_CHECK_ON_CPU=1 runs it on the CPU as a dry run)",
    ),
]

OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2))


@pytest.fixture
def one_rank_launch(monkeypatch):
    """The variables torchrun gives a world of one process: the strategy starts the group
    itself (``init_dist``: ``torch.cuda.set_device``, then NCCL on CUDA)."""
    for name, value in dict(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    ).items():
        monkeypatch.setenv(name, value)


def _lm_steps(model, optim_wrapper, steps: int, same_batch: bool = True) -> list[float]:
    """Train on lm batches moved to DEVICE; one fixed batch by default (its loss must fall)."""
    losses = []
    for step in range(steps):
        idx, targets = (t.to(DEVICE) for t in lm_batch(0 if same_batch else step))
        with optim_wrapper.optim_context(model):
            loss = lm_loss(model, idx, targets)
        optim_wrapper.update_params(loss)
        losses.append(loss.item())
    return losses


def _assert_learns(losses: list[float]) -> None:
    assert all(map(torch.isfinite, torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses


def _devices(model: torch.nn.Module) -> set[str]:
    """Where the parameters compute: a DTensor's mesh device type, else the tensor's."""
    return {
        getattr(p, "device_mesh", None).device_type if hasattr(p, "device_mesh") else p.device.type
        for p in model.parameters()
    }


# ----------------------------------------------------------------------------- strategies
@pytest.mark.parametrize("name", ["SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy"])
def test_every_strategy_trains_on_one_device_with_a_one_rank_group(tmp_path, request, name):
    """SingleDeviceStrategy without a launcher (no group); DDP and FSDP under torchrun's
    variables for a world of one, starting the group themselves."""
    if name != "SingleDeviceStrategy":
        request.getfixturevalue("one_rank_launch")
    cls = {"SingleDeviceStrategy": SingleDeviceStrategy, "DDPStrategy": DDPStrategy}.get(name)
    if name == "FSDPStrategy":
        strategy = FSDPStrategy(
            work_dir=str(tmp_path), model_wrapper=dict(auto_wrap_policy={Block})
        )
    else:
        strategy = cls(work_dir=str(tmp_path))
    model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    assert strategy.device == DEVICE
    if name == "SingleDeviceStrategy":
        assert not torch_dist.is_initialized()
    else:
        assert torch_dist.get_backend() == BACKEND and torch_dist.get_world_size() == 1
        if CUDA:
            assert torch.cuda.current_device() == 0
    assert _devices(model) == {DEVICE.type}
    _assert_learns(_lm_steps(model, wrapper, 4))


def test_fsdp2_trains_in_bf16_with_its_parameters_offloaded_to_the_cpu(tmp_path):
    strategy = FSDPStrategy(
        work_dir=str(tmp_path),
        model_wrapper=dict(
            auto_wrap_policy={Block},
            mixed_precision=dict(param_dtype="bf16", reduce_dtype="fp32"),
            cpu_offload=True,
        ),
    )
    model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    assert torch_dist.get_backend() == BACKEND  # no launcher: FSDP starts a 1-rank group
    shards = [p.to_local() for p in model.parameters()]
    assert {s.device.type for s in shards} == {"cpu"} and {s.dtype for s in shards} == {
        torch.float32
    }
    if CUDA:  # FSDP2 pins offloaded shards (pin_memory=True by default)
        assert all(s.is_pinned() for s in shards)
    seen = []
    hook = model.blocks[0].fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    _assert_learns(_lm_steps(model, wrapper, 4))
    hook.remove()
    assert set(seen) == {torch.bfloat16}  # compute in bf16, on the mesh's device
    assert _devices(model) == {DEVICE.type}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_amp_optim_wrapper_trains_in_reduced_precision(tmp_path, dtype):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path))
    model, wrapper = strategy.prepare(
        TinyTransformer(), optim_wrapper=dict(type="AmpOptimWrapper", dtype=dtype, **OPTIM)
    )
    with wrapper.optim_context(model):
        logits = model(lm_batch(0)[0].to(DEVICE))
    assert logits.dtype == getattr(torch, dtype) and logits.device.type == DEVICE.type
    assert (wrapper.loss_scaler is not None) == (dtype == "float16")
    _assert_learns(_lm_steps(model, wrapper, 4))
    if dtype == "float16":
        scale = wrapper.state_dict()["loss_scaler"]["scale"]
        assert 0 < float(scale) < float("inf")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_torch_compile_under_fsdp_trains(tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    strategy = FSDPStrategy(work_dir=str(tmp_path), model_wrapper=dict(auto_wrap_policy={Block}))
    model, wrapper = strategy.prepare(
        TinyTransformer(), optim_wrapper=OPTIM, compile=dict(backend=COMPILE_BACKEND)
    )
    try:
        _assert_learns(_lm_steps(model, wrapper, 3))
        assert counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    finally:
        torch._dynamo.reset()


def test_tensor_parallel_on_a_one_rank_mesh_matches_the_unsplit_model():
    """With tp=1 FSDPStrategy applies no plan (it logs that), so the plan is applied here, on a
    one-rank 'tp' mesh: the example's own plan turns its layers into DTensors on the device,
    and training matches the unsplit model's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from shardwise.strategies import apply_tensor_parallel, parse_tp_plan, resolve_styles

    chargpt = _example_module()
    torch_dist.init_process_group(BACKEND, store=torch_dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(DEVICE.type, (1,), mesh_dim_names=("tp",))

    def build():
        torch.manual_seed(0)
        return chargpt.CharGPT(n_layer=2, n_head=2, n_embd=32, block_size=16).to(DEVICE)

    plan = parse_tp_plan("auto")
    split = build()
    split = apply_tensor_parallel(split, mesh, plan, resolve_styles(split, plan, 1))
    plain = build()
    assert isinstance(split.blocks[0].attn.q.weight, DTensor)
    losses = {}
    for key, model in (("split", split), ("plain", plain)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        idx = torch.randint(0, 96, (4, 17), generator=gen).to(DEVICE)
        losses[key] = []
        for _ in range(3):
            loss = model(idx[:, :-1], idx[:, 1:])["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[key].append(loss.item())
    _assert_learns(losses["split"])
    torch.testing.assert_close(losses["split"], losses["plain"], rtol=1e-4, atol=1e-5)


def _example_module():
    """``examples/chargpt.py`` imported as ``chargpt`` (the name configs import it by)."""
    folder = str(REPO / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("chargpt")


# ----------------------------------------------------------------------------- checkpoints
def _staged_tensors(tree) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    leaves = [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
    return [t.to_local() if isinstance(t, DTensor) else t for t in leaves]


@pytest.mark.parametrize("fmt", ["sharded", "full"])
def test_async_save_stages_into_pinned_host_memory_and_the_checkpoint_resumes(
    tmp_path, monkeypatch, fmt
):
    strategy = FSDPStrategy(
        work_dir=str(tmp_path),
        state_dict_cfg=fmt,
        async_save=True,
        model_wrapper=dict(auto_wrap_policy={Block}),
    )
    model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    _lm_steps(model, wrapper, 2)
    saved = full_weights(model)
    stager = strategy.checkpointer.stager
    staged = []
    original = stager.stage
    monkeypatch.setattr(stager, "stage", lambda state: staged.append(original(state)) or staged[-1])
    strategy.save_checkpoint(tmp_path / "ckpt")
    _lm_steps(model, wrapper, 2)  # training goes on while the save is written
    strategy.wait_for_checkpoint()
    tensors = _staged_tensors(staged)
    assert staged and tensors, "the save staged nothing"
    assert {t.device.type for t in tensors} == {"cpu"}  # no second copy in GPU memory
    if CUDA:
        unpinned = [tuple(t.shape) for t in tensors if not t.is_pinned()]
        assert not unpinned, f"staging buffers not pinned: {unpinned}"
    assert not all(torch.equal(v, saved[k]) for k, v in full_weights(model).items())

    again = FSDPStrategy(
        work_dir=str(tmp_path / "again"), model_wrapper=dict(auto_wrap_policy={Block})
    )
    model2, _ = again.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    again.resume(tmp_path / "ckpt")
    got = full_weights(model2)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)


# One side of a checkpoint's move between devices, run in a process of its own so that the CPU
# side can hide the GPU (CUDA_VISIBLE_DEVICES=''): it trains and saves, or resumes and reports.
def _move_side(work_dir: str, kind: str, action: str) -> None:
    work = Path(work_dir)
    if kind == "fsdp":
        strategy = FSDPStrategy(
            work_dir=str(work / action), model_wrapper=dict(auto_wrap_policy={Block})
        )
        ckpt = work / "ckpt"
    else:
        strategy = SingleDeviceStrategy(work_dir=str(work / action))
        ckpt = work / "ckpt.pth"
    model, wrapper = strategy.prepare(TinyTransformer(), optim_wrapper=OPTIM)
    if action == "save":
        _lm_steps(model, wrapper, 2, same_batch=False)
        strategy.save_checkpoint(ckpt)
    else:
        strategy.resume(ckpt)
    weights = full_weights(model)
    # the second step's loss follows an update that used the optimizer's state
    step_after = _lm_steps(model, wrapper, 2, same_batch=False)[1]
    device = str(strategy.device)
    torch.save(dict(weights=weights, device=device, loss=step_after), work / f"{action}.pt")


def _side_in_process(work_dir: Path, kind: str, action: str) -> dict:
    _move_side(str(work_dir), kind, action)
    return torch.load(work_dir / f"{action}.pt", weights_only=True)


def _side_on_cpu(work_dir: Path, kind: str, action: str) -> dict:
    call = f"_move_side({str(work_dir)!r}, {kind!r}, {action!r})"
    code = f"from tests.test_gpu import _move_side; {call}"
    path = os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return torch.load(work_dir / f"{action}.pt", weights_only=True)


@pytest.mark.parametrize("kind", ["single", "fsdp"])
@pytest.mark.parametrize("direction", ["gpu_to_cpu", "cpu_to_gpu"])
def test_a_checkpoint_resumes_on_the_other_device(tmp_path, kind, direction):
    """Saved on the GPU, resumed on the CPU (the state mapped to the resuming strategy's
    device), and the reverse; the resumed weights are the saved ones, and training goes on
    the same on either side."""
    save, resume = (
        (_side_in_process, _side_on_cpu)
        if direction == "gpu_to_cpu"
        else (_side_on_cpu, _side_in_process)
    )
    saved = save(tmp_path, kind, "save")
    resumed = resume(tmp_path, kind, "resume")
    assert (saved["device"], resumed["device"]) == (
        (str(DEVICE), "cpu") if direction == "gpu_to_cpu" else ("cpu", str(DEVICE))
    )
    weights = resumed["weights"]
    assert weights.keys() == saved["weights"].keys()
    assert all(torch.equal(weights[k], v) for k, v in saved["weights"].items())
    assert resumed["loss"] == pytest.approx(saved["loss"], rel=1e-3)  # the optimizer's state too


def test_resume_restores_the_random_state_bit_exactly(tmp_path):
    """A checkpoint holds the CUDA generators' states (and the CPU's); a resume puts them back,
    so the next random draws on the device are the ones the uninterrupted run would make."""

    def state():
        return torch.cuda.get_rng_state() if CUDA else torch.get_rng_state()

    strategy = SingleDeviceStrategy(
        work_dir=str(tmp_path), env_kwargs=dict(randomness=dict(seed=3))
    )
    model, wrapper = strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    x, y = (t.to(DEVICE) for t in toy_batch(0))
    for _ in range(2):  # dropout draws from the device's generator
        with wrapper.optim_context(model):
            loss = (model(x) - y).pow(2).mean()
        wrapper.update_params(loss)
    strategy.save_checkpoint(tmp_path / "ckpt.pth")
    at_save, cpu_at_save = state(), torch.get_rng_state()
    expected = torch.rand(64, device=DEVICE), torch.randn(64, device=DEVICE), torch.rand(8)

    torch.rand(1000, device=DEVICE)  # the generators move on
    torch.manual_seed(12345)
    resumed = SingleDeviceStrategy(
        work_dir=str(tmp_path / "resumed"), env_kwargs=dict(randomness=dict(seed=99))
    )
    model2, _ = resumed.prepare(ToyNet(), optim_wrapper=OPTIM)
    resumed.resume(tmp_path / "ckpt.pth")
    assert torch.equal(state(), at_save) and torch.equal(torch.get_rng_state(), cpu_at_save)
    got = torch.rand(64, device=DEVICE), torch.randn(64, device=DEVICE), torch.rand(8)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


# ----------------------------------------------------------------------------- the GPT example
def test_the_gpt_example_trains_fully_sharded_on_the_device(tmp_path):
    work_dir = tmp_path / "gpt"
    small = [] if CUDA else ["model.n_layer=2", "model.n_embd=64", "train_dataloader.batch_size=8"]
    options = [
        f"train_cfg.max_iters={GPT_ITERS}",
        f"train_cfg.val_interval={GPT_ITERS}",
        f"param_scheduler.0.end={max(GPT_ITERS // 5, 1)}",
        f"param_scheduler.1.begin={max(GPT_ITERS // 5, 1)}",
        f"default_hooks.logger.interval={max(GPT_ITERS // 5, 1)}",
        f"default_hooks.checkpoint.interval={GPT_ITERS}",
        "custom_hooks.0.max_new_tokens=40",
        "train_dataloader.dataset.max_chars=300000",
        "val_dataloader.dataset.max_chars=100000",
        *small,
    ]
    path = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardwise.cli",
            "train",
            str(REPO / "examples" / "gpt_fsdp.py"),
            "--work-dir",
            str(work_dir),
            "--cfg-options",
            *options,
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    output = proc.stdout + proc.stderr
    assert f"started a 1-rank {BACKEND} group" in output
    train = [
        record
        for log in sorted(work_dir.glob("*/metrics.jsonl"))
        for record in map(json.loads, log.read_text().splitlines())
        if record["mode"] == "train"
    ]
    assert train and train[-1]["iter"] == GPT_ITERS
    assert train[-1]["loss"] < train[0]["loss"] - 0.3, [r["loss"] for r in train]
    last = Path((work_dir / "last_checkpoint").read_text().strip())
    assert last.stem == f"iter_{GPT_ITERS}" and last.exists()  # the last checkpoint committed
