# ruff: noqa: F403, F405  (a config: names come from its base configs)
from shardwise.config import read_base

with read_base():
    from .._base_.runtime import *

train_cfg.max_epochs = 7
