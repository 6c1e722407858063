"""Every checkpoint round trip: model shapes x optimizer x layout x format x operation.

A :class:`~tests.ckpt_matrix.Case` (parameter shapes with fewer rows than ranks, 1-element
parameters, uneven rows, buffers, tied weights; every ``torch.optim`` optimizer that keeps
state, several param groups, schedulers, two optimizers in an ``OptimWrapperDict``; single,
DDP-2, FSDP-2/-3, HSDP 2x2, TP-2, FSDP x TP, PP-2; full, sharded and local, sync and async;
resume on the same or another layout, one device, ``ckpt convert`` chains, ``ckpt verify``)
runs on real gloo process groups (``tests/ckpt_matrix.py`` says how, and what must hold).

- The default suite runs a fixed grid (:func:`default_matrix`): each optimizer once, from one
  source run onto the same layout and onto another one, while the source, the other layout,
  the format, the operation, the storage and the rest rotate over the grid; a few rows more
  cover local checkpoints (refused elsewhere) and safetensors.
- The slow suite draws hundreds of cases from a seed that changes every day
  (:func:`random_matrix`): every source layout onto every layout, every optimizer, the rest at
  random. The seed is printed and attached to a failure; ``SHARDWISE_MATRIX_SEED=<seed>``
  replays it, ``SHARDWISE_MATRIX_EXAMPLES`` sets the cases per source layout.
- :func:`test_the_matrices_cover_every_optimizer_layout_format_and_storage` holds both to that.

A failure is kept below as a named regression test (its ``Case`` prints as one).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import random
from collections import Counter
from collections.abc import Sequence

import pytest

from tests.ckpt_matrix import (
    FSDP_FORMATS,
    LAYOUTS,
    NO_DTENSOR_STEP,
    OPERATIONS,
    OPTIMIZERS,
    SCHEDULERS,
    STORAGES,
    Case,
    ModelSpec,
    OptimSpec,
    check_round_trip,
    formats_of,
    has_dtensors,
    layout_fits,
    refused,
    round_trip,
    round_trips,
)

#: slow suite: cases per source layout (SHARDWISE_MATRIX_EXAMPLES overrides)
SLOW_EXAMPLES = 30
#: the slow suite's seed: today's date (UTC) unless SHARDWISE_MATRIX_SEED replays another
SEED = int(
    os.environ.get("SHARDWISE_MATRIX_SEED")
    or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
)
#: at most this fraction of a matrix's round trips may be refusals (the rest must succeed)
MAX_REFUSED = 0.25

NAMES = sorted(LAYOUTS)
#: the layouts whose parameters stay plain tensors (every optimizer steps them)
PLAIN = [name for name in NAMES if not has_dtensors(name)]


@dataclasses.dataclass(frozen=True)
class Row:
    """One source run (``case``, its ``target`` ignored) and the layouts it resumes on."""

    case: Case
    targets: tuple[str, ...]

    def cases(self) -> list[Case]:
        return [dataclasses.replace(self.case, target=target) for target in self.targets]

    def id(self) -> str:
        case, targets = self.case, "+".join(self.targets)
        return f"{case.optim.optimizer}-{case.source}-{case.fmt}-{case.operation}-to-{targets}"


def _degree(layouts: Sequence[str], name: str) -> int:
    return max(LAYOUTS[layout][2].get("parallelism", {}).get(name, 1) for layout in layouts)


def _model_and_optim(
    rng: random.Random, layouts: Sequence[str], optimizer: str, scheduler: str
) -> tuple[ModelSpec, OptimSpec]:
    """A model and an optimizer every layout of ``layouts`` can run, the rest drawn by ``rng``."""
    tp, pp = _degree(layouts, "tp"), _degree(layouts, "pp")
    hidden = tuple(rng.randint(1, 3) * tp for _ in range(rng.randint(pp, 3)))
    tied = pp == 1 and rng.random() < 0.5
    model = ModelSpec(
        vocab=rng.randint(1, 6),
        width=rng.randint(1, 6),
        hidden=hidden,
        bias=rng.random() < 0.5,
        norm=rng.random() < 0.5,
        gain=rng.random() < 0.5,
        cls=rng.random() < 0.5,
        tied=tied,
        buffer=rng.random() < 0.5,
    )
    optim = OptimSpec(
        optimizer=optimizer,
        groups=rng.random() < 0.5,
        scheduler=scheduler,
        multi=pp == 1 and not tied and rng.random() < 0.5,
    )
    assert all(layout_fits(layout, model, optim) for layout in layouts)
    return model, optim


# ----------------------------------------------------------------------------- the default grid
def default_matrix() -> list[Row]:
    """Each optimizer from one source onto the same layout and onto another (both must succeed:
    an optimizer that cannot step DTensors goes between plain layouts), the source and the other
    layout rotating so that each layout is both; format, operation, storage, sync/async,
    scheduler and the rest rotate with the row. Then local checkpoints (the same layout
    resumes; another layout and ``ckpt convert`` are refused) and safetensors."""
    rows, sharded = [], 0
    schedulers = sorted(SCHEDULERS)
    for i, optimizer in enumerate(sorted(OPTIMIZERS)):
        if OPTIMIZERS[optimizer]["type"] in NO_DTENSOR_STEP:
            source, other = PLAIN[i % len(PLAIN)], PLAIN[(i + 1) % len(PLAIN)]
        else:  # shift 1 for the first 8, then 2: each layout a source and another's target
            source = NAMES[sharded % len(NAMES)]
            other = NAMES[(sharded + 1 + sharded // len(NAMES)) % len(NAMES)]
            sharded += 1
        rng = random.Random(i)
        model, optim = _model_and_optim(rng, (source, other), optimizer, schedulers[i % 3])
        fmts = [fmt for fmt in formats_of(source) if fmt != "local"]
        case = Case(
            model=model,
            optim=optim,
            source=source,
            fmt=fmts[i % len(fmts)],
            async_save=(i // 2) % 2 == 1,
            wrap_blocks=i % 3 != 0,
            operation=OPERATIONS[i % 3],  # safetensors keeps the weights only: a row below
            steps=1 + (i // 3) % 3,
            storage="s3" if i % 8 == 7 else "local",  # 2 rows (test_a_round_trip_... a third)
        )
        rows.append(Row(case, (source, other)))
    rng = random.Random(100)
    model, optim = _model_and_optim(rng, ("hsdp2x2", "fsdp3"), "AdamW", "StepLR")
    local = Case(model=model, optim=optim, source="hsdp2x2", fmt="local", async_save=True)
    rows.append(Row(local, ("hsdp2x2", "fsdp3")))
    rows.append(Row(dataclasses.replace(local, operation="convert-full"), ("hsdp2x2",)))
    model, optim = _model_and_optim(rng, ("tp2", "single"), "Adam", "LinearLR+Cosine")
    weights = Case(model=model, optim=optim, source="tp2", operation="safetensors", steps=3)
    rows.append(Row(weights, ("tp2", "single")))
    return rows


# ----------------------------------------------------------------------------- the seeded draw
def _balanced(rng: random.Random, items: Sequence[str], n: int) -> list[str]:
    """``n`` of ``items``, each as often as the others (within one), in ``rng``'s order."""
    out: list[str] = []
    while len(out) < n:
        out.extend(rng.sample(list(items), len(items)))
    out = out[:n]
    rng.shuffle(out)
    return out


