"""Secrets out of every rendering of a config: the config dumped into ``work_dir``, a
checkpoint's ``meta['cfg']``, the trackers' copy and the message hub's.

Storage credentials travel in configs (mmengine's ``backend_args``: fsspec's ``key``,
``secret``, ``token``...); the run uses them, nothing it writes keeps them.

Example::

    >>> redact_secrets(dict(backend_args=dict(key='AKIA1', secret='s3cr3t', anon=False)))
    {'backend_args': {'key': '***', 'secret': '***', 'anon': False}}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .config import Config

__all__ = ["REDACTED", "redact_secrets"]

REDACTED = "***"

#: a key whose value is a secret wherever it is (a password, a secret key, a session token)
_SECRET = re.compile(
    r"secret|password|passwd|credential|private_key|api_key|access_key|account_key|"
    r"session_token|security_token|sas_token|connection_string",
    re.IGNORECASE,
)
#: names too common elsewhere (a transform's ``key='img'``, a model's ``cls_token``) to hide
#: outside storage options: fsspec's ``key``/``token`` (s3fs, gcsfs), botocore's ``aws_*``
_STORAGE_SECRET = {"key", "token"}
#: where storage options are written (mmengine's names, fsspec's and botocore's)
_STORAGE = {"backend_args", "file_client_args", "storage_options", "client_kwargs", "config_kwargs"}


def redact_secrets(obj: Any, *, storage: bool = False) -> Any:
    """A copy of ``obj`` (a :class:`Config`, mappings, lists, tuples) with the values of
    secret-named keys replaced by ``'***'`` (``key`` and ``token`` within storage options,
    ``storage``: ``obj`` is storage options). Anything else is returned as it is."""
    if isinstance(obj, Config):
        plain = redact_secrets(obj.to_dict())
        return Config(plain, cfg_text=Config(plain).pretty_text, filename=obj.filename)
    if isinstance(obj, Mapping):
        return {
            key: REDACTED
            if _is_secret(key, storage) and value is not None
            else redact_secrets(value, storage=storage or key in _STORAGE)
            for key, value in obj.items()
        }
    if isinstance(obj, list | tuple):
        return type(obj)(redact_secrets(value, storage=storage) for value in obj)
    return obj


def _is_secret(key: Any, storage: bool) -> bool:
    if not isinstance(key, str):
        return False
    return bool(_SECRET.search(key)) or (storage and key.lower() in _STORAGE_SECRET)
