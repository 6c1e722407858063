"""Storage credentials in a config (mmengine's ``backend_args``: ``key``, ``secret``...) reach
the store and nothing else: not the config dumped into ``work_dir``, a checkpoint's meta, the
trackers, the message hub, the log, or an error message."""

from __future__ import annotations

import http.client
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import tests.test_runner_support  # noqa: F401 - registers DropoutRegressor, RegressionData
from shardwise.config import REDACTED, Config, redact_secrets
from shardwise.runner import CheckpointHook, LoggerHook, Runner
from tests.s3_server import FaultProxy, shared_server

KEY, SECRET = "AKIAREDACTIONTEST7Q", "s3cr3t-Zq9-never-written"


def test_secret_named_values_are_replaced_and_the_rest_kept():
    cfg = dict(
        backend_args=dict(
            key=KEY,
            secret=SECRET,
            token="session",
            anon=False,
            client_kwargs=dict(endpoint_url="http://s3", aws_secret_access_key=SECRET),
        ),
        storage_options=dict(account_key="k", sas_token="t", password="p", key=None),
        pipeline=[dict(type="Crop", key="img")],  # a transform's key: not a credential
        model=dict(with_cls_token=True, tokens=(1, 2)),
    )
    got = redact_secrets(cfg)
    assert got == dict(
        backend_args=dict(
            key=REDACTED,
            secret=REDACTED,
            token=REDACTED,
            anon=False,
            client_kwargs=dict(endpoint_url="http://s3", aws_secret_access_key=REDACTED),
        ),
        storage_options=dict(account_key=REDACTED, sas_token=REDACTED, password=REDACTED, key=None),
        pipeline=[dict(type="Crop", key="img")],
        model=dict(with_cls_token=True, tokens=(1, 2)),
    )
    assert cfg["backend_args"]["secret"] == SECRET  # a copy: the run keeps its values
    assert redact_secrets(dict(key=KEY), storage=True) == dict(key=REDACTED)


def test_a_redacted_config_keeps_its_file_name_and_renders_without_the_secret(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(f"backend_args = dict(key={KEY!r}, secret={SECRET!r})\nlr = 0.1\n")
    cfg = Config.fromfile(path)
    redacted = redact_secrets(cfg)
    assert isinstance(redacted, Config) and redacted.filename == cfg.filename
    assert redacted.lr == 0.1 and redacted.backend_args.key == REDACTED
    for text in (redacted.pretty_text, redacted.text, redacted.dump()):
        assert KEY not in text and SECRET not in text
    assert cfg.backend_args.secret == SECRET


@pytest.mark.parametrize(
    "build",
    [
        lambda args: CheckpointHook(out_dir="s3://b/c", backend_args=args),
        lambda args: LoggerHook(out_dir="logs", backend_args=args),
        lambda args: LoggerHook(file_client_args=args),
    ],
    ids=["CheckpointHook", "LoggerHook", "LoggerHook-without-out_dir"],
)
def test_a_refused_backend_args_names_the_options_without_their_secrets(build):
    with pytest.raises(ValueError, match="petrel") as refused:
        build(dict(backend="petrel", key=KEY, secret=SECRET))
    said = str(refused.value)
    assert SECRET not in said and KEY not in said and f"'secret': '{REDACTED}'" in said


# ----------------------------------------------------------------------------- a run
def _strings(data: bytes) -> list[str]:
    """What ``data`` says: its bytes as text, and what a checkpoint or pickle in it holds."""
    out = [data.decode("latin-1")]
    for load in (
        lambda: torch.load(io.BytesIO(data), map_location="cpu", weights_only=False),
        lambda: pickle.loads(data),
    ):
        try:
            out.append(repr(load()))
        except Exception:  # noqa: BLE001, S112 - not that kind of file
            continue
    return out


def _authorizations(monkeypatch) -> list[str]:
    """The Authorization headers the fault proxy forwards (it speaks http.client upstream)."""
    seen: list[str] = []
    request = http.client.HTTPConnection.request

    def recording(self: Any, method: str, url: str, body: Any = None, headers: Any = None, **kw):
        seen.append(dict(headers or {}).get("Authorization", ""))
        return request(self, method, url, body=body, headers=headers or {}, **kw)

    monkeypatch.setattr(http.client.HTTPConnection, "request", recording)
    return seen


def test_a_run_reaches_storage_with_the_secrets_and_writes_them_nowhere(
    tmp_path, monkeypatch, capfd
):
    s3 = shared_server()
    bucket = s3.bucket()
    proxy = FaultProxy(s3).start()
    authorizations = _authorizations(monkeypatch)
    options = dict(endpoint_url=f"http://127.0.0.1:{proxy.port}", key=KEY, secret=SECRET)
    work_dir = tmp_path / "run"
    cfg = Config(
        dict(
            model=dict(type="DropoutRegressor"),
            work_dir=str(work_dir),
            train_dataloader=dict(dataset=dict(type="RegressionData", n=16), batch_size=8),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
            train_cfg=dict(by_epoch=False, max_iters=2),
            default_hooks=dict(
                logger=dict(interval=1, progress_bar=False),
                checkpoint=dict(interval=1, by_epoch=False, out_dir=bucket, backend_args=options),
            ),
            visualizer=dict(type="Visualizer", vis_backends=[dict(type="LocalVisBackend")]),
            randomness=dict(seed=0),
        )
    )
    try:
        runner = Runner.from_cfg(cfg)
        runner.train()
    finally:
        proxy.stop()

    # the store was reached through backend_args: its endpoint, signed with its key
    assert any(f"Credential={KEY}/" in header for header in authorizations), authorizations[:3]
    name = bucket.removeprefix("s3://")
    client = s3.client()
    objects = [o["Key"] for o in client.list_objects_v2(Bucket=name).get("Contents", [])]
    assert any(key.endswith("iter_2.pth") for key in objects), objects

    # ... and nothing written keeps it: the work dir, the store, the hub, the output
    written: dict[str, bytes] = {
        str(path): path.read_bytes() for path in Path(work_dir).rglob("*") if path.is_file()
    }
    assert any(path.endswith(".py") for path in written), sorted(written)  # the config dump
    assert any(path.endswith(".log") for path in written), sorted(written)
    for key in objects:
        written[f"{bucket}/{key}"] = client.get_object(Bucket=name, Key=key)["Body"].read()
    out, err = capfd.readouterr()
    written["stdout"], written["stderr"] = out.encode(), err.encode()
    written["message hub"] = repr(runner.message_hub.runtime_info).encode()
    assert REDACTED in runner.message_hub.get_info("cfg")
    for where, data in written.items():
        for text in _strings(data):
            assert SECRET not in text and KEY not in text, f"{where} holds a secret"
    meta = torch.load(io.BytesIO(written[f"{bucket}/{name_of(objects, 'iter_2.pth')}"]))["meta"]
    assert f"key='{REDACTED}'" in meta["cfg"] and f"secret='{REDACTED}'" in meta["cfg"]


def name_of(objects: list[str], suffix: str) -> str:
    return next(key for key in objects if key.endswith(suffix))