def _plain_targets_for_plain_optimizers(
    source: str, targets: list[str], optimizers: Sequence[str]
) -> None:
    """Swap ``targets`` (in place) so that an optimizer that cannot step DTensors goes from the
    plain ``source`` onto a plain layout, another one and the same one in turn (elsewhere it is
    refused when built: a round trip that tests nothing more)."""
    plain = [i for i, name in enumerate(optimizers) if OPTIMIZERS[name]["type"] in NO_DTENSOR_STEP]
    for n, i in enumerate(plain):
        same = n % 2 == 1
        if _plain_target(source, targets[i], same):
            continue
        for j, target in enumerate(targets):
            if j not in plain and _plain_target(source, target, same):
                targets[i], targets[j] = targets[j], targets[i]
                break


def _plain_target(source: str, target: str, same: bool) -> bool:
    return target == source if same else target in PLAIN and target != source


def random_matrix(seed: int, per_source: int) -> list[Case]:
    """``per_source`` cases from each source layout, drawn from ``seed``: its targets about a
    third the same layout and the rest every other layout in turn; the optimizers balanced;
    everything else at random (a local checkpoint less often, and then mostly resumed)."""
    rng = random.Random(seed)
    cases = []
    for source in NAMES:
        others = [name for name in NAMES if name != source]
        same = max(1, per_source // 3)
        targets = [source] * same + _balanced(rng, others, per_source - same)
        rng.shuffle(targets)
        optimizers = _balanced(rng, sorted(OPTIMIZERS), per_source)
        if source in PLAIN:
            _plain_targets_for_plain_optimizers(source, targets, optimizers)
        for target, optimizer in zip(targets, optimizers):
            scheduler = rng.choice(sorted(SCHEDULERS))
            model, optim = _model_and_optim(rng, (source, target), optimizer, scheduler)
            fmts = formats_of(source)
            fmt = rng.choice([f for f in fmts for _ in range(1 if f == "local" else 2)])
            local_resume = fmt == "local" and rng.random() < 0.7
            cases.append(
                Case(
                    model=model,
                    optim=optim,
                    source=source,
                    fmt=fmt,
                    async_save=rng.random() < 0.5,
                    wrap_blocks=rng.random() < 0.5,
                    operation="resume" if local_resume else rng.choice(OPERATIONS),
                    target=target,
                    steps=rng.randint(1, 3),
                    storage=rng.choice(STORAGES),
                )
            )
    return cases


def _check(case: Case, tmp_path_factory: pytest.TempPathFactory) -> None:
    before, after = round_trip(case, tmp_path_factory.mktemp("case"))
    check_round_trip(case, before, after)


DEFAULT = default_matrix()
SLOW = random_matrix(SEED, int(os.environ.get("SHARDWISE_MATRIX_EXAMPLES", SLOW_EXAMPLES)))


@pytest.mark.parametrize("row", DEFAULT, ids=Row.id)
def test_every_optimizer_round_trips_on_the_same_layout_and_resharded(row, tmp_path_factory):
    before, afters = round_trips(row.case, row.targets, tmp_path_factory.mktemp("case"))
    for case, after in zip(row.cases(), afters):
        check_round_trip(case, before, after)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    SLOW,
    ids=[
        f"{c.source}-{i % max(1, len(SLOW) // len(NAMES)):02d}-{c.optim.optimizer}-to-{c.target}"
        for i, c in enumerate(SLOW)
    ],
)
def test_every_round_trip_keeps_the_state_and_the_next_loss(case, tmp_path_factory):
    print(f"checkpoint matrix seed {SEED} (replay: SHARDWISE_MATRIX_SEED={SEED})")
    try:
        _check(case, tmp_path_factory)
    except BaseException as exc:
        exc.add_note(f"SHARDWISE_MATRIX_SEED={SEED} replays it; the case: {case!r}")
        raise


