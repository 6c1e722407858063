"""Claims and commits on object storage under concurrency, lost responses and takeovers.

A claim is the id its own write carried (a takeover right after it leaves the first run
refused, never both owners); a claim whose response was lost is recognised as the run's own;
a checkpoint counts as committed only when every object its manifest names is there, with its
size and version; a run rolls back to an older checkpoint of its prefix by resuming from it;
a store that ignores conditional writes is refused in one line (or saved to as one writer, with
``SHARDWISE_SINGLE_WRITER=1``); a save lists the prefix one level deep. The model-based test
(:class:`ClaimsModel`) interleaves two runs' claims, saves, deaths, lost responses, resumes and
rollbacks and checks the invariants after every step; its long run (>= 200 interleavings) is
in ``tests/test_object_claims_slow.py``.
"""

from __future__ import annotations

import io
import logging
import socket
import uuid

import pytest
import xxhash
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shardwise.checkpoint import CheckpointError, find_last_checkpoint, object_commit
from shardwise.checkpoint.manifest import ALGORITHM, MANIFEST
from shardwise.checkpoint.object_commit import (
    OWNER,
    Listing,
    ObjectCommit,
    PrefixClaimedError,
    RunClaims,
    committed_checkpoints_at,
    find_last_checkpoint_at,
)
from shardwise.checkpoint.storage import (
    ObjectURL,
    delete_objects,
    filesystem,
    list_objects,
    read_object,
    set_storage_options,
    write_object,
)
from tests.s3_server import FaultProxy
from tests.test_object_storage import _toy, s3  # noqa: F401 - the S3 server fixture
from tests.toy import train_steps

pytestmark = pytest.mark.usefixtures("outside_the_repository")  # URL work dirs log in ./


def _save(prefix: str, name: str, claims: RunClaims, data: bytes = b"x" * 16) -> ObjectURL:
    """A whole save of a directory checkpoint of two objects (one process)."""
    commit = ObjectCommit(f"{prefix}/{name}", work_dir=prefix, is_dir=True, claims=claims)
    with commit as staging:
        (staging / "a.bin").write_bytes(data)
        (staging / "b.bin").write_bytes(data[::-1])
    return commit.final


def _memory_prefix() -> str:
    return f"memory://claims-{uuid.uuid4().hex[:8]}/run"


# ----------------------------------------------------------------------------- proxies
class StoreWithoutConditionalWrites(FaultProxy):
    """The S3 server behind a proxy that drops ``If-None-Match`` and ``If-Match``: a store
    that does not honour conditional writes."""

    def __init__(self, server) -> None:
        super().__init__(server)

        class Handler(self._http.RequestHandlerClass):
            def _forward(self, body: bytes) -> None:
                del self.headers["If-None-Match"]
                del self.headers["If-Match"]
                super()._forward(body)

        self._http.RequestHandlerClass = Handler


class LosingProxy(FaultProxy):
    """A proxy that forwards the requests ``lose(method, path)`` names, then drops the
    connection instead of answering (the store acted; the client never heard)."""

    def __init__(self, server) -> None:
        super().__init__(server)
        self.lost: list[str] = []
        self._lose: list[tuple[str, str]] = []
        proxy = self

        class Handler(self._http.RequestHandlerClass):
            def _forward(self, body: bytes) -> None:
                if (self.command, self.path.split("?")[0]) not in proxy._lose:
                    return super()._forward(body)
                proxy._lose.remove((self.command, self.path.split("?")[0]))
                proxy.lost.append(f"{self.command} {self.path}")
                self.wfile = io.BytesIO()  # the answer goes nowhere
                super()._forward(body)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

        self._http.RequestHandlerClass = Handler

    def lose(self, method: str, path: str) -> None:
        self._lose.append((method, path))


@pytest.fixture
def through(s3):  # noqa: F811
    """``through(ProxyClass)``: a new bucket reached through that proxy: (proxy, bucket)."""
    started = []

    def start(kind):
        proxy = kind(s3).start()
        bucket = s3.bucket()
        set_storage_options(bucket, dict(endpoint_url=f"http://127.0.0.1:{proxy.port}"))
        started.append((proxy, bucket))
        return proxy, bucket

    yield start
    for proxy, bucket in started:
        set_storage_options(bucket, None)
        proxy.stop()


