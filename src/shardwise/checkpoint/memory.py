"""The memory tier: every rank's state in node-local memory every ``interval`` steps,
replicated to peers in other failure domains, and recovered from them on a restart.

A *snapshot* is this rank's part of a sharded checkpoint (:func:`.sharded.save_sharded_checkpoint`
planned by each rank alone: its ``__{rank}_0.distcp`` and metadata fragment; rank 0 also
``meta.pt`` and ``layout.json``) written into a *slot* of a directory that outlives the process
(``/dev/shm`` by default: memory, gone only with the node). Each owner rank has two slots per
node directory; a snapshot goes into the older one, whose marker (``snapshot.json``: step, run,
world, each file's size and checksum) is removed first and written last, so a crash mid-write
leaves the other slot's snapshot whole and never a half one that reads as complete. A slot's
data file is written whole once; after that only its tensors' bytes are copied over, into the
pages kept mapped (:func:`.records.write_records`' ``rewrite``).

The *policy* (who keeps whose copy) is :class:`Topology`: ranks are grouped into failure domains
of ``domain_size`` consecutive ranks (a node: torchrun's ``LOCAL_WORLD_SIZE``), and rank ``r``
sends its snapshot to ``r + i * domain_size`` for ``i`` in ``1..replicas`` (NVIDIA
resiliency-ext's clique replication with a ``replication_jump`` of one node). The *mechanism* is
:class:`MemoryTier`: the training thread takes the state (CPU tensors as they are; device
tensors staged to host buffers, as an asynchronous save does, :mod:`.async_save`); a background
thread writes the slot, its marker, and exchanges the snapshot with the replica peers over a
gloo group of its own, each file sent from its pages and received into the peer's file; the
next optimizer step waits for that thread (a crash loses at most ``interval`` steps), a forward
that updates buffers for the tensors' copy. Each rank holds a lock of its run's directory for
as long as it lives, so a second run of the same work_dir on the machine is refused.

*Recovery* (:meth:`MemoryTier.recover`, on a restart with ``resume=True``): every rank lists
the complete snapshots in its node's directory (its own and the replicas it holds); the ranks
agree on the newest step for which every owner's snapshot exists somewhere; each rank gathers
the files it reads (its own owner's and rank 0's on the same world size, every owner's on
another: the sharded reader reshards) from its node's memory, by hard link, or from a peer
that holds them, by point-to-point transfers in one global order (no deadlock); a manifest of
the recorded checksums makes the read verify every chunk. The result is an ordinary sharded
checkpoint directory that :meth:`~.checkpointer.Checkpointer.resume` reads onto any layout.

Example (a strategy keyword; the Runner snapshots after each ``interval``-th iteration)::

    strategy = dict(type='FSDPStrategy',
                    memory_checkpoint=dict(interval=1, replicas=1))
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor

from ..env import gc_paused
from ..tree import map_tensors
from .agreement import gather_outcomes
from .async_save import AsyncCheckpointer
from .files import CheckpointError, atomic_write_text, describe_error, file_identity
from .manifest import ALGORITHM, MANIFEST, build_manifest
from .sharded import forget, save_sharded_checkpoint

__all__ = [
    "MARKER",
    "MemoryCheckpoint",
    "MemoryTier",
    "Recovered",
    "Topology",
    "attach_memory_tier",
    "format_memory",
    "inspect_memory",
    "list_snapshots",
    "parse_memory_checkpoint",
]

logger = logging.getLogger(__name__)

#: The marker of a complete snapshot in its slot (written last, removed first).
MARKER = "snapshot.json"
SLOTS = ("slot0", "slot1")
#: Where snapshots go unless ``dir`` (or ``SHARDWISE_MEMORY_DIR``) says otherwise.
DEFAULT_DIR = "/dev/shm/shardwise"
_KEYS = ("interval", "replicas", "dir", "failure_domain")


@dataclass(frozen=True)
class MemoryCheckpoint:
    """The ``memory_checkpoint`` keyword of a strategy.

    Args:
        interval: a snapshot after every ``interval``-th training iteration.
        replicas: how many peers in other failure domains keep a copy of each snapshot.
        dir: the node-local directory (memory: ``/dev/shm``); ``{domain}`` in it is replaced
            by the failure domain's index (to simulate nodes on one machine).
        failure_domain: ``'node'`` (torchrun's ``LOCAL_WORLD_SIZE`` ranks a domain) or the
            number of consecutive ranks a domain holds.
    """

    interval: int = 1
    replicas: int = 1
    dir: str = field(default_factory=lambda: os.environ.get("SHARDWISE_MEMORY_DIR", DEFAULT_DIR))
    failure_domain: str | int = "node"


def parse_memory_checkpoint(value: Any) -> MemoryCheckpoint | None:
    """``memory_checkpoint`` as given to a strategy (None, False, True or a dict), checked."""
    if value is None or value is False:
        return None
    if value is True:
        return MemoryCheckpoint()
    example = "dict(interval=1, replicas=1)"
    if not isinstance(value, Mapping):
        raise TypeError(f"memory_checkpoint must be a dict such as {example}, got {value!r}")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(
            f"memory_checkpoint has unknown keys {unknown}; it takes {list(_KEYS)}, e.g. {example}"
        )
    config = MemoryCheckpoint(**value)
    for key in ("interval", "replicas"):
        number = getattr(config, key)
        low = 1 if key == "interval" else 0
        if isinstance(number, bool) or not isinstance(number, int) or number < low:
            raise ValueError(
                f"memory_checkpoint {key}={number!r}: expected an integer >= {low}, e.g. {example}"
            )
    domain = config.failure_domain
    if domain != "node" and (isinstance(domain, bool) or not isinstance(domain, int) or domain < 1):
        raise ValueError(
            f"memory_checkpoint failure_domain={domain!r}: expected 'node' or the number of "
            "consecutive ranks a failure domain holds (an integer >= 1)"
        )
    if not isinstance(config.dir, str | os.PathLike) or not str(config.dir):
        raise ValueError(f"memory_checkpoint dir={config.dir!r}: expected a directory path")
    return config


@dataclass(frozen=True)
class Topology:
    """Who keeps whose snapshot: failure domains of ``domain_size`` consecutive ranks; rank
    ``r``'s replicas on ``r + i * domain_size`` for ``i`` in ``1..replicas`` (capped at the
    number of other domains)."""

    rank: int
    world: int
    domain_size: int
    replicas: int

    @property
    def domains(self) -> int:
        return -(-self.world // self.domain_size)

    def domain(self, rank: int | None = None) -> int:
        return (self.rank if rank is None else rank) // self.domain_size

    @property
    def copies(self) -> int:
        """The replicas kept: at most one in each other domain."""
        return min(self.replicas, self.domains - 1)

    def sends_to(self) -> list[int]:
        return [(self.rank + i * self.domain_size) % self.world for i in range(1, self.copies + 1)]

    def receives_from(self) -> list[int]:
        return [(self.rank - i * self.domain_size) % self.world for i in range(1, self.copies + 1)]


@dataclass
class Recovered:
    """A snapshot gathered for this rank into ``path`` (an ordinary sharded checkpoint)."""

    path: Path
    step: int
    world: int  # the world size that wrote it
    local_bytes: int  # read from this node's memory
    fetched_bytes: int  # received from peers
    seconds: float
    written: float  # when its newest part was written (time.time())

    def resume(
        self, resume: Callable[[str], dict[str, Any]], retention: Any, log: logging.Logger
    ) -> dict[str, Any]:
        """``resume(path)``, then the gathered files removed and the retention lists the
        snapshot recorded taken over; the checkpoint's other entries."""
        log.info(
            "Resuming from the memory snapshot of step %d (written by %d ranks %.0f s ago): "
            "%.1f MB from this node's memory, %.1f MB from peers, gathered in %.2f s",
            self.step,
            self.world,
            time.time() - self.written,
            self.local_bytes / 1e6,
            self.fetched_bytes / 1e6,
            self.seconds,
        )
        try:
            checkpoint = resume(str(self.path))
        finally:
            shutil.rmtree(self.path, ignore_errors=True)
        kept = checkpoint.get("meta", {}).get("kept_checkpoints")
        if isinstance(kept, Mapping):
            retention.kept = {str(k): list(v) for k, v in kept.items()}
        return checkpoint


