"""The checkpoint matrix's engine: a generated case (model, optimizer, source layout, format,
operation, target layout) and its round trip on real process groups.

A :class:`Case` is plain data (it pickles to the ranks and prints as a regression test). One
round trip (:func:`round_trip`) runs in two sets of fresh processes:

1. the *source* layout trains ``steps`` steps, saves (sync or async), takes a snapshot (the
   full weights, buffers, optimizer state and param groups, gathered by torch's own
   ``get_*_state_dict``, not by shardwise's checkpoint code; scheduler states; each rank's
   next random draws), then trains one more step: the uninterrupted run's next loss;
2. the test process runs the operation's offline part (``ckpt convert`` chains, ``ckpt
   verify`` of every checkpoint), in process, through the CLI's ``main``;
3. the *target* layout builds the same model from another seed, resumes (or loads the
   weights), takes the same snapshot and trains the same next step.

The property (:func:`check_round_trip`): the snapshots are equal bit for bit (the random
draws where the world size is the same), and the next loss equals the uninterrupted run's:
bit for bit on the same layout, to 1e-10 in float64 elsewhere (another reduction order).
A ``local`` checkpoint loads only on the layout that wrote it and is not converted: there the
property is a refusal naming why, with the target's state untouched.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tests.distributed import run_distributed

BATCH, SEQ = 12, 3  # 12 rows split evenly over 1, 2, 3 or 4 data-parallel ranks
TOLERANCE = 1e-10  # float64, another reduction order

OPTIMIZERS: dict[str, dict[str, Any]] = {
    "SGD-momentum": dict(type="SGD", lr=0.1, momentum=0.9),
    "SGD-nesterov": dict(type="SGD", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "Adam": dict(type="Adam", lr=1e-2),
    "Adam-amsgrad": dict(type="Adam", lr=1e-2, amsgrad=True),
    "AdamW": dict(type="AdamW", lr=1e-2, weight_decay=0.01),
    "AdamW-amsgrad": dict(type="AdamW", lr=1e-2, amsgrad=True),
    "Adagrad": dict(type="Adagrad", lr=0.1),
    "RMSprop-momentum": dict(type="RMSprop", lr=1e-2, momentum=0.9),
    "RMSprop-centered": dict(type="RMSprop", lr=1e-2, centered=True),
    "NAdam": dict(type="NAdam", lr=1e-2),
    "RAdam": dict(type="RAdam", lr=1e-2),
    "Adamax": dict(type="Adamax", lr=1e-2),
    "Adadelta": dict(type="Adadelta", lr=1.0),
    "ASGD": dict(type="ASGD", lr=1e-2, t0=1),
    "Rprop": dict(type="Rprop", lr=1e-2),
    "Adafactor": dict(type="torch.optim.Adafactor", lr=1e-2),
}
#: optimizers that cannot step DTensor parameters (torch 2.13): refused by FSDPStrategy
NO_DTENSOR_STEP = ("Rprop", "torch.optim.Adafactor")

SCHEDULERS: dict[str, list[dict[str, Any]]] = {
    "none": [],
    "StepLR": [dict(type="StepLR", step_size=1, gamma=0.5, by_epoch=False)],
    "LinearLR+Cosine": [
        dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=2),
        dict(type="CosineAnnealingLR", T_max=6, by_epoch=False, begin=2, end=8),
    ],
}

#: name -> (world size, strategy type, keywords): the layouts a checkpoint is written and read on
LAYOUTS: dict[str, tuple[int, str, dict[str, Any]]] = {
    "single": (1, "SingleDeviceStrategy", {}),
    "ddp2": (2, "DDPStrategy", {}),
    "fsdp2": (2, "FSDPStrategy", {}),
    "fsdp3": (3, "FSDPStrategy", {}),
    "hsdp2x2": (4, "FSDPStrategy", dict(parallelism=dict(dp_replicate=2, dp_shard=2))),
    "tp2": (2, "FSDPStrategy", dict(parallelism=dict(tp=2))),
    "fsdp2xtp2": (4, "FSDPStrategy", dict(parallelism=dict(dp_shard=2, tp=2))),
    "pp2": (2, "FSDPStrategy", dict(parallelism=dict(pp=2))),
}
TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}
PIPELINE = dict(split_points=["blocks.1"], schedule="1F1B", n_microbatches=2)

#: the formats each layout writes (pipeline stages: one sharded checkpoint of every stage)
FORMATS = {"single": ("full",), "ddp2": ("full",), "pp2": ("sharded",)}
FSDP_FORMATS = ("full", "sharded", "local")

#: what happens between save and the target run
OPERATIONS = (
    "resume",  # on the target layout
    "convert-full",  # ckpt convert to full, then resume
    "convert-full-sharded",  # to full and back to sharded, then resume
    "safetensors",  # to safetensors and back to full (weights only), then load the weights
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The generated model: a token embedding, blocks (up, down projections), a head."""

    vocab: int = 3  # the head's rows: fewer than the ranks leaves shards empty
    width: int = 4
    hidden: tuple[int, ...] = (4, 4)
    bias: bool = True
    norm: bool = False  # a LayerNorm per block
    gain: bool = False  # a 1-element parameter per block
    cls: bool = False  # a [1, 1, width] token (a ViT's cls_token)
    tied: bool = False  # the head's weight is the embedding's
    buffer: bool = True  # a persistent buffer per block, changed by every training forward