@pytest.fixture
def said():
    """The messages shardwise.checkpoint logs at WARNING and above, as a list."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("shardwise.checkpoint")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


# ----------------------------------------------------------------------------- claims
def test_a_claim_whose_response_was_lost_is_the_runs_own(through):
    proxy, bucket = through(LosingProxy)
    prefix = f"{bucket}/run"
    proxy.lose("PUT", f"/{prefix[5:]}/{OWNER}")
    claims = RunClaims()
    _save(prefix, "iter_1.pth", claims)  # the retry of the claim is answered 412: its own
    assert proxy.lost == [f"PUT /{prefix[5:]}/{OWNER}"]
    assert claims.owns(prefix)
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_1.pth"


def test_a_takeover_right_after_a_claim_leaves_one_owner():
    prefix = _memory_prefix()
    first, second = RunClaims(), RunClaims()
    _save(prefix, "iter_1.pth", first)
    second.resumed_from(f"{prefix}/iter_1.pth")  # a second run continues it: takes it over
    _save(prefix, "iter_2.pth", second)
    assert (first.owns(prefix), second.owns(prefix)) == (False, True)
    with pytest.raises(PrefixClaimedError, match=f"run {second.run} .* took it over"):
        _save(prefix, "iter_3.pth", first)
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_2.pth"


def test_a_checkpoint_with_a_missing_or_replaced_object_is_not_committed_nor_resumed():
    prefix = _memory_prefix()
    claims = RunClaims()
    for step in (1, 2, 3):
        _save(prefix, f"iter_{step}.pth", claims)
    delete_objects([f"{prefix}/iter_3.pth/b.bin"])  # its manifest is there, an object is not
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_2.pth"
    write_object(f"{prefix}/iter_2.pth/a.bin", b"y" * 16)  # same size, another version
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_1.pth"
    assert committed_checkpoints_at(prefix) == [f"{prefix}/iter_1.pth"]


@pytest.mark.parametrize("upload", ["before the takeover", "after the takeover"])
def test_a_save_overtaken_by_a_takeover_commits_nothing_and_leaves_the_new_owners_save(upload):
    """The overtaken save's upload done before the takeover (its commit is refused), or going
    on after it (uploads are only-if-absent: it fails there, the new owner's objects stay)."""
    prefix = _memory_prefix()
    first, second = RunClaims(), RunClaims()
    _save(prefix, "iter_1.pth", first)
    late = ObjectCommit(f"{prefix}/iter_2.pth", work_dir=prefix, is_dir=True, claims=first)
    staging = late.begin()
    (staging / "a.bin").write_bytes(b"1" * 16)
    late._prepare()
    digests = late._upload() if upload == "before the takeover" else {}
    second.resumed_from(f"{prefix}/iter_1.pth")
    _save(prefix, "iter_2.pth", second, b"2" * 16)  # takes over, saves the same name
    if digests:
        with pytest.raises(PrefixClaimedError, match="took it over while this checkpoint"):
            late._commit(digests)
    else:
        with pytest.raises(FileExistsError, match="a.bin was written by another writer"):
            late._upload()
    late._discard()  # what finish() does: the new owner's objects stay
    assert read_object(f"{prefix}/iter_2.pth/a.bin") == b"2" * 16
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_2.pth"


# ----------------------------------------------------------------------------- rollback
def test_resuming_an_older_checkpoint_rolls_the_run_back_keeping_the_newer_ones(said):
    prefix = _memory_prefix()
    strategy, model, wrapper, schedulers = _toy(prefix)
    for step in (1, 2, 3):
        train_steps(model, wrapper, schedulers, [step])
        strategy.save_checkpoint(f"iter_{step}.pth")
    back, *_ = _toy(prefix)  # a new run, resumed explicitly from iter_1
    back.resume(f"{prefix}/iter_1.pth")
    back.save_checkpoint("iter_2b.pth")
    rolled = [m for m in said if m.startswith("Rolling")]
    assert len(rolled) == 1
    assert rolled[0].startswith(f"Rolling {prefix} back to iter_1.pth: this run takes")
    assert "the newer checkpoints iter_2.pth, iter_3.pth are kept" in rolled[0]
    assert find_last_checkpoint(prefix) == f"{prefix}/iter_2b.pth"  # the resumed line
    assert [u.name for u in committed_checkpoints_at(prefix)] == [
        "iter_1.pth",
        "iter_2.pth",
        "iter_3.pth",
        "iter_2b.pth",
    ]
    with pytest.raises(CheckpointError, match="took it over"):  # the old line is refused
        strategy.save_checkpoint("iter_4.pth")


def test_a_run_that_resumed_the_newest_is_refused_once_another_committed_after_it():
    prefix = _memory_prefix()
    first = RunClaims()
    _save(prefix, "iter_1.pth", first)
    second = RunClaims()
    second.resumed_from(f"{prefix}/iter_1.pth")  # the newest, when it resumed
    _save(prefix, "iter_2.pth", first)  # the first run goes on: not a rollback
    with pytest.raises(PrefixClaimedError, match="has committed checkpoints there"):
        _save(prefix, "iter_2x.pth", second)
    assert first.owns(prefix)


# ----------------------------------------------------------------------------- stores
def test_a_store_that_ignores_conditional_writes_is_refused_in_one_line(through, monkeypatch, said):
    _, bucket = through(StoreWithoutConditionalWrites)
    prefix = f"{bucket}/run"
    with pytest.raises(PrefixClaimedError) as refused:
        _save(prefix, "iter_1.pth", RunClaims())
    assert str(refused.value) == (
        f"refusing to save to {prefix}: the store ignores conditional writes (If-None-Match: "
        "*; a second write only-if-absent of one object succeeded), which keep two runs from "
        "writing one prefix; use a store that honours them (AWS S3, a recent MinIO), or set "
        "SHARDWISE_SINGLE_WRITER=1 if you make sure only one run writes there"
    )
    assert not list_objects(prefix)  # nothing written, the probe deleted
    monkeypatch.setenv("SHARDWISE_SINGLE_WRITER", "1")
    claims = RunClaims()
    _save(prefix, "iter_1.pth", claims)
    _save(prefix, "iter_2.pth", claims)
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_2.pth"
    assert [m for m in said if "ignores conditional writes" in m] == [
        f"The store of {prefix} ignores conditional writes (a second write only-if-absent of "
        "one object succeeded); SHARDWISE_SINGLE_WRITER=1: saving as the one run writing "
        "there, which nothing checks"
    ]


def test_a_save_lists_the_prefix_one_level_deep_not_every_object(monkeypatch):
    prefix = _memory_prefix()
    claims = RunClaims()
    for step in range(6):
        _save(prefix, f"iter_{step}.pth", claims)
    listed: list[str] = []
    monkeypatch.setattr(
        object_commit, "list_objects", lambda p: listed.append(p) or list_objects(p)
    )
    _save(prefix, "iter_6.pth", claims)
    assert listed == [f"{prefix}/iter_6.pth"]  # its own objects, to pin their versions
    listed.clear()
    assert find_last_checkpoint_at(prefix) == f"{prefix}/iter_6.pth"
    assert listed == [f"{prefix}/iter_6.pth"]  # the newest candidate's objects alone


# ----------------------------------------------------------------------------- the model
def _whole(url: str) -> bool:
    """Ground truth: every object the manifest of ``url`` names is there with its size and
    checksum (read back, not listed)."""
    manifest = object_commit._read_json(ObjectURL(url) / MANIFEST)
    for rel, entry in manifest.get("files", {}).items():
        try:
            data = read_object(ObjectURL(url) / rel)
        except FileNotFoundError:
            return False
        if len(data) != entry["size"] or xxhash.xxh3_64(data).hexdigest() != entry[ALGORITHM]:
            return False
    return bool(manifest.get("files"))


class _Run:
    def __init__(self, claims: RunClaims) -> None:
        self.claims = claims
        self.alive = True
        self.save: ObjectCommit | None = None
        self.stage = ""
        self.files: dict = {}
        self.uploaded: dict[str, bytes] = {}


class ClaimsModel(RuleBasedStateMachine):
    """Two runs (at a time) on one prefix: claims, saves step by step (prepare, upload, the
    claim checked, the manifest), deaths between any steps and mid-upload, lost responses to
    the claim, resumes of the newest and rollbacks to an older one. After every step: at most
    one live run owns the prefix; every checkpoint the listing counts as committed is whole
    (read back: sizes and checksums); the checkpoint a resume picks is whole; the owner's
    uploaded objects of its save in flight are all there, as it wrote them.

    Not modelled: a takeover in the middle of an upload's transfer (a run taken over before
    its upload starts is refused there); uploads are only-if-absent, so its bytes never
    replace the new owner's objects (``tests/test_storage_transport.py``)."""

    base = "memory://claims-model"
    interleavings = commits = 0

    @initialize()
    def start(self) -> None:
        type(self).interleavings += 1
        self.prefix = ObjectURL(f"{self.base}/m-{uuid.uuid4().hex[:10]}")
        self.runs: list[_Run] = []
        self.saves = 0

    def _alive(self) -> list[_Run]:
        return [r for r in self.runs if r.alive]

    def _pick(self, slot: int) -> _Run:
        alive = self._alive()
        return alive[slot % len(alive)]

    def _stop(self, run: _Run) -> None:
        if run.save is not None:
            run.save._remove_spool()
        run.alive, run.save, run.stage = False, None, ""

    # ------------------------------------------------------------------ runs
    @precondition(lambda self: len(self._alive()) < 2)
    @rule(how=st.sampled_from(["fresh", "newest", "older"]), pick=st.integers(0, 5))
    def start_run(self, how: str, pick: int) -> None:
        claims = RunClaims()
        if how == "newest":
            found = find_last_checkpoint_at(self.prefix)
            if found is not None:
                assert _whole(found), f"resume picked {found}, which is not whole"
                claims.resumed_from(found)
        elif how == "older":
            older = committed_checkpoints_at(self.prefix)[:-1]
            if older:
                claims.resumed_from(older[pick % len(older)])
        self.runs.append(_Run(claims))

    @precondition(lambda self: self._alive())
    @rule(slot=st.integers(0, 1), now=st.integers(0, 3))
    def kill(self, slot: int, now: int) -> None:
        if now == 0:  # a quarter of the draws: saves get to finish
            run = self._pick(slot)
            self._stop(run)

    # ------------------------------------------------------------------ a save, step by step
    @precondition(lambda self: self._alive())
    @rule(
        slot=st.integers(0, 1),
        steps=st.integers(1, 3),
        name=st.sampled_from(["a.pth", "b.pth"]),
        fault=st.integers(0, 5),
    )
    def advance(self, slot: int, steps: int, name: str, fault: int) -> None:
        """``steps`` steps of a live run's save: begin (a new save of ``name``), prepare
        (``fault`` 1: the response to its claim's write is lost), upload (``fault`` 0: killed
        with half of it uploaded), check the claim, write the manifest."""
        run = self._pick(slot)
        for _ in range(steps):
            if not run.alive:
                return
            if run.stage == "":
                self._begin(run, name)
            elif run.stage == "begun":
                self._prepare(run, lose=fault == 1)
            elif run.stage == "prepared":
                self._upload(run, dies=fault == 0)
            elif run.stage == "uploaded":
                self._check(run)
            else:
                self._write_manifest(run)

    def _begin(self, run: _Run, name: str) -> None:
        self.saves += 1
        data = f"{self.saves:016d}".encode()  # every save's objects: the same sizes
        final = self.prefix / name
        run.save = ObjectCommit(final, work_dir=self.prefix, is_dir=True, claims=run.claims)
        staging = run.save.begin()
        run.files = {"x.bin": data, "y.bin": data[::-1]}
        for rel, content in run.files.items():
            (staging / rel).write_bytes(content)
        run.stage = "begun"

    def _prepare(self, run: _Run, lose: bool) -> None:
        with _lost_response_to_the_claim(self.prefix, lose):
            try:
                run.save._prepare()
            except CheckpointError:  # refused (another owner; objects it did not write)
                return self._stop(run)
        run.stage = "prepared"

    def _upload(self, run: _Run, dies: bool) -> None:
        if not run.claims.owns(self.prefix):  # taken over before its upload (see the class)
            run.save._discard()
            return self._stop(run)
        if dies:  # killed mid-upload: one object of two is there
            object_commit.upload_files([(run.save.staging / "x.bin", run.save.final / "x.bin")])
            return self._stop(run)
        run.digests = run.save._upload()
        run.uploaded = {run.save.final / rel: data for rel, data in run.files.items()}
        run.stage = "uploaded"

    def _check(self, run: _Run) -> None:
        try:
            run.pinned = run.save._pinned(run.digests)
            run.save.claims.confirm(run.save.final)
        except CheckpointError:
            run.save._discard()
            return self._stop(run)
        run.stage = "checked"  # from here, the manifest PUT may come late

    def _write_manifest(self, run: _Run) -> None:
        try:
            run.save._write_manifest(run.pinned)
            run.save._after_commit()
            type(self).commits += 1
        except CheckpointError:
            pass
        run.save._remove_spool()
        run.save, run.stage, run.uploaded = None, "", {}

    # ------------------------------------------------------------------ invariants
    @invariant()
    def at_most_one_live_owner(self) -> None:
        owners = [r.claims.run for r in self._alive() if r.claims.owns(self.prefix)]
        assert len(owners) <= 1, owners

    @invariant()
    def what_is_committed_is_whole_and_resume_picks_it(self) -> None:
        for url, _ in Listing(self.prefix).newest():
            assert _whole(url), f"{url} counts as committed but is not whole"
        found = find_last_checkpoint_at(self.prefix)
        assert found is None or _whole(found), found

    @invariant()
    def the_owners_save_in_flight_is_untouched(self) -> None:
        for run in self._alive():
            if run.uploaded and run.claims.owns(self.prefix):
                for url, data in run.uploaded.items():
                    assert read_object(url) == data, f"{url} of the owner's save was changed"


class _lost_response_to_the_claim:
    """While active (``lose``), the first write of the owner object reaches the store and
    then fails as a dropped connection would: the client retries it."""

    def __init__(self, prefix: ObjectURL, lose: bool) -> None:
        self.fs, self.path = filesystem(prefix / OWNER)
        self.lose = lose

    def __enter__(self) -> None:
        if not self.lose:
            return
        real = self.fs.pipe_file

        def lossy(path, *args, **kwargs):
            real(path, *args, **kwargs)
            if path == self.path and self.fs.pipe_file is lossy:
                del self.fs.pipe_file
                raise ConnectionResetError("the response was lost")

        self.fs.pipe_file = lossy

    def __exit__(self, *exc) -> None:
        self.fs.__dict__.pop("pipe_file", None)


def run_model(base: str, examples: int, steps: int) -> tuple[int, int]:
    """Run :class:`ClaimsModel` on ``base`` (``memory://...`` or an S3 bucket): the number
    of interleavings it ran, and of checkpoints they committed."""
    model = type("Model", (ClaimsModel,), dict(base=base, interleavings=0, commits=0))
    model.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    model.TestCase().runTest()
    return model.interleavings, model.commits


@pytest.fixture
def short_backoff(monkeypatch):
    monkeypatch.setenv("SHARDWISE_STORAGE_BACKOFF", "0.001")  # a lost response's retry


def test_the_claim_protocol_holds_its_invariants_in_interleavings_in_memory(short_backoff):
    interleavings, commits = run_model("memory://claims-model", examples=30, steps=40)
    assert interleavings >= 30 and commits > 0


def test_the_claim_protocol_holds_its_invariants_against_the_s3_server(s3, short_backoff):  # noqa: F811
    interleavings, commits = run_model(s3.bucket(), examples=4, steps=30)
    assert interleavings >= 4