def _run_key(work_dir: Any) -> str:
    """The directory a run's snapshots go to under ``dir``: its work_dir's, so that two runs on
    one machine never mix."""
    return "run-" + hashlib.sha1(str(work_dir).encode()).hexdigest()[:16]


def _read_marker(slot: Path) -> dict[str, Any] | None:
    """The slot's marker when the snapshot is complete (every file there, of its size)."""
    try:
        marker = json.loads((slot / MARKER).read_text())
        files = marker["files"]
        for name, (size, _) in files.items():
            if (slot / name).stat().st_size != size:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    marker["slot"] = str(slot)
    return marker


def list_snapshots(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete snapshots under a run's memory directory (``shardwise ckpt inspect``'s
    view and the recovery's inventory): each marker, with its ``slot``."""
    found = []
    for slot in sorted(Path(root).glob("rank*/slot*")):
        marker = _read_marker(slot)
        if marker is not None:
            found.append(marker)
    return found


def inspect_memory(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What ``shardwise ckpt inspect`` says of a memory directory (``dir``, one run's
    directory in it, or a slot): each run's snapshots on this node, by owner rank, and the
    steps whose every owner's snapshot is here; None when ``path`` holds no snapshot."""
    path = Path(path)
    if (path / MARKER).is_file():
        runs = [path.parent.parent]
    elif list(path.glob("rank*/slot*")):
        runs = [path]
    else:
        runs = sorted(p for p in path.glob("run-*") if p.is_dir())
    described = []
    for run in runs:
        snapshots = list_snapshots(run)
        if (path / MARKER).is_file():
            snapshots = [m for m in snapshots if Path(m["slot"]) == path]
        if not snapshots:
            continue
        rows = [
            dict(
                owner=m["owner"],
                step=m["step"],
                world=m["world"],
                run=m["run"],
                slot=Path(m["slot"]).name,
                bytes=sum(size for size, _ in m["files"].values()),
                age_s=round(time.time() - m["time"], 1),
            )
            for m in sorted(snapshots, key=lambda m: (m["owner"], m["step"]))
        ]
        by_step: dict[tuple[str, int, int], set[int]] = {}
        for m in snapshots:
            by_step.setdefault(_key(m), set()).add(m["owner"])
        complete = sorted(k[1] for k, owners in by_step.items() if owners >= set(range(k[2])))
        described.append(
            dict(
                directory=str(run),
                work_dir=snapshots[0].get("work_dir"),
                snapshots=rows,
                complete_here=complete,
            )
        )
    return dict(format="memory", path=str(path), runs=described) if described else None


def format_memory(summary: Mapping[str, Any]) -> str:
    """:func:`inspect_memory`'s summary as text."""
    lines = [f"{summary['path']}: memory snapshots (memory_checkpoint)"]
    for run in summary["runs"]:
        lines.append(f"  {run['directory']} (work_dir {run['work_dir']})")
        lines.append("    owner  step  world  slot   size        age  run")
        for row in run["snapshots"]:
            lines.append(
                f"    {row['owner']:>5}  {row['step']:>4}  {row['world']:>5}  {row['slot']}  "
                f"{row['bytes'] / 2**20:>7.1f} MiB  {row['age_s']:>6.0f} s  {row['run']}"
            )
        complete = run["complete_here"]
        lines.append(
            f"    complete on this node alone: steps {complete}"
            if complete
            else "    no step is complete on this node alone (a recovery adds the peers' copies)"
        )
    return "\n".join(lines)


_ATOMIC = int | float | bool | str | bytes | None


def _keep_tensors(state: Any, devices: set[str]) -> Any:
    """``state`` with its tensors as they are (their device types added to ``devices``) and
    everything else copied (the training thread may change a dict the state holds, the
    message hub's, while it is written); a list of plain numbers (a history of a million
    losses) is copied whole, not item by item."""
    if isinstance(state, torch.Tensor):
        devices.add((state.to_local() if isinstance(state, DTensor) else state).device.type)
        return state
    if isinstance(state, _ATOMIC):
        return state
    if isinstance(state, dict):
        kept = copy.copy(state)  # its own type (an OrderedDict stays one)
        for key, value in state.items():
            kept[key] = _keep_tensors(value, devices)
        return kept
    if type(state) in (list, tuple):
        if all(isinstance(item, _ATOMIC) for item in state):
            return type(state)(state)
        return type(state)(_keep_tensors(item, devices) for item in state)
    return copy.deepcopy(state)


def _local_bytes(state: Any) -> int:
    """The bytes of this rank's tensors in ``state`` (a DTensor's own shard)."""
    total = [0]

    def count(t: torch.Tensor) -> torch.Tensor:
        local = t.to_local() if isinstance(t, DTensor) else t
        total[0] += local.numel() * local.element_size()
        return t

    map_tensors(count, state)
    return total[0]


class MemoryTier:
    """Snapshots to node-local memory, replication to peers and recovery from them (see the
    module docstring).

    Args:
        config: the parsed ``memory_checkpoint``.
        take_state: the checkpoint dict of every registered state (``meta`` merged in).
        watch: ``watch(staged, durable)`` registers ``durable`` to run before each optimizer
            step (the previous snapshot is then in memory and replicated: a crash loses at
            most ``interval`` steps) and ``staged`` before any other change of a saved tensor
            (a forward that updates buffers: the snapshot's copy of them is taken).
        work_dir: the run's work_dir (its snapshots are kept apart from other runs').
        rank, world: this process's place.
    """

    def __init__(
        self,
        config: MemoryCheckpoint,
        take_state: Callable[[Mapping[str, Any]], dict[str, Any]],
        watch: Callable[[Callable[[], None], Callable[[], None]], None],
        work_dir: Any,
        rank: int,
        world: int,
        log: logging.Logger | None = None,
    ) -> None:
        self.config = config
        domain_size = config.failure_domain
        if domain_size == "node":
            domain_size = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        self.topology = Topology(rank, world, max(1, min(int(domain_size), world)), config.replicas)
        self.root = Path(config.dir.format(domain=self.topology.domain())) / _run_key(work_dir)
        self.work_dir = str(work_dir)
        self.logger = log or logger
        self._take_state = take_state
        self._watch = watch
        self.stager = AsyncCheckpointer()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._run = ""  # agreed by every rank in begin()
        self._in_place = True  # the snapshot in flight writes the live tensors
        self._lock_handle: Any = None  # this rank's lock of the directory (see _lock)
        self._begun = False
        self._written: dict[Path, tuple[int, ...]] = {}  # slot file -> as this process wrote it
        #: the steps snapshotted, the seconds the training thread spent in them, in all
        self.snapshots, self.blocked_s = 0, 0.0
        #: the background thread's seconds writing snapshots and replicating them, in all
        self.seconds = {"write": 0.0, "replicate": 0.0}
        #: what the last :meth:`recover` gathered (its bytes from memory and from peers)
        self.recovered: Recovered | None = None

    # ------------------------------------------------------------------ set-up
    @property
    def distributed(self) -> bool:
        return self.topology.world > 1 and torch_dist.is_available() and torch_dist.is_initialized()

    def _gather(self, obj: Any, what: str) -> list[Any]:
        return gather_outcomes(obj, self.stager.group(), what) if self.distributed else [obj]

    def begin(self, *, fresh: bool) -> None:
        """Every rank, once, before the first snapshot or recovery: agree on a run id, check
        that the node's directory has room for the slots (one line naming the size needed,
        on every rank), and on a ``fresh`` start remove what an earlier run of this work_dir
        left (it is never resumed)."""
        if self._begun:
            return
        self._begun = True
        top = self.topology
        if top.world > 1 and top.copies < self.config.replicas:
            if top.rank == 0:
                self.logger.warning(
                    "memory_checkpoint replicas=%d, but %d rank(s) a failure domain over %d "
                    "ranks leave %d other domain(s): keeping %d replica(s); a lost node loses "
                    "its snapshots",
                    self.config.replicas,
                    top.domain_size,
                    top.world,
                    top.domains - 1,
                    top.copies,
                )
        run, size = uuid.uuid4().hex[:12], _local_bytes(self._take_state({}))
        sizes = self._gather((run, size, self._lock()), "starting the memory checkpoint tier")
        taken = [(rank, held) for rank, (_, _, held) in enumerate(sizes) if held]
        if taken:
            rank, held = taken[0]
            raise CheckpointError(
                f"memory_checkpoint: another run on rank {rank}'s machine ({held}) is keeping "
                f"snapshots of work_dir {self.work_dir} in {self.root.parent}: two runs of one "
                "work_dir would mix them; give this run another work_dir, or stop the other"
            )
        self._run = sizes[0][0]
        self._check_room([size for _, size, _ in sizes])
        if fresh:
            self._remove_earlier_snapshots()
        self.root.mkdir(parents=True, exist_ok=True)

    def _lock(self) -> str | None:
        """Hold this rank's lock of the run's memory directory for as long as the process
        lives (the kernel drops it when the process dies, even by SIGKILL); None when taken,
        else what the process holding it wrote into it."""
        locks = self.root.parent / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        path = locks / f"{self.root.name}.rank{self.topology.rank}"
        handle = open(path, "a+")  # noqa: SIM115 - held open while the process lives
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            held = handle.read().strip() or "another process"
            handle.close()
            return held
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        self._lock_handle = handle
        return None

    def _check_room(self, sizes: list[int]) -> None:
        """Refuse, on every rank alike, a node whose directory cannot hold the slots of its
        ranks and of the replicas it keeps."""
        top = self.topology
        needed: dict[int, int] = {}
        for owner, size in enumerate(sizes):
            holders = {top.domain(owner)} | {
                top.domain((owner + i * top.domain_size) % top.world)
                for i in range(1, top.copies + 1)
            }
            for domain in holders:
                needed[domain] = needed.get(domain, 0) + len(SLOTS) * size
        mine = needed.get(top.domain(), 0)
        directory = self.root.parent
        directory.mkdir(parents=True, exist_ok=True)
        # each rank's free space and what this run's snapshots hold there already (replaced,
        # not added to), measured before any rank of a node may remove them, and gathered:
        # every rank decides on the same figures
        free = shutil.disk_usage(directory).free
        have = self._gather((free, self._held()), "checking the memory checkpoint directory")
        short = [
            (r, needed[top.domain(r)], f)
            for r, (f, held) in enumerate(have)
            if f < needed.get(top.domain(r), 0) - held
        ]
        if short:
            rank, need, free = short[0]
            raise CheckpointError(
                f"memory_checkpoint: {directory} on rank {rank}'s node has {free / 2**20:.0f} "
                f"MiB free; its snapshots need {need / 2**20:.0f} MiB (two slots of each of its "
                f"ranks' state and of the replicas it keeps; this rank's needs {mine / 2**20:.0f}"
                " MiB). Give memory_checkpoint a dir with room (dir=...), fewer replicas, or "
                "more memory to /dev/shm"
            )

    def _held(self) -> int:
        """Bytes this run's snapshots already take in this node's directory."""
        total = 0
        for folder, _, names in os.walk(self.root):  # none where it does not exist
            for name in names:
                try:
                    total += os.stat(os.path.join(folder, name)).st_size
                except FileNotFoundError:  # removed meanwhile: holds nothing
                    pass
        return total

    def _remove_earlier_snapshots(self) -> None:
        top = self.topology
        if top.rank % top.domain_size == 0 and self.root.exists():
            earlier = list_snapshots(self.root)
            shutil.rmtree(self.root, ignore_errors=True)
            if earlier:
                newest = max(m["step"] for m in earlier)
                self.logger.warning(
                    "memory_checkpoint: removed %d snapshot(s) of an earlier run of this "
                    "work_dir (newest: step %d) from %s: this run starts from scratch "
                    "(resume=True would have resumed from them)",
                    len(earlier),
                    newest,
                    self.root,
                )
        self._gather(None, "clearing the memory checkpoint directory")

    # ------------------------------------------------------------------ snapshots
    def due(self, step: int) -> bool:
        """Whether the iteration that ends at ``step`` (counted from 1) is snapshotted."""
        return step % self.config.interval == 0

    @gc_paused()
    def snapshot(self, step: int, meta: Mapping[str, Any]) -> None:
        """Snapshot every state at ``step`` (every rank, after the optimizer step): takes the
        state (``meta`` merged into its ``meta``), stages it to host memory and leaves the
        copy, the write and the replication to a background thread, which the next optimizer
        step waits for. Python's cyclic collector is paused until that thread ends: a snapshot
        makes enough objects to set off a full pass every few steps, which holds the
        interpreter lock for as long as it walks every object of the process (~0.15-0.19 s
        with the 25M GPT of bench/, more than the snapshot's whole write)."""
        start = time.perf_counter()
        self.begin(fresh=True)
        self.wait()
        state = self._take_state(dict(meta, memory_step=step))
        # CPU tensors are written as they are (the next change of any waits for the write);
        # device tensors are staged to host buffers first (the change waits for the copy)
        devices: set[str] = set()
        staged = _keep_tensors(state, devices)
        self._in_place = devices <= {"cpu"}
        if not self._in_place:
            staged = self.stager.stage(state)
        del state
        if not self.snapshots:
            self._watch(self._before_change, self.wait)
        self._thread = threading.Thread(
            target=self._write_and_replicate,
            args=(staged, step),
            name=f"shardwise-memory:{step}",
            daemon=True,  # memory snapshots are not waited for at exit: the node keeps them
        )
        self._thread.start()
        self.snapshots += 1
        self.blocked_s += time.perf_counter() - start

    def _before_change(self) -> None:
        """Before a saved tensor changes outside the optimizer step (a forward that updates
        buffers): the snapshot's copy of it is taken."""
        if self._in_place:
            self.wait()
        else:
            self.stager.wait_for_staging()

    def wait(self) -> None:
        """Block until the snapshot in flight is written and replicated; raise its failure."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self.stager.wait_for_staging()
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(
                f"memory_checkpoint: a snapshot failed on rank {self.topology.rank}: "
                f"{describe_error(error)}"
            ) from error

    @gc_paused()
    def _write_and_replicate(self, staged: dict[str, Any], step: int) -> None:
        try:
            self.stager.copy_staged()
            start = time.perf_counter()
            group = self.stager.group() if self.distributed else None
            slot = self._open_slot(self.topology.rank)
            written = save_sharded_checkpoint(staged, slot, process_group=group, rewrite=True)
            self.seconds["write"] += time.perf_counter() - start
            files = {}
            for item in written:
                path = Path(getattr(item, "path", item))
                files[path.name] = [path.stat().st_size, getattr(item, "checksum", None)]
            marker = dict(
                step=step,
                run=self._run,
                world=self.topology.world,
                owner=self.topology.rank,
                work_dir=self.work_dir,
                time=time.time(),
                algorithm=ALGORITHM,
                files=files,
            )
            self._keep(slot, files)
            atomic_write_text(slot / MARKER, json.dumps(marker))
            if self.distributed and self.topology.copies:
                start = time.perf_counter()
                self._replicate(slot, marker, group)
                self.seconds["replicate"] += time.perf_counter() - start
        except BaseException as exc:  # noqa: BLE001 - raised on the training thread
            self._error = exc

    def _open_slot(self, owner: int) -> Path:
        """The older of ``owner``'s two slots in this node's directory, its marker removed
        first (from then on it is not a snapshot). The files this process wrote there stay,
        to be written over (their memory pages reused: no new pages each step); any other
        file goes (one another process may still map: a recovery's read of it)."""
        base = self.root / f"rank{owner}"
        ages = []  # another run's snapshot (or none) first, then the older step
        for name in SLOTS:
            marker = _read_marker(base / name)
            ours = marker is not None and marker["run"] == self._run
            ages.append((ours, marker["step"] if ours else -1))
        slot = base / SLOTS[ages.index(min(ages))]
        (slot / MARKER).unlink(missing_ok=True)
        slot.mkdir(parents=True, exist_ok=True)
        for path in slot.iterdir():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif self._written.get(path) != file_identity(path):
                path.unlink(missing_ok=True)
        return slot

    def _keep(self, slot: Path, files: Mapping[str, Any]) -> None:
        """Remember the files this process wrote into ``slot`` (see :meth:`_open_slot`)."""
        self._written.update({slot / name: file_identity(slot / name) for name in files})

    def _replicate(self, slot: Path, marker: dict[str, Any], group: Any) -> None:
        """Send this rank's snapshot to its replica peers and keep theirs: the markers'
        lengths, the markers, then each file from its pages in memory into the receiver's
        file, mapped (no copy in user space)."""
        top = self.topology
        header = json.dumps(marker).encode()
        for dst, src in zip(top.sends_to(), top.receives_from(), strict=True):
            their = torch.empty(1, dtype=torch.int64)
            _exchange([torch.tensor([len(header)])], [their], dst, src, group)
            their_header = torch.empty(int(their[0]), dtype=torch.uint8)
            _exchange([_bytes(header)], [their_header], dst, src, group)
            received = json.loads(bytes(their_header.numpy()))
            replica = self._open_slot(received["owner"])
            _exchange(
                _mapped(slot, marker["files"]),
                _mapped(replica, received["files"], create=True),
                dst,
                src,
                group,
            )
            self._keep(replica, received["files"])
            atomic_write_text(replica / MARKER, json.dumps(received))

    # ------------------------------------------------------------------ recovery
    def start(self, *, resume: bool, placed: bool) -> Recovered | None:
        """Where a run starts (every rank): with ``resume``, the newest complete snapshot
        gathered (:meth:`recover`), else None; a run that does not resume removes what an
        earlier run of its work_dir left."""
        if resume:
            return self.recover(placed=placed)
        self.begin(fresh=True)
        return None

    def recover(self, *, placed: bool) -> Recovered | None:
        """Gather the newest snapshot every owner's part of exists for (collective on every
        rank); None when memory holds no complete one. ``placed``: the reader reads onto
        shards (only this rank's owner's and rank 0's files are needed on the same world
        size); else each rank reads every owner's files."""
        start = time.perf_counter()
        self.begin(fresh=False)
        top = self.topology
        mine = list_snapshots(self.root)
        inventories = self._gather(
            [{k: m[k] for k in ("owner", "step", "run", "world", "files", "time")} for m in mine],
            "listing the memory snapshots",
        )
        chosen = _newest_complete(inventories)
        if chosen is None:
            steps = sorted({m["step"] for inv in inventories for m in inv})
            if top.rank == 0:
                self.logger.info(
                    "memory_checkpoint: no complete snapshot in memory%s; resuming from storage",
                    f" (partial steps: {steps[-3:]})" if steps else "",
                )
            return None
        (run, step, world), holders = chosen
        needed = _owners_read(top.rank, top.world, world, placed)
        files = {
            owner: next(
                m["files"]
                for inv in inventories
                for m in inv
                if (_key(m), m["owner"]) == (chosen[0], owner)
            )
            for owner in range(world)
        }
        out = self.root / f"recover-rank{top.rank}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        local = fetched = 0
        slots = {m["owner"]: Path(m["slot"]) for m in mine if (m["run"], m["step"]) == (run, step)}
        for owner in needed:
            if owner in slots:
                local += _link_files(slots[owner], out, files[owner])
        plan = _transfer_plan(top.world, world, placed, inventories, chosen[0], holders)
        group = self.stager.group() if self.distributed else None
        for receiver, owner, holder in plan:
            if holder == top.rank:
                for tensor in _mapped(slots[owner], files[owner]):
                    torch_dist.send(tensor, receiver, group=group)
            elif receiver == top.rank:
                for tensor in _mapped(out, files[owner], create=True):
                    torch_dist.recv(tensor, holder, group=group)
                    fetched += tensor.numel()
        known = {
            name: {"size": size, ALGORITHM: digest}
            for owner in needed
            for name, (size, digest) in files[owner].items()
        }
        manifest = build_manifest(out, known=known)
        atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        self._gather(None, "gathering the memory snapshot")
        for m in mine:  # the steps after it were not completed everywhere: never resumed
            if (m["run"], m["world"]) != (run, world) or m["step"] > step:
                (Path(m["slot"]) / MARKER).unlink(missing_ok=True)
        written = max(m["time"] for inv in inventories for m in inv if _key(m) == chosen[0])
        seconds = time.perf_counter() - start
        self.recovered = Recovered(out, step, world, local, fetched, seconds, written)
        self._run = run  # the run goes on: its next snapshots continue the same series
        return self.recovered

    def remove(self) -> None:
        """Remove this run's snapshots from this node (a run that ended)."""
        forget(self.root)  # the slots' pages this process keeps mapped
        shutil.rmtree(self.root, ignore_errors=True)


def _key(marker: Mapping[str, Any]) -> tuple[str, int, int]:
    return (marker["run"], marker["step"], marker["world"])


def _newest_complete(
    inventories: list[list[dict[str, Any]]],
) -> tuple[tuple[str, int, int], dict[int, list[int]]] | None:
    """The newest ``(run, step, world)`` every owner's snapshot exists for somewhere, with the
    ranks holding each owner's (None if there is none)."""
    holders: dict[tuple[str, int, int], dict[int, list[int]]] = {}
    newest: dict[tuple[str, int, int], float] = {}
    for rank, inventory in enumerate(inventories):
        for m in inventory:
            key = (m["run"], m["step"], m["world"])
            holders.setdefault(key, {}).setdefault(m["owner"], []).append(rank)
            newest[key] = max(newest.get(key, 0.0), m["time"])
    complete = [k for k, by_owner in holders.items() if set(by_owner) >= set(range(k[2]))]
    if not complete:
        return None
    best = max(complete, key=lambda k: (k[1], newest[k]))
    return best, holders[best]


def _owners_read(rank: int, world: int, saved_world: int, placed: bool) -> list[int]:
    """The owners whose files ``rank`` reads to resume a snapshot ``saved_world`` ranks wrote:
    onto shards of the same world size, its own owner's and rank 0's (``meta.pt``, the
    fragments and the plain tensors rank 0 saved once); else every owner's."""
    if placed and saved_world == world:
        return sorted({rank % saved_world, 0})
    return list(range(saved_world))


def _transfer_plan(
    world: int,
    saved_world: int,
    placed: bool,
    inventories: list[list[dict[str, Any]]],
    key: tuple[str, int, int],
    holders: Mapping[int, list[int]],
) -> list[tuple[int, int, int]]:
    """``(receiver, owner, holder)`` for every owner's files a rank needs and its node lacks,
    in one order every rank computes alike (each rank takes its part in that order: every
    transfer's two ranks reach it, so none waits on another forever)."""
    plan = []
    for receiver in range(world):
        have = {m["owner"] for m in inventories[receiver] if _key(m) == key}
        for owner in _owners_read(receiver, world, saved_world, placed):
            if owner not in have:
                plan.append((receiver, owner, min(holders[owner])))
    return plan


def _exchange(
    send: list[torch.Tensor], recv: list[torch.Tensor], dst: int, src: int, group: Any
) -> None:
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src`` (tagged in order)."""
    works = [torch_dist.isend(t, dst, group=group, tag=i) for i, t in enumerate(send) if t.numel()]
    works += [torch_dist.irecv(t, src, group=group, tag=i) for i, t in enumerate(recv) if t.numel()]
    for work in works:
        work.wait()


def _bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _mapped(slot: Path, files: Mapping[str, Any], create: bool = False) -> list[torch.Tensor]:
    """Each file of ``slot`` as a byte tensor over its pages (``create``: new files of the
    recorded sizes, whose tensors write into them)."""
    tensors = []
    for name, (size, _) in files.items():
        path = slot / name
        if create:  # an existing file of the slot is written over (its pages reused)
            with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o666), "r+b") as f:
                f.truncate(size)
        elif path.stat().st_size != size:
            raise CheckpointError(f"{path} has {path.stat().st_size} bytes, {size} were recorded")
        if size == 0:
            tensors.append(torch.empty(0, dtype=torch.uint8))
        else:
            tensors.append(torch.from_file(str(path), shared=create, size=size, dtype=torch.uint8))
    return tensors


def _link_files(slot: Path, out: Path, files: Mapping[str, Any]) -> int:
    """Hard links in ``out`` to the slot's files (a copy where links cannot be made); the
    bytes they hold."""
    total = 0
    for name, (size, _) in files.items():
        try:
            os.link(slot / name, out / name)
        except OSError:
            shutil.copyfile(slot / name, out / name)
        total += size
    return total


def attach_memory_tier(checkpointer: Any, config: MemoryCheckpoint, world: int) -> MemoryTier:
    """A :class:`MemoryTier` over ``checkpointer``'s registered states (its ``memory``): a
    snapshot holds what a save would (the retention lists in ``meta``); the next optimizer
    step waits until it is written and replicated, a forward that updates buffers until it
    is copied."""

    def take_state(meta: Mapping[str, Any]) -> dict[str, Any]:
        kept = (
            dict(kept_checkpoints=checkpointer.retention.kept)
            if checkpointer.retention.kept
            else {}
        )
        return checkpointer.state(extra_ckpt=dict(meta={**meta, **kept}))

    def watch(staged: Callable[[], None], durable: Callable[[], None]) -> None:
        for key, state in checkpointer.states.items():
            hook = getattr(state, "register_pre_change_hook", None)
            if hook is not None:
                hook(durable if key == "optimizer" else staged)

    rank = checkpointer.layout.rank
    tier = MemoryTier(
        config, take_state, watch, checkpointer.work_dir, rank, world, checkpointer.logger
    )
    checkpointer.memory = tier
    return tier
