"""Config files read as mmengine 0.10 reads them: ``.py``, ``.json`` and ``.yaml``; overrides.

Example::

    >>> cfg = Config(dict(model=dict(type='Linear', in_features=4)))
    >>> cfg.model.in_features
    4
    >>> cfg.merge_from_dict(parse_cfg_options(['model.in_features=8', 'lr=0.1']))
    >>> cfg.model.in_features, cfg.lr
    (8, 0.1)

The vocabulary and the results are mmengine's (``Config.fromfile(f).to_dict()`` equals
mmengine's for the OpenMMLab configs, type for type):

- ``_base_ = [...]`` names files (relative to the config, or ``'pkg::path'`` in an installed
  OpenMMLab package) whose dicts the config extends; dicts merge recursively and
  ``_delete_=True`` replaces instead; ``{{_base_.a.b}}`` stands for a base value anywhere in
  a literal, ``_base_.a.b`` reads one in code, ``_base_.a.b = ...`` changes one;
  ``{{ fileDirname }}`` and ``{{$ENV:default}}`` are substituted in the text;
  ``custom_imports`` modules are imported (see :mod:`shardwise.config.reading`).
- ``with read_base(): from .._base_.x import *`` inherits in a lazy config, whose other
  imports are :class:`LazyObject` references imported only when used (see
  :mod:`shardwise.config.lazy_reading`).
- ``--cfg-options`` values follow mmengine's ``DictAction`` syntax (:mod:`.overrides`).

Differences from mmengine, on purpose:

- an override (``merge_from_dict``) whose intermediate key does not exist is an error naming
  the close keys instead of silently creating it, and one that sets a list item to a plain
  value works (mmengine fails);
- a ``_delete_`` marker never stays in the result;
- in a lazy config the standard library counts as built in wherever Python is installed
  (mmengine's test misses it in a virtual environment), and a standard module it imports
  (``import math``) is left out of ``to_dict()`` like every other imported name;
- ``dump`` to ``.py`` writes only Python literals and refuses anything else (a class, a
  function) with a ``TypeError`` naming the key;
- bad input (a missing ``_base_`` file, an unknown ``{{_base_.x}}``, a base cycle) is an
  error naming the file, the line and the key.
"""

from .config import Config, add_args
from .config_dict import ConfigDict
from .lazy import LazyAttr, LazyObject, read_base
from .lazy_reading import ConfigParsingError
from .overrides import DictAction, parse_cfg_options, parse_override, parse_value
from .reading import ConfigFormatError
from .secrets import REDACTED, redact_secrets

__all__ = [
    "Config",
    "ConfigDict",
    "ConfigFormatError",
    "ConfigParsingError",
    "DictAction",
    "LazyAttr",
    "LazyObject",
    "REDACTED",
    "add_args",
    "parse_cfg_options",
    "parse_override",
    "parse_value",
    "read_base",
    "redact_secrets",
]
