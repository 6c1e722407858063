"""Replica-level fault tolerance on torchft: survive a lost replica group without a restart.

A run is split into *replica groups*, each its own launch (torchrun, srun, ...) with its own
default process group; torchft's ``Manager`` keeps a quorum of the live groups through a
*lighthouse* (``torchft_lighthouse --bind 0.0.0.0:29510 --min_replicas 1``) and averages the
gradients across them through its reconfigurable process group. A group that joins or rejoins
heals from a live peer: it receives the whole training state, every state object registered
with the strategy's :class:`~shardwise.checkpoint.checkpointer.Checkpointer` (model,
optimizers, schedulers, random state, ...), over HTTP, not from disk. The optimizer step
commits only when every live group agrees (torchft's ``OptimizerWrapper`` semantics).

Enabled by ``DDPStrategy(fault_tolerance=dict(replica_group=0, num_replica_groups=3,
min_replicas=1, lighthouse='http://host:29510'))`` (or ``FSDPStrategy(parallelism=dict(
dp_shard=...), fault_tolerance=...)``: FT-HSDP, below). The training loop calls
:meth:`FaultTolerance.start_step` before it reads a step's data; the step it returns (restored
by a heal) says which data to read, and :meth:`FaultTolerance.shard` which part of it is this
replica's for the current quorum::

    ft = strategy.fault_tolerance
    while (step := ft.start_step()) < max_steps:
        batch = global_batch(step)                   # the same on every replica group
        loss = model(batch[ft.shard(len(batch))])    # this replica's disjoint part
        optim_wrapper.update_params(loss)            # steps only when the quorum commits

Nothing is skipped or repeated when a group is lost: every step's global batch is split
among the groups live in that step's quorum (the step in progress when a group dies is
redone by the survivors, since its commit fails).

The step's cost over plain data parallelism is kept small: the commit vote of a group's ranks
is one all-gather over the group's own process group (torchft's ``should_commit`` keeps its
bookkeeping), and the next step's quorum is requested as soon as a step's vote ends, so that
the lighthouse round trip runs during the optimizer step and whatever the loop does up to
the next :meth:`FaultTolerance.start_step`, which awaits it. The data of a step still follows
that step's own quorum, and a healing peer still receives the state as it is at
``start_step`` (the copy waits on torchft's state-dict lock until then); a loop that spends
longer than ``timeout`` between an optimizer step and the next ``start_step`` (a long
validation) while a peer joins fails that step's heal and commit, retried at the next step.

FT-HSDP: ``FSDPStrategy(parallelism=dict(dp_shard=2), fault_tolerance=dict(...))`` makes each
replica group FSDP2 over its own ranks (its own launch and mesh); FSDP reduce-scatters the
gradients inside the group, and FSDP2's all-reduce hook averages each module's gradient shards
(the reduce-scatter's flat output) with the same rank of the other live groups through
torchft's process group, during the backward. torchft
heals each rank of a group from the same rank of a peer group, independently, so the heal
moves each rank's own part of the state without any collective: the Checkpointer's
:meth:`~shardwise.checkpoint.checkpointer.Checkpointer.local_state_dict` (DTensor shards as
plain tensors, this rank's RNG state). Under DDP a replica group is one process.

torchft is optional: ``pip install shardwise[ft]``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.nn as nn

from shardwise import dist

__all__ = [
    "FT_KEYS",
    "FaultTolerance",
    "check_fault_tolerance",
    "import_torchft",
    "replica_process_group",
]

#: The keys of ``fault_tolerance=dict(...)`` and their defaults (None: required).
FT_KEYS: dict[str, Any] = dict(
    replica_group=None,
    num_replica_groups=None,
    min_replicas=1,
    lighthouse=None,  # else the TORCHFT_LIGHTHOUSE environment variable
    timeout=60.0,  # collectives, commit votes, checkpoint transfers (seconds)
    quorum_timeout=60.0,  # waiting for a quorum (seconds)
    connect_timeout=10.0,  # reaching the lighthouse and the managers (seconds)
    max_retries=None,  # consecutive failed commits before the run stops (None: no limit)
)

_ID = re.compile(r"^shardwise_n(\d+)_min(\d+)_group(\d+)$")


def import_torchft(quiet: bool = True) -> Any:
    """Import torchft, or raise an ImportError that names the extra to install.

    ``quiet``: torchft's Rust side (manager servers, lighthouse) logs at the level that
    ``RUST_LOG`` names when torchft is first imported, by default six lines a step from
    each replica group's manager; unless ``RUST_LOG`` is set, a replica logs only
    warnings and errors (``RUST_LOG=info`` brings the quorum lines back)."""
    if quiet:
        os.environ.setdefault("RUST_LOG", "warn")
    try:
        import torchft
        import torchft.manager  # noqa: F401
        import torchft.process_group  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"fault_tolerance needs torchft ({e}); install it with `pip install shardwise[ft]` "
            "(torchft==0.2.0)"
        ) from e
    return torchft


def _int(cfg: Mapping[str, Any], key: str, minimum: int) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"fault_tolerance {key}={value!r} must be an int >= {minimum}; e.g. "
            "fault_tolerance=dict(replica_group=0, num_replica_groups=2, min_replicas=1, "
            "lighthouse='http://host:29510')"
        )
    return value


def check_fault_tolerance(cfg: Any, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``fault_tolerance`` config with its defaults, checked without importing torchft or
    building anything. Raises TypeError/ValueError/KeyError naming the key, the value and
    what fits."""
    env = os.environ if env is None else env
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"fault_tolerance must be a dict such as dict(replica_group=0, "
            f"num_replica_groups=2, lighthouse='http://host:29510'), got {cfg!r}"
        )
    unknown = sorted(set(cfg) - set(FT_KEYS))
    if unknown:
        raise KeyError(f"fault_tolerance got unknown keys {unknown}; accepted: {sorted(FT_KEYS)}")
    out = {**FT_KEYS, **cfg}
    for key in ("replica_group", "num_replica_groups"):
        if out[key] is None:
            raise ValueError(
                f"fault_tolerance needs {key}: every replica group is started with its own "
                "replica_group (0, 1, ...) and the same num_replica_groups"
            )
    groups = _int(out, "num_replica_groups", 1)
    group = _int(out, "replica_group", 0)
    if group >= groups:
        raise ValueError(
            f"fault_tolerance replica_group={group} is out of range for "
            f"num_replica_groups={groups}: use 0..{groups - 1}"
        )
    minimum = _int(out, "min_replicas", 1)
    if minimum > groups:
        raise ValueError(
            f"fault_tolerance min_replicas={minimum} is above num_replica_groups={groups}: no "
            f"step could ever commit; use min_replicas <= {groups}"
        )
    if out["max_retries"] is not None:
        _int(out, "max_retries", 0)
    for key in ("timeout", "quorum_timeout", "connect_timeout"):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"fault_tolerance {key}={value!r} must be a number of seconds > 0")
    lighthouse = out["lighthouse"] or env.get("TORCHFT_LIGHTHOUSE")
    if not lighthouse:
        raise ValueError(
            "fault_tolerance needs a lighthouse: set lighthouse='http://host:port' (or the "
            "TORCHFT_LIGHTHOUSE environment variable) to the address of a running "
            "`torchft_lighthouse --bind 0.0.0.0:29510 --min_replicas 1`"
        )
    if not isinstance(lighthouse, str) or not re.match(r"^https?://[^/:]+:\d+/?$", lighthouse):
        raise ValueError(
            f"fault_tolerance lighthouse={lighthouse!r} is not an address such as "
            "'http://host:29510'"
        )
    out["lighthouse"] = lighthouse
    return out