@dataclasses.dataclass(frozen=True)
class OptimSpec:
    optimizer: str = "AdamW"  # a key of OPTIMIZERS
    groups: bool = False  # a second param group (paramwise_cfg: the head at lr_mult 0.5)
    scheduler: str = "none"  # a key of SCHEDULERS
    multi: bool = False  # an OptimWrapperDict: one optimizer for tok+blocks, one for the head


@dataclasses.dataclass(frozen=True)
class Case:
    """One round trip: ``steps`` training steps on ``source``, a save in ``fmt``, the
    ``operation``, then ``target``."""

    model: ModelSpec = ModelSpec()
    optim: OptimSpec = OptimSpec()
    source: str = "fsdp2"
    fmt: str = "sharded"
    async_save: bool = False
    wrap_blocks: bool = True  # FSDP: each block its own fully_shard unit
    operation: str = "resume"
    target: str = "fsdp2"
    steps: int = 2
    storage: str = "local"  # where the source saves: 'local' disk or 's3' (tests/s3_server.py)


#: where a checkpoint is written: local disk, or an S3 server over HTTP (moto's server mode)
STORAGES = ("local", "s3")


# ----------------------------------------------------------------------------- the model
class Block(nn.Module):
    def __init__(self, spec: ModelSpec, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(spec.width, hidden, bias=spec.bias)
        self.down = nn.Linear(hidden, spec.width, bias=spec.bias)
        self.norm = nn.LayerNorm(spec.width) if spec.norm else None
        self.gain = nn.Parameter(torch.ones(1)) if spec.gain else None
        if spec.buffer:
            self.register_buffer("calls", torch.zeros(1, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and hasattr(self, "calls"):
            self.calls.add_(1)
        y = self.down(torch.tanh(self.up(x)))
        if self.gain is not None:
            y = y * self.gain
        x = x + y
        return self.norm(x) if self.norm is not None else x


class Embed(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.table = nn.Embedding(spec.vocab, spec.width)
        self.cls = nn.Parameter(torch.randn(1, 1, spec.width)) if spec.cls else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.table(idx)
        return x + self.cls if self.cls is not None else x


class MatrixNet(nn.Module):
    """A model written to be split into pipeline stages (a stage skips the parts it lacks)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = Embed(spec)
        self.blocks = nn.ModuleList(Block(spec, h) for h in spec.hidden)
        self.head = nn.Linear(spec.width, spec.vocab, bias=spec.bias)
        if spec.tied:
            self.head.weight = self.tok.table.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            x = self.tok(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batch(spec: ModelSpec, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (the same on every rank and layout)."""
    g = torch.Generator().manual_seed(1000 + step)
    idx = torch.randint(spec.vocab, (BATCH, SEQ), generator=g)
    return idx, torch.randint(spec.vocab, (BATCH, SEQ), generator=g)


# ----------------------------------------------------------------------------- validity
def layout_fits(name: str, spec: ModelSpec, optim: OptimSpec) -> bool:
    """Whether ``name`` can run the model and optimizer at all (not a checkpoint question):
    tensor parallelism splits the hidden sizes evenly (shardwise refuses otherwise), and a
    pipeline stage holds the embedding or the head alone (no tying, one optimizer each)."""
    parallelism = LAYOUTS[name][2].get("parallelism", {})
    if parallelism.get("tp") and any(h % parallelism["tp"] for h in spec.hidden):
        return False
    if parallelism.get("pp"):
        return not spec.tied and not optim.multi and len(spec.hidden) >= 2
    return not (optim.multi and spec.tied)


def formats_of(layout: str) -> tuple[str, ...]:
    return FORMATS.get(layout, FSDP_FORMATS)


def has_dtensors(layout: str) -> bool:
    """Whether ``layout``'s parameters are DTensors (pipeline stages alone stay plain)."""
    kind, parallelism = LAYOUTS[layout][1], LAYOUTS[layout][2].get("parallelism", {})
    return kind == "FSDPStrategy" and set(parallelism) != {"pp"}


def refused(case: Case) -> str | None:
    """Why the round trip is refused (an optimizer that cannot step DTensors on a sharded
    layout; a local checkpoint elsewhere than where it was written, or converted), or None
    when it must succeed."""
    if OPTIMIZERS[case.optim.optimizer]["type"] in NO_DTENSOR_STEP and (
        has_dtensors(case.source) or has_dtensors(case.target)
    ):
        return "optimizer"
    if case.fmt != "local":
        return None
    if case.operation != "resume":
        return "convert"
    if case.target != case.source:
        return "layout"
    return None


# ----------------------------------------------------------------------------- one layout
@dataclasses.dataclass
class Run:
    """A prepared layout on this rank."""

    strategy: Any
    model: nn.Module
    wrapper: Any
    schedulers: Any
    pipelined: bool

    def wrappers(self) -> dict[str, Any]:
        from shardwise.optim import OptimWrapperDict

        if isinstance(self.wrapper, OptimWrapperDict):
            return dict(self.wrapper.items())
        return {"": self.wrapper}

    def scheduler_list(self) -> list[tuple[str, Any]]:
        """Every scheduler, with the name of the optimizer it schedules."""
        if isinstance(self.schedulers, dict):
            return [(name, s) for name in sorted(self.schedulers) for s in self.schedulers[name]]
        return [("", s) for s in self.schedulers or []]


def optim_config(optim: OptimSpec) -> dict[str, Any]:
    one: dict[str, Any] = dict(optimizer=dict(OPTIMIZERS[optim.optimizer]))
    if optim.groups:
        one["paramwise_cfg"] = dict(custom_keys={"head": dict(lr_mult=0.5)}, bypass_duplicate=True)
    if optim.multi:
        return dict(
            constructor="MatrixMultiConstructor",
            body=one,
            head=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.5)),
        )
    return one


def scheduler_config(optim: OptimSpec) -> Any:
    schedulers = [dict(s) for s in SCHEDULERS[optim.scheduler]]
    if optim.multi and schedulers:
        return dict(body=schedulers)
    return schedulers


def _register_multi_constructor() -> None:
    """An optimizer-wrapper constructor for two optimizers: ``body`` over the embedding and the
    blocks, ``head`` over the head (mmengine's pattern for a GAN's two models)."""
    from shardwise.optim import OptimWrapperDict, build_optim_wrapper
    from shardwise.registry import OPTIM_WRAPPER_CONSTRUCTORS

    if "MatrixMultiConstructor" in OPTIM_WRAPPER_CONSTRUCTORS:
        return

    @OPTIM_WRAPPER_CONSTRUCTORS.register_module(name="MatrixMultiConstructor")
    class MatrixMultiConstructor:
        def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Any = None) -> None:
            self.cfg = optim_wrapper_cfg

        def __call__(self, model: nn.Module) -> OptimWrapperDict:
            model = getattr(model, "module", model)
            body = nn.ModuleDict(dict(tok=model.tok, blocks=model.blocks))
            return OptimWrapperDict(
                body=build_optim_wrapper(body, dict(self.cfg["body"])),
                head=build_optim_wrapper(model.head, dict(self.cfg["head"])),
            )


def prepare(case: Case, layout: str, work_dir: str, seed: int) -> Run:
    """Build ``layout`` for ``case``'s model and optimizer, seeded with ``seed``."""
    from shardwise import build_strategy

    _register_multi_constructor()
    _, kind, extra = LAYOUTS[layout]
    cfg: dict[str, Any] = dict(
        type=kind, work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=seed)), **extra
    )
    pipelined = "pp" in extra.get("parallelism", {})
    if kind == "FSDPStrategy":
        cfg["state_dict_cfg"] = case.fmt
        if "tp" in extra.get("parallelism", {}):
            cfg["tp_plan"] = TP_PLAN
        if pipelined:
            cfg["pipeline"] = PIPELINE
        elif case.wrap_blocks:
            cfg["model_wrapper"] = dict(auto_wrap_policy={Block})
    strategy = build_strategy(cfg)
    torch.manual_seed(seed)
    model = MatrixNet(case.model).double()
    model, wrapper, schedulers = strategy.prepare(
        model,
        optim_wrapper=optim_config(case.optim),
        param_scheduler=scheduler_config(case.optim),
        dispatch_kwargs=dict(max_iters=8),
    )
    return Run(strategy, model, wrapper, schedulers, pipelined)