def _coverage(cases: Sequence[Case]) -> dict[str, object]:
    """What ``cases`` cover (the round trips that must succeed) and how many are refusals."""
    ok = [case for case in cases if refused(case) is None]
    return dict(
        same={c.optim.optimizer for c in ok if c.target == c.source},
        resharded={c.optim.optimizer for c in ok if c.target != c.source},
        sources={c.source for c in ok},
        targets={c.target for c in ok if c.target != c.source},
        pairs={(c.source, c.target) for c in cases},
        formats={c.fmt for c in ok},
        operations={c.operation for c in ok},
        storages={c.storage for c in ok},
        async_save={c.async_save for c in ok},
        refused=sum(refused(c) is not None for c in cases) / len(cases),
    )


@pytest.mark.parametrize("matrix", ["default", "slow"])
def test_the_matrices_cover_every_optimizer_layout_format_and_storage(matrix):
    """Every optimizer round-trips (not refused) on the same layout and on another; every
    layout is a source and another's target; every format, operation, storage, sync and async;
    refusals at most MAX_REFUSED. The slow matrix: today's seed and others."""
    if matrix == "default":
        drawn = [[case for row in DEFAULT for case in row.cases()]]
    else:
        seeds = (SEED, 0, 1, 20261207)  # the full size, whatever SHARDWISE_MATRIX_EXAMPLES is
        drawn = [random_matrix(seed, SLOW_EXAMPLES) for seed in seeds]
    for cases in drawn:
        got = _coverage(cases)
        assert got["same"] == got["resharded"] == set(OPTIMIZERS), got
        assert got["sources"] == got["targets"] == set(LAYOUTS), got
        assert got["formats"] == set(FSDP_FORMATS), got
        assert got["operations"] == set(OPERATIONS), got
        assert got["storages"] == set(STORAGES) and got["async_save"] == {False, True}, got
        assert got["refused"] <= MAX_REFUSED, got
        if matrix == "slow":  # every source onto every layout
            assert got["pairs"] == {(s, t) for s in LAYOUTS for t in LAYOUTS}, got
    got = _coverage(drawn[0])
    counts = Counter(case.optim.optimizer for case in drawn[0])
    sizes = {key: len(v) if isinstance(v, set) else round(v, 3) for key, v in got.items()}
    print(f"{matrix} matrix: {len(drawn[0])} round trips, {sizes}, optimizers {dict(counts)}")


