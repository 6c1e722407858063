# ruff: noqa: F403, F405  (a config: names come from its base configs)
from mmengine.config import read_base

with read_base():
    from ..plain.leaf_delete import *