def train_step(run: Run, spec: ModelSpec, step: int) -> float:
    """One step on this rank's rows of the global batch; the loss over the whole batch."""
    strategy = run.strategy
    idx, targets = batch(spec, step)
    size, rank = strategy.data_parallel_size, strategy.data_parallel_rank
    rows = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
    if run.pipelined:
        loss = strategy.pipeline.train_step((idx[rows], targets[rows]), run.wrapper)["loss"]
    else:
        logits = run.model(idx[rows])
        loss = F.cross_entropy(logits.flatten(0, 1), targets[rows].flatten())
        loss.backward()
        for wrapper in run.wrappers().values():
            wrapper.step()
            wrapper.zero_grad()
    for _, scheduler in run.scheduler_list():
        scheduler.step()
    total = loss.detach().reshape(1).double().clone()
    if dist.is_initialized():
        dist.all_reduce(total)
        total /= dist.get_world_size()
    return float(total.item())


def _merged(part: dict[str, Any]) -> dict[str, Any]:
    """Every rank's ``part`` merged (pipeline stages hold different keys)."""
    if not dist.is_initialized():
        return part
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    merged: dict[str, Any] = {}
    for each in parts:
        merged.update(each)
    return merged


def snapshot(run: Run) -> dict[str, Any]:
    """The state a round trip must keep, gathered whole by torch (a collective), per parameter:
    its weights and optimizer state, its group's settings and each scheduler's per-group values
    of its group (the same parameters may be grouped otherwise on another layout: a pipeline
    stage holds its own part of every group)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from shardwise.strategies.matching import PER_GROUP_KEYS

    full = StateDictOptions(full_state_dict=True)
    weights = get_model_state_dict(run.model, options=full)
    optimizers, groups, group_names = {}, {}, {}
    for name, wrapper in run.wrappers().items():
        state = get_optimizer_state_dict(run.model, wrapper.optimizer, options=full)
        for param, entries in state["state"].items():
            for key, value in entries.items():
                optimizers[f"{name}/{param}/{key}"] = torch.as_tensor(value).detach().cpu().clone()
        group_names[name] = [list(map(str, group["params"])) for group in state["param_groups"]]
        for group in state["param_groups"]:
            settings = {k: v for k, v in group.items() if k != "params"}
            groups.update((f"{name}/{param}", settings) for param in group["params"])
    schedulers = {}
    for j, (name, scheduler) in enumerate(run.scheduler_list()):
        state = scheduler.state_dict()
        schedulers[f"{j}"] = {k: v for k, v in state.items() if k not in PER_GROUP_KEYS}
        for i, params in enumerate(group_names[name]):
            for param in params:
                schedulers[f"{j}/{param}"] = {k: state[k][i] for k in PER_GROUP_KEYS if k in state}
    return dict(
        weights=_merged({k: v.detach().cpu().clone() for k, v in weights.items()}),
        optimizer=_merged(optimizers),
        groups=_merged(groups),
        schedulers=_merged(schedulers),
    )


def draws() -> list[Any]:
    """The next random numbers of every generator a checkpoint restores, on this rank."""
    return [torch.rand(3).tolist(), random.random(), float(np.random.rand())]


# ----------------------------------------------------------------------------- the two runs
def source_run(case: Case, work_dir: str) -> dict[str, Any]:
    """Train, save, snapshot, then the uninterrupted run's next step."""
    torch.set_default_dtype(torch.float64)
    try:
        run = prepare(case, case.source, work_dir, seed=7)
    except ValueError as exc:
        return dict(error=f"{type(exc).__name__}: {exc}")
    for step in range(case.steps):
        train_step(run, case.model, step)
    run.strategy.save_checkpoint(
        "ckpt", async_save=case.async_save, extra_ckpt=dict(meta=dict(loop=dict(iter=case.steps)))
    )
    state = snapshot(run)
    rng = draws()
    loss = train_step(run, case.model, case.steps)
    run.strategy.wait_for_checkpoint()
    return dict(state=state, draws=rng, loss=loss)