def replica_process_group(device: torch.device | str) -> type:
    """torchft's reconfigurable process group class for gradients on ``device``, across the
    replica groups: NCCL for CUDA, gloo otherwise (CPU is first-class)."""
    import_torchft()
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    return ProcessGroupNCCL if torch.device(device).type == "cuda" else ProcessGroupGloo


def _vote_device(group_world_size: int) -> torch.device | None:
    """Where a replica group's ranks take their commit vote, if over their own process group
    rather than by torchft's manager server (None): a group of one rank votes alone; a group
    of several ranks that form the default process group votes over it, on the CPU with gloo
    in it, else on the rank's GPU with NCCL."""
    import torch.distributed as tdist

    if group_world_size == 1:
        return torch.device("cpu")
    if not tdist.is_initialized() or tdist.get_world_size() != group_world_size:
        return None
    backend = str(tdist.get_backend())
    if "gloo" in backend:
        return torch.device("cpu")
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _clone(obj: Any) -> Any:
    """``obj`` with every tensor copied (what is served to a healing peer must not change
    while training goes on)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, Mapping):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(v) for v in obj)
    return obj


class _QuorumRecorder:
    """Delegates to torchft's ManagerClient and keeps the last quorum it returned. With a
    ``vote_device``, the commit vote of the replica group's ranks is taken over the group's
    own (default) process group, one all-gather of two numbers per rank on that device (gloo:
    CPU, NCCL: the rank's GPU; one exchange round, ~0.3 ms on this CPU, half a gloo
    all-reduce's two rounds), instead of the manager server's RPC (~3 ms on this CPU): the
    same agreement (every rank gets False when one votes False; a rank that does not vote
    within ``timeout`` fails the others' vote), and torchft's ``should_commit`` keeps its
    bookkeeping (step, retries)."""

    def __init__(self, client: Any, vote_device: torch.device | None = None) -> None:
        self._client = client
        self._vote_device = vote_device
        self.last: Any = None

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self._client._quorum(*args, **kwargs)
        return self.last

    def should_commit(
        self, group_rank: int, step: int, should_commit: bool, timeout: timedelta
    ) -> bool:
        if self._vote_device is None:
            return self._client.should_commit(group_rank, step, should_commit, timeout=timeout)
        import torch.distributed as tdist

        if not tdist.is_initialized() or tdist.get_world_size() == 1:
            return bool(should_commit)  # a replica group of one rank: its own vote

        device = self._vote_device
        vote = torch.tensor([int(bool(should_commit)), step], dtype=torch.int64, device=device)
        votes = torch.empty(2 * tdist.get_world_size(), dtype=torch.int64, device=device)
        tdist.all_gather_into_tensor(votes, vote, async_op=True).wait(timeout)
        votes = votes.view(-1, 2).cpu()
        steps = sorted(set(votes[:, 1].tolist()))
        if len(steps) != 1:
            raise RuntimeError(f"the ranks of the replica group vote on different steps {steps}")
        return bool(votes[:, 0].all())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class FaultTolerance:
    """One replica group's side of a fault-tolerant run: torchft's ``Manager``, its process
    group, the commit gate of the optimizer wrappers and the whole-state heal.

    Args:
        cfg: the ``fault_tolerance`` config (see :data:`FT_KEYS`).
        logger: where quorum changes and heals are reported.
        group_rank: this process's rank inside its replica group (default: the default
            process group's).
        group_world_size: the replica group's size (default: the default process group's).
        store_addr: the replica group's TCPStore host (default: ``MASTER_ADDR``).
        store_port: its port (default: ``MASTER_PORT``).
        multi_rank: whether a replica group may have several ranks (FSDP inside the group);
            DDP's replica groups are one process.
        device: where the gradients live: on a CUDA device the replica groups average them
            through torchft's NCCL process group, else through its gloo one.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        *,
        logger: Any,
        group_rank: int | None = None,
        group_world_size: int | None = None,
        store_addr: str | None = None,
        store_port: int | None = None,
        multi_rank: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.cfg = check_fault_tolerance(cfg)
        import_torchft()
        from torchft.checkpointing.http_transport import HTTPTransport
        from torchft.manager import Manager

        self.logger = logger
        self.group_rank = dist.get_rank() if group_rank is None else group_rank
        self.group_world_size = (
            dist.get_world_size() if group_world_size is None else group_world_size
        )
        if self.group_world_size != 1 and not multi_rank:
            raise ValueError(
                f"fault_tolerance runs one process per replica group, got a replica group of "
                f"{self.group_world_size} ranks (WORLD_SIZE={self.group_world_size}) under "
                "DDPStrategy; start each replica group with one process (torchrun "
                "--nproc-per-node 1), or use FSDPStrategy(fault_tolerance=...) for several "
                "ranks per replica group (FT-HSDP)"
            )
        store_addr = store_addr or os.environ.get("MASTER_ADDR")
        port = store_port or os.environ.get("MASTER_PORT")
        if not store_addr or not port:
            raise RuntimeError(
                "fault_tolerance needs the replica group's TCPStore: launch each replica group "
                "with torchrun (or set MASTER_ADDR and MASTER_PORT); got "
                f"MASTER_ADDR={store_addr!r} MASTER_PORT={port!r}"
            )
        c = self.cfg
        self.replica_group = c["replica_group"]
        self.num_replica_groups = c["num_replica_groups"]
        self.min_replicas = c["min_replicas"]
        self.timeouts = {k: float(c[k]) for k in ("timeout", "quorum_timeout", "connect_timeout")}
        seconds = {k: timedelta(seconds=v) for k, v in self.timeouts.items()}

        class _WeightsOnlyTransport(HTTPTransport):
            """torchft's HTTP transport, reading what a peer serves with weights_only=True
            (shardwise's states hold only tensors and plain containers)."""

            @classmethod
            def _load_from_address(cls, address: str, timeout: timedelta) -> object:
                import urllib.request

                from torchft.checkpointing._serialization import _streaming_load

                with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
                    return _streaming_load(f, weights_only=True)

        self.pg = replica_process_group(device)(timeout=seconds["timeout"])
        replica_id = f"shardwise_n{self.num_replica_groups}_min{self.min_replicas}_group" + str(
            self.replica_group
        )
        try:
            self.manager = Manager(
                pg=self.pg,
                load_state_dict=None,
                state_dict=None,
                min_replica_size=self.min_replicas,
                use_async_quorum=False,  # heal before the step's data is read
                timeout=seconds["timeout"],
                quorum_timeout=seconds["quorum_timeout"],
                connect_timeout=seconds["connect_timeout"],
                rank=self.group_rank,
                world_size=self.group_world_size,
                store_addr=store_addr,
                store_port=int(port),
                lighthouse_addr=c["lighthouse"],
                replica_id=replica_id,
                checkpoint_transport=_WeightsOnlyTransport(seconds["timeout"], num_chunks=0),
                max_retries=c["max_retries"],
            )
        except Exception as e:
            raise RuntimeError(
                f"replica group {self.replica_group}: could not reach the lighthouse "
                f"{c['lighthouse']} within connect_timeout={self.timeouts['connect_timeout']}s "
                f"({_first_line(e)}); start `torchft_lighthouse` there or fix "
                "fault_tolerance.lighthouse"
            ) from e
        vote = _vote_device(self.group_world_size) if self.commit_over_pg else None
        self._recorder = _QuorumRecorder(self.manager._client, vote)
        self.manager._client = self._recorder
        self._checkpointer: Any = None
        self._params: Any = None
        #: The steps at which this replica group healed from a peer.
        self.heal_steps: list[int] = []
        self.failed_commits = 0
        self._last_quorum_id: Any = None
        self._early = False  # whether the optimizer step starts the next quorum
        self._next_quorum = False  # whether a quorum started that start_step has not awaited
        self._rank_in_quorum, self._replicas_in_quorum = 0, 1

    # ------------------------------------------------------------------ wiring
    def comm_hook(self, state: Any, bucket: Any) -> torch.futures.Future:
        """DDP communication hook: the bucket averaged across the live replica groups through
        torchft's process group. When a peer dies during the reduction the manager records the
        error (the step will not commit) and the hook returns a completed future, so that the
        backward ends instead of waiting on a future that never completes."""
        buffer = bucket.buffer()
        work = self.manager.allreduce(buffer)
        ok = work.wait()
        fut = getattr(work.get_future(), "_fut", None)
        if ok is False or fut is None or self.manager.errored() is not None:
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(buffer.zero_())  # discarded: this step does not commit
            return done
        return fut

    def wrap_ddp(self, wrapper_cfg: Mapping[str, Any], module: nn.Module, build: Any) -> nn.Module:
        """Build the DDP wrapper (``build(cfg, default_args)``) on a dummy process group, its
        gradients reduced by :meth:`comm_hook`."""
        from torchft.process_group import ProcessGroupDummy

        cfg = dict(wrapper_cfg)
        if cfg.get("find_unused_parameters") is False or cfg.get("static_graph"):
            raise ValueError(
                "fault_tolerance needs DDP's find_unused_parameters=True and static_graph=False "
                f"(got {dict(wrapper_cfg)!r}): otherwise DDP rebuilds its gradient buckets after "
                "its first step, and a replica group that heals later would reduce its "
                "gradients in another layout than its peers; drop those keys"
            )
        # Fixed buckets: DDP rebuilds them after the first step unless it finds unused
        # parameters, and every replica, whenever it (re)joined, must lay them out alike.
        cfg["find_unused_parameters"] = True
        dummy = ProcessGroupDummy(0, 1)
        wrapper = build(cfg, default_args=dict(module=module, process_group=dummy))
        # unannotated: DDP compares a hook's annotations with the classes themselves
        hook = lambda state, bucket: self.comm_hook(state, bucket)  # noqa: E731
        wrapper.register_comm_hook(self.manager, hook)
        return wrapper

    def attach(
        self,
        checkpointer: Any,
        wrappers: Mapping[str, Any],
        params: Any = None,
        model: nn.Module | None = None,
    ) -> None:
        """Heal through ``checkpointer``'s registered state objects (each rank its own part:
        :meth:`~shardwise.checkpoint.checkpointer.Checkpointer.local_state_dict`) and let each
        optimizer wrapper step only when the quorum commits. ``params()``: the parameters
        whose gradients (shards) are averaged across the live replica groups before each
        step (FT-HSDP; None: the DDP hook already did). With the FSDP2 ``model``, the
        parameters of its ``fully_shard``-ed modules are averaged in FSDP's all-reduce hook
        instead (:meth:`reduce_hook`: the reduce-scatter's flat output, as soon as each
        module's gradients are reduced inside the group, no copy); ``params()`` keeps the
        others (none in general)."""
        self._checkpointer = checkpointer
        self._params = params
        if model is not None and params is not None and self.fsdp_hook:
            hooked = self._install_reduce_hooks(model)
            if hooked:
                rest = [p for p in params() if id(p) not in hooked]
                self._params = (lambda: rest) if rest else None
        self.manager.register_state_dict_fn("shardwise", self.load_state_dict, self.state_dict)
        gated = [w for w in wrappers.values() if not getattr(w, "_ft_gated", False)]
        # the next step's quorum starts as soon as this one commits (see start_step); with
        # several optimizer wrappers each votes, so the quorum waits for start_step
        self._early = self.early_quorum and len(wrappers) == 1
        for wrapper in gated:
            original = wrapper.step

            def step(_original: Any = original, **kwargs: Any) -> None:
                if self._params is not None:
                    self.allreduce_gradients(self._params())
                committed = self.should_commit()
                if self._early:
                    self._start_next_quorum()
                if committed:
                    _original(**kwargs)

            wrapper.step = step
            wrapper._ft_gated = True

    #: Average FSDP2's gradient shards in its all-reduce hook (else after backward, flat).
    fsdp_hook = True
    #: Start the next step's quorum when a step's commit vote ends (else in start_step).
    early_quorum = True
    #: Take the commit vote over the replica group's own process group (one rank: none).
    commit_over_pg = True

    def _install_reduce_hooks(self, model: nn.Module) -> set[int]:
        """Set :meth:`reduce_hook` on every ``fully_shard``-ed module of ``model``; the ids
        of the parameters it covers (their gradient shards pass through it)."""
        from torch.distributed.fsdp import FSDPModule

        hooked: set[int] = set()
        for module in model.modules():
            if not isinstance(module, FSDPModule):
                continue
            groups = module._get_fsdp_state()._fsdp_param_groups
            if len(groups) != 1:  # per-parameter meshes: torch refuses the hook
                continue
            module.set_all_reduce_hook(self.reduce_hook)
            hooked.update(id(fsdp_param.sharded_param) for fsdp_param in groups[0].fsdp_params)
        return hooked

    def reduce_hook(self, reduce_output: torch.Tensor) -> None:
        """FSDP2's all-reduce hook: a module's gradient shards, reduced inside the replica
        group (one flat buffer, viewed by the sharded gradients afterwards), averaged in place
        with the same rank of every live replica group. A peer lost during the reduction
        leaves the manager errored (the step does not commit)."""
        self.manager.allreduce(reduce_output).wait()

    def allreduce_gradients(self, params: Any) -> None:
        """Average this rank's gradients (its DTensor shards) with the same rank of every
        live replica group through torchft's process group: one flat buffer per dtype. A
        peer lost during the reduction leaves the manager errored (the step does not
        commit)."""
        grads = []
        for p in params:
            if p.grad is not None:
                g = p.grad
                grads.append(g.to_local() if hasattr(g, "to_local") else g)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for group in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in group])
            self.manager.allreduce(flat).wait()
            if self.manager.errored() is not None:
                return
            offset = 0
            for g in group:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def state_dict(self) -> dict[str, Any]:
        """This rank's part of the whole training state, every registered state object's
        local state by key (tensors copied; no collective): what the same rank of a healing
        peer group receives."""
        return _clone(self._checkpointer.local_state_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load what a peer's :meth:`state_dict` gave, every state object in registration
        order (the random state before a loop that reseeds its sampler)."""
        states = self._checkpointer.states
        if set(state_dict) != set(states):
            raise RuntimeError(
                f"replica group {self.replica_group}: the peer's state has "
                f"{sorted(state_dict)}, this replica registers {sorted(states)}; every replica "
                "group must run the same config"
            )
        self._checkpointer.load_local_state_dict(state_dict)
        self.heal_steps.append(self.manager.current_step())
        self.logger.info(
            "replica group %d healed from a live peer at step %d",
            self.replica_group,
            self.manager.current_step(),
        )

    # ------------------------------------------------------------------ the step
    def start_step(self) -> int:
        """Join this step's quorum (healing from a peer if this replica is behind) and return
        the step to run: the number of steps the quorum has committed.

        The quorum of step ``n + 1`` is requested as soon as step ``n``'s commit vote ends
        (during the optimizer step and what the loop does up to here), and awaited here;
        until then a healing peer's copy of this replica's state waits (torchft's state-dict
        lock), so that it is the state at this call, as with a quorum started here."""
        manager = self.manager
        try:
            if self._next_quorum:
                self._next_quorum = False
                manager.allow_state_dict_read()  # a peer's copy may be taken from here on
                manager.wait_quorum()
                if manager._healing:  # what torchft's synchronous start_quorum does
                    manager._apply_pending_state_dict()
                    manager._healing = False
            else:
                manager.start_quorum()
        except Exception as e:
            raise RuntimeError(
                f"replica group {self.replica_group}: no quorum within quorum_timeout="
                f"{self.timeouts['quorum_timeout']}s from the lighthouse "
                f"{self.cfg['lighthouse']} ({_first_line(e)}); are the other replica groups "
                "and the lighthouse running?"
            ) from e
        self._check_quorum()
        rank = manager.participating_rank()
        self._rank_in_quorum = 0 if rank is None else rank
        self._replicas_in_quorum = max(1, manager.num_participants())
        if manager.errored() is not None and self._recorder.last is not None:
            self.logger.warning(
                "replica group %d: step %d will not commit: %s",
                self.replica_group,
                manager.current_step(),
                _first_line(manager.errored()),
            )
        return manager.current_step()

    def _start_next_quorum(self) -> None:
        """Request the next step's quorum now, in torchft's quorum thread (what
        ``Manager.start_quorum`` does, without waiting for it); a peer that heals from this
        replica gets its state only once :meth:`start_step` is reached."""
        manager = self.manager
        manager.disallow_state_dict_read()
        if manager._quorum_future is not None:
            manager._quorum_future.result()
        manager._errored = None
        manager._healing = False
        manager._quorum_future = manager._executor.submit(
            manager._async_quorum,
            allow_heal=True,
            shrink_only=False,
            quorum_timeout=manager._quorum_timeout,
            curr_device=(
                torch.accelerator.current_device_index() if torch.accelerator.is_available() else -1
            ),
        )
        self._next_quorum = True

    def _check_quorum(self) -> None:
        quorum = self._recorder.last
        if quorum is None or quorum.quorum_id == self._last_quorum_id:
            return
        self._last_quorum_id = quorum.quorum_id
        groups = []
        for replica_id in quorum.replica_ids:
            match = _ID.match(replica_id.split(":")[0])
            if match is None or (int(match[1]), int(match[2])) != (
                self.num_replica_groups,
                self.min_replicas,
            ):
                raise RuntimeError(
                    f"replica group {self.replica_group}: the quorum holds {replica_id!r}, "
                    f"started with another config than this group's num_replica_groups="
                    f"{self.num_replica_groups} min_replicas={self.min_replicas}; start every "
                    "replica group with the same fault_tolerance num_replica_groups and "
                    "min_replicas"
                )
            groups.append(int(match[3]))
        if len(set(groups)) != len(groups):
            raise RuntimeError(
                f"replica group {self.replica_group}: two live replica groups share a "
                f"replica_group id ({sorted(groups)}); give each its own 0.."
                f"{self.num_replica_groups - 1}"
            )
        self.logger.info(
            "replica group %d: quorum %s of replica groups %s, step %d",
            self.replica_group,
            quorum.quorum_id,
            sorted(groups),
            quorum.max_step,
        )

    def should_commit(self) -> bool:
        """Whether every live replica group finished this step's gradients: the optimizer
        steps only then."""
        try:
            ok = self.manager.should_commit()
        except Exception as e:
            raise RuntimeError(
                f"replica group {self.replica_group}: the commit vote failed "
                f"(timeout={self.timeouts['timeout']}s, max_retries="
                f"{self.cfg['max_retries']}): {_first_line(e)}"
            ) from e
        if not ok:
            self.failed_commits += 1
            self.logger.warning(
                "replica group %d: step %d not committed (a replica group failed); it is redone",
                self.replica_group,
                self.manager.current_step(),
            )
        return ok

    @property
    def replica_rank(self) -> int:
        """This replica group's rank among the groups of the current step's quorum (the one
        :meth:`start_step` joined)."""
        return self._rank_in_quorum

    @property
    def num_replicas(self) -> int:
        """How many replica groups take part in the current step's quorum."""
        return self._replicas_in_quorum

    def current_step(self) -> int:
        """The number of steps committed."""
        return self.manager.current_step()

    def restore_step(self, step: int) -> None:
        """Start counting at ``step`` committed steps (a resume from a checkpoint, before the
        first quorum): the quorum heals the groups behind the furthest one."""
        self.manager.load_state_dict(dict(step=int(step), batches_committed=0))

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this replica group writes the run's checkpoints: the one of rank 0 in the
        current quorum (always live; every live replica holds the same state)."""
        return self.replica_rank == 0

    def shard(self, length: int) -> list[int]:
        """The indices of a step's global batch of ``length`` items that this rank reads:
        a disjoint part for each rank of each replica group in the current quorum
        (``index % parts == part``), so that the live ranks read it all."""
        parts = self.num_replicas * self.group_world_size
        part = self.replica_rank * self.group_world_size + self.group_rank
        return list(range(part, length, parts))

    def shutdown(self, wait_for_group: bool = False) -> None:
        """Stop the manager's servers (the lighthouse goes on). ``wait_for_group`` (at a normal
        end, never after an error): first a barrier of the replica group, since the group's
        manager server lives in its rank 0 and the other ranks must have their answer to the
        last quorum before it stops."""
        if wait_for_group and self.group_world_size > 1:
            dist.barrier()  # a no-op without a process group
        self.manager.allow_state_dict_read()
        self.manager.shutdown(wait=False)


def _first_line(e: Any) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