def test_a_round_trip_through_an_s3_server_reshards(tmp_path_factory):
    """A sharded checkpoint saved asynchronously by 2 FSDP ranks to an S3 server, resumed by 3
    (each generated case draws its storage too: local disk or the S3 server)."""
    case = Case(storage="s3", async_save=True, target="fsdp3")
    _check(case, tmp_path_factory)


# ----------------------------------------------------------------------------- empty shards
#: a model whose head has one output (a [1, 4] weight, a [1] bias) and a [1, 1, 4] token: on 2
#: or 3 ranks most ranks hold empty shards of them
EMPTY_SHARDS = ModelSpec(vocab=1, width=4, hidden=(3,), cls=True)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["full", "sharded", "local"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_empty_shards_resume_for_every_optimizer_and_format(optimizer, fmt, tmp_path_factory):
    """The same layout, and resharded (2 -> 3 ranks; a local checkpoint: refused, untouched)."""
    case = Case(model=EMPTY_SHARDS, optim=OptimSpec(optimizer), fmt=fmt)
    targets = ("fsdp2", "fsdp3")
    before, afters = round_trips(case, targets, tmp_path_factory.mktemp("case"))
    for target, after in zip(targets, afters):
        check_round_trip(dataclasses.replace(case, target=target), before, after)


# ----------------------------------------------------------------------------- regressions
#: failures the matrix found, shrunk, each fixed and kept
REGRESSIONS = {
    # SGD's momentum of a parameter with fewer rows than ranks (FSDP gives rank 1 an empty
    # shard): the gather-free resume listed no metadata for it on rank 1 ("Missing key").
    "sgd_momentum_empty_shard_on_fsdp2": Case(
        model=ModelSpec(vocab=1, width=3, hidden=(4,)),
        optim=OptimSpec("SGD-momentum"),
    ),
    # one parameter group per parameter (paramwise_cfg) under pipeline stages: rank 0's groups
    # alone were written, stage 1 refused the resume while stage 0 loaded (a hang)
    "pipeline_groups_per_parameter_resume_on_pp2": Case(
        model=ModelSpec(vocab=5, width=3, hidden=(3, 2, 3)),
        optim=OptimSpec("SGD-momentum", groups=True, scheduler="StepLR"),
        source="pp2",
        target="pp2",
        async_save=True,
        steps=1,
    ),
    # ... and on another layout: 6 groups in the checkpoint, 15 here
    "pipeline_groups_per_parameter_resharded_to_fsdp2xtp2": Case(
        model=ModelSpec(vocab=6, width=3, hidden=(4, 4, 6), norm=True, cls=True),
        optim=OptimSpec("RMSprop-momentum", groups=True, scheduler="LinearLR+Cosine"),
        source="pp2",
        target="fsdp2xtp2",
    ),
    # a tied weight's second name was read as a full tensor into a DTensor parameter
    "tied_weights_resharded_fsdp2_to_fsdp3": Case(
        model=ModelSpec(vocab=1, width=2, hidden=(3,), gain=True, tied=True),
        optim=OptimSpec("SGD-momentum", groups=True, scheduler="StepLR"),
        async_save=True,
        wrap_blocks=False,
        target="fsdp3",
    ),
    # paramwise groups over tied weights: torch's bare "some parameters appear in more than
    # one parameter group" (the matrix gives bypass_duplicate=True; the refusal is tested in
    # test_optim_constructor.py)
    "tied_weights_with_param_groups_on_ddp2": Case(
        model=ModelSpec(vocab=1, width=1, hidden=(1,), bias=False, tied=True),
        optim=OptimSpec("ASGD", groups=True, scheduler="LinearLR+Cosine"),
        source="ddp2",
        fmt="full",
        target="ddp2",
    ),
    # Rprop cannot step DTensor shards (torch 2.13): refused when built, not at the first step
    "rprop_refused_on_sharded_parameters": Case(
        optim=OptimSpec("Rprop"), source="single", fmt="full", target="fsdp2"
    ),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression(name, tmp_path_factory):
    _check(REGRESSIONS[name], tmp_path_factory)