def target_run(case: Case, work_dir: str, path: str, weights_only: bool) -> dict[str, Any]:
    """Build another seed's model on the target layout, resume (or load weights), snapshot,
    the next step. A refused resume returns the error and whether the state stayed as built."""
    torch.set_default_dtype(torch.float64)
    fmt = case.fmt if case.fmt in formats_of(case.target) else "sharded"  # what it would save
    try:
        run = prepare(dataclasses.replace(case, fmt=fmt), case.target, work_dir, seed=11)
    except ValueError as exc:
        return dict(error=f"{type(exc).__name__}: {exc}", unchanged=True)
    before = snapshot(run)
    try:
        if weights_only:
            meta = run.strategy.load_checkpoint(path, strict=True).get("meta", {})
        else:
            meta = run.strategy.resume(path).get("meta", {})
    except Exception as exc:  # noqa: BLE001 - the test judges it
        return dict(error=f"{type(exc).__name__}: {exc}", unchanged=_equal(snapshot(run), before))
    state = snapshot(run)
    rng = draws()
    loss = train_step(run, case.model, case.steps)
    return dict(state=state, draws=rng, loss=loss, loop=meta.get("loop"))


def _equal(a: Any, b: Any) -> bool:
    try:
        assert_same(a, b, "")
    except AssertionError:
        return False
    return True


def assert_same(got: Any, want: Any, where: str) -> None:
    """Bit for bit: tensors by ``torch.equal`` (with dtype), everything else by ``==``."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (
            f"{where}: keys {sorted(got) if isinstance(got, dict) else got} != {sorted(want)}"
        )
        for key in want:
            assert_same(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), f"{where}: {len(got)} entries != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, (
            f"{where}: {getattr(got, 'dtype', type(got))} != {want.dtype}"
        )
        assert torch.equal(got, want), f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


# ----------------------------------------------------------------------------- the round trip
def _cli(*argv: str) -> int:
    from shardwise.cli import main

    return main(list(argv))


def _cli_output(*argv: str) -> tuple[int, str]:
    """The CLI's exit code and what it printed on stderr."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = _cli(*argv)
    return code, err.getvalue()


def offline(case: Case, path: Path, out: Path) -> tuple[Path, bool]:
    """The operation's part between the runs, in this process: verify, convert (into
    ``out``); returns the checkpoint the target reads and whether it loads weights only."""
    assert _cli("ckpt", "verify", str(path)) == 0, f"ckpt verify {path} failed"
    if case.operation == "resume" or refused(case):
        return path, False
    chain = {
        "convert-full": ["full"],
        "convert-full-sharded": ["full", "sharded"],
        "safetensors": ["safetensors", "full"],
    }[case.operation]
    for i, to in enumerate(chain):
        out.mkdir(parents=True, exist_ok=True)
        dst = out / f"converted{i}.{'safetensors' if to == 'safetensors' else 'ckpt'}"
        assert _cli("ckpt", "convert", str(path), str(dst), "--to", to) == 0, (to, path)
        assert _cli("ckpt", "verify", str(dst)) == 0, f"ckpt verify {dst} failed"
        path = dst
    return path, case.operation == "safetensors"


def round_trip(case: Case, tmp: str | os.PathLike[str]) -> tuple[list[Any], list[Any]]:
    """Run ``case``: the source's results and the target's, rank by rank."""
    before, (after,) = round_trips(case, [case.target], tmp)
    return before, after


def round_trips(
    case: Case, targets: Sequence[str], tmp: str | os.PathLike[str]
) -> tuple[list[Any], list[list[Any]]]:
    """``case`` from one source run onto each of ``targets`` (``case.target`` ignored): the
    source's results and each target's, rank by rank. The ranks run in ``tmp`` (where a
    source on object storage keeps its logs, in ``work_dirs``)."""
    tmp = Path(tmp)
    before_cwd = os.getcwd()
    os.chdir(tmp)
    try:
        return _round_trips(case, targets, tmp)
    finally:
        os.chdir(before_cwd)


def _round_trips(
    case: Case, targets: Sequence[str], tmp: Path
) -> tuple[list[Any], list[list[Any]]]:
    source_dir: Any = tmp / "source"
    env: dict[str, str] = {}
    if case.storage == "s3":
        from shardwise.checkpoint.storage import location
        from tests.s3_server import shared_server

        server = shared_server()
        source_dir, env = location(f"{server.bucket()}/source"), server.env
    before = _on(LAYOUTS[case.source][0], source_run, case, str(source_dir), env=env)
    if "error" in before[0]:
        return before, [before for _ in targets]
    afters = []
    for target in targets:
        each = dataclasses.replace(case, target=target)
        target_dir = tmp / f"target-{target}"
        if refused(each) == "convert":
            saved, converted = source_dir / "ckpt", target_dir / "c.ckpt"
            assert _cli("ckpt", "verify", str(saved)) == 0
            code, said = _cli_output("ckpt", "convert", str(saved), str(converted), "--to", "full")
            afters.append([dict(error=f"exit {code}: {said}", unchanged=not converted.exists())])
            continue
        path, weights_only = offline(each, source_dir / "ckpt", target_dir)
        run = (each, str(target_dir), str(path), weights_only)
        afters.append(_on(LAYOUTS[target][0], target_run, *run, env=env))
    return before, afters


def _on(world_size: int, fn: Any, *args: Any, env: dict[str, str] | None = None) -> list[Any]:
    return run_distributed(fn, world_size, *args, timeout=120, env=env)


def check_round_trip(case: Case, ranks_before: list[Any], ranks_after: list[Any]) -> None:
    """The property (see the module's docstring), given every rank's results."""
    before, after = ranks_before[0], ranks_after[0]
    errors = [r["error"] for r in ranks_after if "error" in r]
    assert len(errors) in (0, len(ranks_after)), f"only some ranks failed: {errors}"
    reason = refused(case)
    if reason == "optimizer":
        name = OPTIMIZERS[case.optim.optimizer]["type"].rpartition(".")[2]
        assert all(f"optimizer {name} cannot step" in r.get("error", "") for r in ranks_after), (
            ranks_after
        )
        return
    assert "error" not in before, before["error"]
    if reason is not None:
        assert "error" in after, f"a local checkpoint was read by {case}"
        assert "local" in after["error"] and after["unchanged"], after
        if reason == "convert":
            assert not after["error"].startswith("exit 0"), after
        return
    assert "error" not in after, after.get("error")
    if case.operation == "safetensors":
        assert_same(after["state"]["weights"], before["state"]["weights"], "weights")
        return
    assert_same(after["state"], before["state"], "state")
    assert after["loop"] == dict(iter=case.steps), after["loop"]
    if len(ranks_after) == len(ranks_before):  # each rank's random state comes back
        assert [r["draws"] for r in ranks_after] == [r["draws"] for r in ranks_before]
    if case.target == case.source:
        assert after["loss"] == before["loss"], (after["loss"], before["loss"])
    else:
        assert abs(after["loss"] - before["loss"]) <= TOLERANCE * abs(before["loss"]), (
            after["loss"],
            before["loss"],
        )
